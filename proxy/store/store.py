"""Summary records for stateless clients: stores keyed by tenant namespace and prefix hash, plus single-flight."""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger("proxy.store")

Clock = Callable[[], float]
# Bytes counted for one memory entry beyond its record's JSON: the key tuple, the entry tuple, the dict slot.
_ENTRY_OVERHEAD_BYTES = 200
_FEW_HITS = 16  # stored prefixes of one chain ordered by a scan each; more, by one walk of the chain


@dataclass(frozen=True)
class CompactedPrefix:
    """A summary that stands in for the first `prefix_len` messages of any history whose chain matches."""

    prefix_hash: str
    prefix_len: int
    replacement: tuple[dict[str, Any], ...]
    tokens_before: int
    tokens_after: int
    model: str
    created_at: float

    def __post_init__(self) -> None:
        if not self.prefix_hash or self.prefix_len < 1:
            raise ValueError("a summary record needs a prefix hash and a prefix length of at least 1")

    def matches(self, chain: Sequence[str]) -> bool:
        """True when the chain's entry for this record's prefix length is this record's hash."""
        return self.prefix_len <= len(chain) and chain[self.prefix_len - 1] == self.prefix_hash

    def to_json(self) -> str:
        """The record as JSON text that encodes to UTF-8: a client's message may hold a lone surrogate (JSON lets it
        send `\\ud800`), which only an ASCII escape carries, losslessly, through a UTF-8 store."""
        fields = {
            "prefix_hash": self.prefix_hash,
            "prefix_len": self.prefix_len,
            "replacement": list(self.replacement),
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "model": self.model,
            "created_at": self.created_at,
        }
        text = json.dumps(fields, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(fields)
        return text

    @classmethod
    def from_json(cls, text: str | bytes) -> CompactedPrefix:
        """Parse a stored record; ValueError when anything is missing or of the wrong type."""
        data = json.loads(text)
        try:
            fields = (
                _typed(data, "prefix_hash", str),
                _typed(data, "prefix_len", int),
                _typed(data, "replacement", list),
                _typed(data, "tokens_before", int),
                _typed(data, "tokens_after", int),
                _typed(data, "model", str),
                float(_typed(data, "created_at", (int, float))),
            )
        except (TypeError, KeyError) as exc:
            raise ValueError(f"not a summary record: {exc}") from exc
        prefix_hash, prefix_len, replacement, before, after, model, created_at = fields
        if not all(isinstance(message, dict) for message in replacement):
            raise ValueError("not a summary record: replacement holds a non-object")
        return cls(prefix_hash, prefix_len, tuple(replacement), before, after, model, created_at)


def _typed(data: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{key} has the wrong type")
    return value


def longest_verified(candidates: Iterable[CompactedPrefix], chain: Sequence[str]) -> CompactedPrefix | None:
    """The longest of `candidates` that lines up with `chain` (what a store read may hold is checked, not trusted)."""
    verified = [record for record in candidates if record.matches(chain)]
    return max(verified, key=lambda record: record.prefix_len, default=None)


@runtime_checkable
class SummaryStore(Protocol):
    """Where summary records live; namespaces are tenant hashes, never raw keys."""

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None: ...

    async def put(self, namespace: str, record: CompactedPrefix) -> None: ...

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        """The record for the longest prefix of `chain` (chain[i] fingerprints messages[: i + 1])."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class MemoryStore:
    """A bounded LRU of records with a TTL, local to one process: at most max_entries, and max_bytes in all."""

    def __init__(self, max_entries: int, ttl_seconds: float, clock: Clock = time.monotonic,
                 max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_entries < 1 or ttl_seconds <= 0 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be at least 1 and ttl_seconds positive")
        self._max_entries = max_entries
        self.max_bytes = max_bytes
        self._ttl = ttl_seconds
        self._clock = clock
        # key -> (record, expires_at, size in bytes)
        self._entries: OrderedDict[tuple[str, str], tuple[CompactedPrefix, float, int]] = OrderedDict()
        self._hashes: dict[str, set[str]] = {}  # the prefix hashes held, by namespace: what longest_match meets
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def size_of(namespace: str, record: CompactedPrefix) -> int:
        """What one entry is charged: its record's UTF-8 JSON plus its key and a fixed overhead."""
        text = record.to_json() + namespace + record.prefix_hash
        return len(text.encode("utf-8", "surrogatepass")) + _ENTRY_OVERHEAD_BYTES

    def _remove(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_bytes -= entry[2]
            held = self._hashes[key[0]]
            held.discard(key[1])
            if not held:
                del self._hashes[key[0]]

    def _lookup(self, key: tuple[str, str]) -> CompactedPrefix | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        record, expires_at, _ = entry
        if self._clock() >= expires_at:
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return record

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        return self._lookup((namespace, prefix_hash))

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        key = (namespace, record.prefix_hash)
        size = self.size_of(namespace, record)
        self._remove(key)
        if size > self.max_bytes:
            # Keeping it would evict everything else and still not fit; the summary is only not reusable.
            log.warning("not keeping a summary of %d bytes: store.max_bytes is %d", size, self.max_bytes)
            return
        self._entries[key] = (record, self._clock() + self._ttl, size)
        self._hashes.setdefault(namespace, set()).add(record.prefix_hash)
        self.total_bytes += size
        while len(self._entries) > self._max_entries or self.total_bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        # The chain met with the namespace's hashes in one pass at C speed: a chain of 400 links costs that pass
        # whether the store holds thousands of records or none, not 400 lookups nor an index built per request.
        held = self._hashes.get(namespace)
        hits = held.intersection(chain) if held else set()
        # Longest first: a few hits are each found in the chain (a scan at C speed), many by one walk of it; one
        # (a conversation that reuses its summary turn after turn) is not looked for: its record says where it is.
        if len(hits) < 2:
            longest_first = list(hits)
        elif len(hits) <= _FEW_HITS:
            longest_first = sorted(hits, key=chain.index, reverse=True)
        else:
            longest_first = [prefix_hash for prefix_hash in reversed(chain) if prefix_hash in hits]
        for prefix_hash in longest_first:
            record = self._lookup((namespace, prefix_hash))
            if record is not None and record.matches(chain):
                return record
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._entries.clear()
        self._hashes.clear()
