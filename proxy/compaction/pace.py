"""Pace: how often each conversation's turns come, so a summary prepared ahead starts while there is still time to
make it before the request that needs it."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Recent measurements weigh this much against what came before: an agent's turns and a summariser's latency drift
# (longer tool runs, a busier model), and one slow turn should not decide alone.
WEIGHT = 0.3
# A summary is late when the turns left before the threshold take less than this many times its time. Every turn
# it starts earlier is growth it is planned for, kept verbatim, landing its request higher. In `bench.waits` (10 s
# summariser, 2 s turns, 150 rounds) the Messages agent waited on none of its 10 later summaries and made 11, where
# the mark alone made 8 and waited on 6 of 7; a start with no time to spare is late whenever a turn comes early.
MARGIN = 1.2
# A summariser quicker than this is never late: the most a client waits for it is less than a summary more costs (a
# fast client's 60 turns at a 4,096-token window, with 0.1-0.5 s summaries on a busy machine, made 12-13 summaries
# instead of 11 when any lateness counted).
MIN_LATE_SECONDS = 1.0
# Conversations remembered per pipeline, the least recently answered forgotten first: a key and a few numbers each.
CAPACITY = 4096


@dataclass
class _Turns:
    last: float                     # when its latest answer ended (the clock's seconds)
    interval: float | None = None   # its turns' spacing, smoothed
    prompt: int | None = None       # its conversation's tokens (before any clearing) at the latest look
    in_time: bool = False           # at a look since its conversation last shrank, a start was in time
    answered: int | None = None     # its latest answered request's prompt tokens
    growth: float | None = None     # what a turn adds to its prompt, smoothed over the turns that did not shrink it


class Pace:
    """Each conversation's turn spacing, as this process has seen its answers."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, capacity: int = CAPACITY) -> None:
        self._clock = clock
        self._capacity = capacity
        self._turns: OrderedDict[str, _Turns] = OrderedDict()

    def answered(self, key: str, prompt: int | None = None) -> None:
        """One more answer of conversation `key` ended now, to a request of `prompt` tokens."""
        now = self._clock()
        turns = self._turns.pop(key, None)
        if turns is None:
            turns = _Turns(now)
        else:
            turns.interval = smoothed(turns.interval, max(0.0, now - turns.last))
            turns.last = now
            # A prompt that shrank was made room in (a splice, a clearing): no turn's growth.
            if prompt is not None and turns.answered is not None and prompt > turns.answered:
                turns.growth = smoothed(turns.growth, float(prompt - turns.answered))
        if prompt is not None:
            turns.answered = prompt
        self._turns[key] = turns
        while len(self._turns) > self._capacity:
            self._turns.popitem(last=False)

    def late(self, key: str, prompt: int, lead: int, growth: int, summary_seconds: float | None,
             passes: Callable[[int], bool | None] | None = None) -> bool:
        """Whether conversation `key`'s next summary, taking about `summary_seconds`, must start now: its turns
        (`growth` tokens each) reach the threshold `lead` tokens away before a later start would be done, and at an
        earlier look since its conversation (`prompt` tokens, before any clearing) last shrank (a summary spliced in)
        a start was still in time. `passes`, when given, says instead whether the request so many turns on passes
        the threshold (what a clearing leaves is not a straight line of growth); None leaves it to the lead.

        A conversation that was never in time (a client with no pause between turns) waits whatever the start: it is
        left to the mark, where a summary costs least. False while the spacing or the summary's time is unknown, and
        for a summariser quicker than MIN_LATE_SECONDS."""
        judged = self._judged(key, summary_seconds)
        if judged is None:
            return False
        turns, interval, seconds = judged
        # The conversation shrinks only when a summary is spliced in: a new cycle. The lead alone would also grow
        # back when a large input is followed by a small one, or old results are cleared.
        if turns.prompt is not None and prompt < turns.prompt:
            turns.in_time = False
        turns.prompt = prompt
        needed = MARGIN * seconds / max(interval, 1e-3)  # turns a summary started now takes
        # The request that would splice it in is the one `needed` turns after the next.
        passing = passes(1 + math.ceil(needed)) if passes is not None else None
        if not (passing if passing is not None else max(0, lead) / max(1, growth) < needed):
            turns.in_time = True
            return False
        return turns.in_time

    def judges(self, key: str, summary_seconds: float | None) -> bool:
        """Whether `late` can be anything but False for conversation `key`: its spacing and the summary's time are
        known, and the summary is slow enough to matter."""
        return self._judged(key, summary_seconds) is not None

    def _judged(self, key: str, summary_seconds: float | None) -> tuple[_Turns, float, float] | None:
        """The conversation's turns, their spacing and the summary's time, when `late` can judge them (see judges)."""
        turns = self._turns.get(key)
        if turns is None or turns.interval is None or summary_seconds is None or summary_seconds < MIN_LATE_SECONDS:
            return None
        return turns, turns.interval, summary_seconds

    def growth(self, key: str) -> float | None:
        """What a turn of conversation `key` adds to its prompt, as measured (its answer resent, its next input, the
        upstream's framing of both); None before two requests that grew."""
        turns = self._turns.get(key)
        return turns.growth if turns is not None else None

    def interval(self, key: str) -> float | None:
        """Conversation `key`'s turn spacing, smoothed; None before its second answer."""
        turns = self._turns.get(key)
        return turns.interval if turns is not None else None


def smoothed(earlier: float | None, latest: float) -> float:
    """`latest` weighed against what came before (WEIGHT)."""
    return latest if earlier is None else (1 - WEIGHT) * earlier + WEIGHT * latest
