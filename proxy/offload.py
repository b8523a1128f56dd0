"""Off the event loop, but only when the work is really there: a thread hand-off costs more than small work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Characters of text (or bytes of JSON) below which counting, hashing or parsing costs less than a thread hand-off.
LARGE = 256 * 1024


async def off_loop_if_large(size: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `work` in a thread when `size` says it is large, else right here."""
    if size <= LARGE:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)
