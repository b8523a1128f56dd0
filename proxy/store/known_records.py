"""Records a shared store handed this process lately: the same bytes decoded once, and where each sits in a chain."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from proxy.store.store import CompactedPrefix, longest_verified

Raw = bytes | str
Decode = Callable[[Raw], CompactedPrefix | None]
# Records remembered at once, and the bytes they came from: a summary record is a few to a few hundred KB, so a
# process holds 16 MiB at most here whatever the store's own limit on one record.
DEFAULT_SIZE = 64
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class _Known:
    raw: Raw
    record: CompactedPrefix


class KnownRecords:
    """What a shared store (Redis, SQLite) last gave for each namespace and prefix hash, as bytes and as a record.

    Such a store hands each record over as bytes, decoded anew on every lookup. In an agent loop every request after
    a summary asked for the same record: decoding it again cost more than the memory store's whole lookup, and, a
    new object each time, what StoredReplacements keeps of its replacement was counted and encoded again. Here the
    same bytes under the same key give the same record object.

    Where the longest known record sits in a request's chain also tells the store where to look first (`lookup`).

    Bounded by entries and by the bytes they came from; a record whose bytes are over a quarter of that is decoded
    and returned but not kept. Thread-safe, though each store uses it from its event loop only."""

    def __init__(self, size: int = DEFAULT_SIZE, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if size < 1 or max_bytes < 1:
            raise ValueError("size and max_bytes must be at least 1")
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()
        self._spaces: dict[str, dict[str, _Known]] = {}
        self._lock = threading.Lock()

    def decoded(self, namespace: str, prefix_hash: str, raw: Raw, decode: Decode) -> CompactedPrefix | None:
        """The record `raw` (the store's value under `prefix_hash`) decodes to: the one kept when the bytes are the
        same, else `decode(raw)`, kept when it decodes to a record of that hash. None when it does not decode."""
        key = (namespace, prefix_hash)
        with self._lock:
            known = self._known.get(key)
            if known is not None and known.raw == raw:
                self._known.move_to_end(key)
                return known.record
        record = decode(raw)
        if record is not None and record.prefix_hash == prefix_hash:
            self._keep(key, _Known(raw, record))
        return record

    def furthest(self, namespace: str, chain: Sequence[str]) -> int:
        """The prefix length of the longest known record of `namespace` that lines up with `chain`; 0 for none."""
        with self._lock:
            space = self._spaces.get(namespace)
            if not space:
                return 0
            return max((known.record.prefix_len for known in space.values() if known.record.matches(chain)),
                       default=0)

    def _keep(self, key: tuple[str, str], known: _Known) -> None:
        size = len(known.raw)
        if size > self._max_bytes // 4:
            return
        with self._lock:
            self._drop(key)
            self._known[key] = known
            self._spaces.setdefault(key[0], {})[key[1]] = known
            self._bytes += size
            while len(self._known) > self._size or self._bytes > self._max_bytes:
                self._drop(next(iter(self._known)))

    def _drop(self, key: tuple[str, str]) -> None:
        known = self._known.pop(key, None)
        if known is None:
            return
        self._bytes -= len(known.raw)
        space = self._spaces[key[0]]
        del space[key[1]]
        if not space:
            del self._spaces[key[0]]

    def __len__(self) -> int:
        return len(self._known)

    @property
    def held_bytes(self) -> int:
        return self._bytes


Fetch = Callable[[Sequence[str]], Awaitable[list[CompactedPrefix] | None]]


async def lookup(known: KnownRecords, namespace: str, chain: Sequence[str], fetch: Fetch) -> CompactedPrefix | None:
    """The longest record lining up with `chain`, asking `fetch` (a store's read of the records under some of the
    chain's hashes; None when the store failed) for as few hashes as it can.

    A known record at link k is longer than any record before it, so the links from k on are asked first; only
    when none of them holds one any more (expired, evicted, replaced) are the links before k asked. That finds
    what asking the whole chain finds: an agent loop's lookup asks for the links since its summary, not all
    of them."""
    start = known.furthest(namespace, chain)
    parts = [chain[start - 1:], chain[:start - 1]] if start > 1 else [chain]
    for hashes in parts:
        records = await fetch(hashes)
        if records is None:
            return None
        best = longest_verified(records, chain)
        if best is not None:
            return best
    return None
