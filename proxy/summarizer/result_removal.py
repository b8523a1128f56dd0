"""The removal ladder: the summariser's history with more and more tool results left out, from the middle out,
for a summary request too long for the summariser's window."""

from __future__ import annotations

import math
from collections.abc import Iterator

from proxy.core.messages import Message, is_tool_result

REMOVAL_LADDER = (10, 20, 50, 100)  # percent of the tool results left out, rung by rung
# The call that produced a removed result stays in the transcript: its arguments (paths, commands) are short
# and tell what was attempted, and the marker keeps the model from reading the gap as an empty result.
REMOVED_TOOL_RESULT = "[tool result left out to fit the summariser's context window]"


def middle_out_order(count: int) -> list[int]:
    """Indices 0..count-1 from the centre outward: centre, one right, one left, two right, two left, ..."""
    centre = (count - 1) // 2
    order = [centre] if count else []
    for step in range(1, count):
        order.extend(index for index in (centre + step, centre - step) if 0 <= index < count)
    return order


def removal_ladder(history: list[Message]) -> Iterator[tuple[str, list[Message]]]:
    """The history as sent at each rung: whole, then with more and more tool results left out.

    A rung that would leave out no more results than the one before is skipped: it would resend the same request.
    """
    yield "direct", history
    positions = [index for index, message in enumerate(history) if is_tool_result(message)]
    order = middle_out_order(len(positions))
    removed = 0
    for percent in REMOVAL_LADDER:
        count = math.ceil(len(positions) * percent / 100)  # at least one on every non-zero rung
        if count <= removed:
            continue
        removed = count
        dropped = {positions[rank] for rank in order[:count]}
        yield (f"removed_tool_results_{percent}",
               [_without_result(message) if index in dropped else message for index, message in enumerate(history)])


def _without_result(message: Message) -> Message:
    return {**message, "content": REMOVED_TOOL_RESULT}
