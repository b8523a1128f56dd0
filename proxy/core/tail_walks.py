"""Where the last check of a stored summary's tail stopped, so a conversation's next request walks only what it added.

A stored summary is spliced in only when the messages after its cut split no tool pair (core.plan), which takes a
walk of every one of them: on a reuse hit with a long tail, a tenth of the proxy's own time on the request. Each
turn of a conversation resends those messages and a few more. The walk's state (the call ids seen, the results no
call before them answered) depends on the messages walked alone, so it goes on from where the last one stopped
when the chain says the messages up to there are the same ones: chain[i] fingerprints messages[: i + 1].
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.plan import makes_any_call, splits_a_tool_pair, walk_results

MAX_WALKS = 1024  # summaries whose last walk is kept, least recently used let go


@dataclass(frozen=True, slots=True)
class _Walk:
    cut: int
    end: int  # the messages walked: [cut, end), all but the last of their request
    link: str  # chain[end - 1]: what the messages up to `end` were
    called: frozenset[str]
    orphans: frozenset[str]


class TailWalks:
    """The last walk of each stored summary's tail, by a key naming the summary (its namespace and prefix hash).
    Used from the event loop only."""

    def __init__(self, size: int = MAX_WALKS) -> None:
        self._size = size
        self._walks: OrderedDict[Hashable, _Walk] = OrderedDict()

    def __len__(self) -> int:
        return len(self._walks)

    def splits(self, key: Hashable, messages: Sequence[Any], chain: Sequence[str], cut: int) -> bool:
        """plan.splits_a_tool_pair(messages, cut), walking on from where the last walk under `key` stopped when
        `chain` (one link per message) says the messages it walked are the same ones. What is kept stops before
        the last message: a client that asks again over the same history changes only that one."""
        if len(chain) != len(messages) or not 0 <= cut < len(messages):
            return splits_a_tool_pair(messages, cut)
        end = len(messages) - 1
        last = self._walks.get(key)
        if last is not None and last.cut == cut and cut < last.end <= end and chain[last.end - 1] == last.link:
            start, called, orphans = last.end, set(last.called), set(last.orphans)
        else:
            start, called, orphans = cut, set(), set()
        walk_results(messages[start:end], called, orphans)
        if end > cut:
            self._keep(key, _Walk(cut, end, chain[end - 1], frozenset(called), frozenset(orphans)))
        walk_results(messages[end:], called, orphans)
        return makes_any_call(itertools.islice(messages, cut), orphans)  # no copy of the messages before the cut

    def _keep(self, key: Hashable, walk: _Walk) -> None:
        self._walks[key] = walk
        self._walks.move_to_end(key)
        while len(self._walks) > self._size:
            self._walks.popitem(last=False)
