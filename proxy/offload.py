"""Off the event loop, but only when the work is really there: a thread hand-off costs more than small work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Characters of text below which counting or hashing costs less than a thread hand-off (tiktoken and blake2b
# release the GIL, so above it the loop really runs alongside).
LARGE = 256 * 1024
# Characters of a request's new messages past which their long texts are counted a slice at a time, the loop let go
# between slices (proxy.core.history_index). tiktoken reads about 20 of them a µs (16K characters of code: 0.85 ms;
# 64K: 3.5 ms; 256K: 17 ms), and every other request would wait that long behind it. An agent's new tool result (a
# file read, a test run) is often past this, once a turn.
LARGE_COUNT = 16 * 1024
# Bytes of JSON below which parsing stays on the loop. A parser holds the GIL, so a thread lets the loop in only
# at the interpreter's switch interval (5 ms): worth it only for a body that takes longer than that to read.
LARGE_JSON = 4 * 1024 * 1024
# Characters of a summariser's reply above which parsing, judging and rendering it (pure Python, GIL held) runs in a
# thread: a real summary is a few thousand; a hostile one up to the reply's byte bound (proxy.model_client).
LARGE_REPLY = 64 * 1024


async def off_loop_above(limit: int, size: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `work` in a thread when `size` passes `limit`, else right here."""
    if size <= limit:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


async def off_loop_if_large(size: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `work` in a thread when `size` (characters of text to count or hash) passes LARGE, else right here."""
    return await off_loop_above(LARGE, size, work, *args, **kwargs)
