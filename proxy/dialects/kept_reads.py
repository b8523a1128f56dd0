"""A dialect reader's state kept with the history it read (in the body memo), so the next request of the
conversation is read from where that read stopped."""

from __future__ import annotations

import itertools
from typing import Any, Protocol, Self, TypeVar


class KeptRead(Protocol):
    """A reader's state after the first messages of a history, kept with it."""

    def intact(self) -> bool:
        """Whether what it made of the messages is still what reading them afresh makes: what it made is shared
        with the conversation's next requests, so nothing may change it in place (the test suite asks)."""
        ...


class Reads(Protocol):
    """Where reads are kept (dialects.body_memo.BodyMemo): with a history the memo read, and carried to the
    history that grows from it when that one holds every message the read had read."""

    def kept_read(self, messages: object, *, resuming: bool = True) -> tuple[KeptRead, int] | None: ...

    def keep_read(self, messages: object, read: KeptRead, count: int) -> None: ...


class ItemReader(KeptRead, Protocol):
    """A left fold over a history's items into a view's groups; a copy reads on independently."""

    def read(self, item: Any) -> bool:
        """Takes one item; False when it is not understood (the request is then not compactable)."""
        ...

    def copy(self) -> Self: ...


R = TypeVar("R", bound=ItemReader)


def read_before(items: object, reads: Reads | None, kind: type[R]) -> tuple[R, int] | None:
    """The kept reader of `kind` that read the first items of this very list (read_on's) and how many it read: a
    request's parse need not look again for what that reader would have refused; None for none."""
    kept = reads.kept_read(items, resuming=False) if reads is not None else None
    if kept is None or type(kept[0]) is not kind:
        return None
    reader: R = kept[0]
    return reader, kept[1]


def read_on(items: list[Any], reads: Reads | None, kind: type[R]) -> R | None:
    """A reader of `kind` that has read every item (None when one is not understood), going on from the state kept
    with the history these grew from when there is one of its kind.

    An agent resends its whole history each turn: 400 items to add a few. Reading them into the neutral view cost
    a Responses request 0.8 ms and a Messages request 1.4 ms. The state is kept from before the last item: the next
    request may hold more after it (a turn added), or another last item (a client that resends the history with a
    new last message), and both go on from there."""
    kept = reads.kept_read(items) if reads is not None else None
    held, start = (kept[0], kept[1]) if kept is not None and type(kept[0]) is kind else (None, 0)
    reader = held.copy() if held is not None else kind()
    last = max(len(items) - 1, 0)
    if not all(map(reader.read, itertools.islice(items, start, last))):
        return None
    if reads is not None and start <= last:
        # Nothing read on (the last item changed): the kept state is this one's already, and is never changed.
        reads.keep_read(items, held if held is not None and start == last else reader.copy(), last)
    return reader if all(map(reader.read, itertools.islice(items, max(start, last), None))) else None
