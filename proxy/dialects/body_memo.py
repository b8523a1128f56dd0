"""Bodies read lately, so a history resent with a few messages more is read from where it grew, not again whole.

A stateless client resends its whole history on every turn: half a megabyte to add one message. Reading it costs
three passes at C speed (the long-integer scan, the parse, the depth check), each over every byte, on every turn.
Here a large body is remembered with where each of its history's messages lies in it, when the body is exactly
orjson's compact encoding of its value (what serde_json, JSON.stringify and httpx send). The next body that
starts with the same bytes is read in two pieces: the messages it shares, found by comparing bytes (memcmp), are
the values already read; only the rest of the body (its head, the new messages, its tail) is parsed, through the
same guards as a whole body.

Why that is exact: the shared bytes run through the end of a message, and JSON is read left to right, so those
messages read the same in both bodies. The new body is then checked to be orjson's encoding too (head, each new
message and tail compared byte for byte), which also rules out duplicate keys (a second `messages` would not
encode back). Anything that does not check out is read whole, as before.

A dialect whose view is read from the history's items (Responses, Messages) keeps its reader's state with the
history here too (dialects.kept_reads), and the history that grows from it reads its view on from that state.

The values are shared between requests, so nothing may change them in place: the proxy builds every edit anew
(a compaction, a splice, a cleared tool result). That is checked by the test suite, which asks `intact()` of every
proxy it ran, not before each reuse: comparing them with their bytes again is a second encoding of the whole
history, and cost as much as the rest of the request's reading (0.15 ms of 1.5 on a 475 KB history).
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.view import View, ViewKeys
from proxy.dialects.call import json_object
from proxy.dialects.kept_reads import KeptRead
from proxy.errors import BadRequest

MIN_BYTES = 64 * 1024  # below this a body is read whole: the parse costs less than remembering it
KEY_BYTES = 1024  # bytes from the history's start that pick the remembered bodies to compare with
# Bodies remembered per key: conversations that open alike (one agent's system prompt) share a key. Comparing
# with one that parts early costs little: a comparison stops where the bytes differ.
PER_KEY = 16
BUDGET_BYTES = 96 * 1024 * 1024  # what the remembered bodies may hold, counted as COST_PER_BYTE x their size
COST_PER_BYTE = 3  # a body's bytes plus the values read from them, roughly
# A reader's state kept with a body (dialects.kept_reads: a view's groups and neutral messages), per byte of the
# body, roughly: 0.5 (240 KB for a 473 KB Responses history, 320 KB for a 480 KB Messages one).
READ_COST_DIVISOR = 2
_BLOCK = 64 * 1024  # bytes compared at a time when looking for where two bodies part
# Where the history's opening is looked for: a body spelt otherwise holds none, and is not searched whole for it
# on each of its requests (a history opening later keys its bucket by the body's start instead).
_HEAD_BYTES = 64 * 1024
# Stands in for the history in the body's skeleton, to find where the history goes in it: random per process, so a
# client cannot put it elsewhere in a body (were it there first, the body would not check out and be read whole).
_SENTINEL = f"compaction-proxy history {os.urandom(16).hex()}"
_SENTINEL_JSON = orjson.dumps(_SENTINEL)


@dataclass(frozen=True, slots=True, eq=False)  # compared by identity: a body can be large
class _Remembered:
    body: bytes
    starts: list[int]  # where each message of the history starts in the body
    ends: list[int]  # and where it ends (exclusive)
    messages: list[Any]  # the history's values, as read
    keys: list[int]  # each message's key in the history index: the hash of its bytes


@dataclass(slots=True, eq=False)
class _Kept:
    """A reader's state kept with a history (keep_read): the list, the state, how many of the list's messages,
    from the first, it has read, and the keys of the last view read on from it (View.keyed)."""

    messages: list[Any]
    read: KeptRead
    count: int
    keys: ViewKeys | None


class BodyMemo:
    """Reads request bodies, remembering large ones with where their history's messages lie in them.

    One for every route (each read names the field that holds its history) and shared by the runtimes a reload
    makes. Safe to use from the event loop and from the threads a very large body is read in."""

    def __init__(self, *, budget_bytes: int = BUDGET_BYTES, min_bytes: int = MIN_BYTES,
                 key_bytes: int = KEY_BYTES) -> None:
        self._key_bytes = key_bytes
        self._budget = budget_bytes
        self._min = min_bytes
        self._buckets: OrderedDict[int, list[_Remembered]] = OrderedDict()
        self._by_history: dict[int, _Remembered] = {}  # by the id of its messages list, which it keeps alive
        # What a dialect's reader made of a remembered history (keep_read), by the id of that history's list.
        self._reads: dict[int, _Kept] = {}
        # The last large body read and what it read as, for a second read of that very body: a glance at it, then
        # its parse. Taken by that read, so no read after it gets it.
        self._last: tuple[bytes, str, dict[str, Any]] | None = None
        self._held = 0
        self._lock = threading.Lock()
        self.reused = 0  # bodies read from a remembered one (for tests and the curious)
        self.resumed = 0  # reads of a view that went on from a kept one (kept_read)

    def read(self, body: bytes, key: str) -> dict[str, Any]:
        """The body's JSON object, exactly as `json_object(body)` reads it (BadRequest for what it refuses); its
        history is the list at `key` ("messages", "input")."""
        if not self.remembers(body):
            return json_object(body)
        with self._lock:
            last, self._last = self._last, None
        if last is not None and last[0] is body and last[1] == key:
            return last[2]
        payload = self._read(body, key)
        self._last = (body, key, payload)
        return payload

    def remembers(self, body: bytes) -> bool:
        """Whether a body is large enough to be remembered: a smaller one is read whole, at no gain."""
        return len(body) >= self._min

    def _read(self, body: bytes, key: str) -> dict[str, Any]:
        bucket = self._bucket_of(body, key)
        recalled = self._recalled(body, key, bucket)
        if recalled is not None:
            return recalled
        payload = json_object(body)
        spans = _spans(body, payload, key, 0, 0)
        if spans is not None and spans[0]:
            starts, ends, encoded = spans
            self._remember(bucket, _Remembered(body, starts, ends, payload[key], list(map(hash, encoded))), None)
        return payload

    def keys_of(self, messages: object) -> list[int] | None:
        """The history index's keys of a history this memo read and still holds, one per message: the hash of the
        message's bytes in its body (bytes that read as one value; proxy.core.history_index); None for any other."""
        with self._lock:
            held = self._by_history.get(id(messages))
        return held.keys if held is not None and held.messages is messages else None

    def kept_read(self, messages: object, *, resuming: bool = True) -> tuple[KeptRead, int] | None:
        """A reader's state kept with this history (keep_read), or with the history it grew from, and how many of
        its messages, from the first, that state has read (the very values this history holds); None for none.
        `resuming`: a read goes on from it (counted in `resumed`), not only a look at what it read."""
        kept = self._kept(messages)
        if kept is None:
            return None
        with self._lock:
            self.resumed += resuming
        return kept.read, kept.count

    def keep_read(self, messages: object, read: KeptRead, count: int) -> None:
        """Keep `read` (a reader's state after the first `count` messages of `messages`, a history this memo read)
        while this memo holds that history; the history that grows from it next finds it (kept_read). A history
        the memo does not hold keeps nothing."""
        with self._lock:
            held = self._by_history.get(id(messages))
            if held is None or held.messages is not messages or not 0 <= count <= len(held.messages):
                return
            earlier = self._reads.get(id(messages))
            if earlier is None:
                self._held += len(held.body) // READ_COST_DIVISOR
            # The view's keys go on with it: the read on from a kept one shares its groups.
            self._reads[id(messages)] = _Kept(held.messages, read, count, earlier.keys if earlier else None)
            self._within_budget()

    def keys_of_view(self, view: View, salt: str) -> list[int] | None:
        """The history index's keys of a view's messages: a chat history's own (keys_of), or those made from the
        keys of the client's items it was read from (View.message_keys, `salt` the dialect), when this memo read
        that list; None otherwise (the index keys each message by its canonical JSON)."""
        if not view.groups:
            return self.keys_of(view.messages)
        source = view.source
        item_keys = self.keys_of(source)
        if item_keys is None:
            return None
        kept = self._kept(source)
        if kept is None:
            return view.message_keys(item_keys, salt)
        keyed = view.keyed(item_keys, salt, kept.keys)
        kept.keys = keyed  # the next view of the conversation keys only the groups it adds
        return keyed.keys if keyed is not None else None

    def view_keys(self, view: View) -> ViewKeys | None:
        """The keys keys_of_view made of this very view (its counts of items and messages per group), if kept."""
        kept = self._kept(view.source)
        keyed = kept.keys if kept is not None else None
        return keyed if keyed is not None and keyed.groups is view.groups else None

    def _kept(self, messages: object) -> _Kept | None:
        """What is kept with this very history (keep_read), if anything."""
        with self._lock:
            kept = self._reads.get(id(messages))
        return kept if kept is not None and kept.messages is messages else None

    def spliced(self, body: bytes, messages: list[Any], front: bytes, kept_from: int) -> bytes | None:
        """orjson's encoding of the body's object with its history `messages` (a list this memo read from that very
        body) replaced by the messages `front` encodes (orjson's, comma-separated, no brackets: a stored summary's
        replacement) and then `messages[kept_from:]`, those copied from the body's bytes. On a reuse hit that is what
        is forwarded, and encoding it whole cost as much again as the rest of the splice. None when the memo does not
        hold the body's spans, or no message is kept."""
        held = self._held_for(body, messages)
        if held is None or not front or not 0 < kept_from < len(messages):
            return None
        view = memoryview(body)  # each piece copied once, into the result
        return b"".join((view[:held.starts[0]], front, b",", view[held.starts[kept_from]:]))

    def holds(self, body: bytes, messages: object) -> bool:
        """Whether this memo read `messages` from this very body and holds where they lie in it, as `spliced` needs:
        asked before what a splice puts in front is made."""
        return self._held_for(body, messages) is not None

    def _held_for(self, body: bytes, messages: object) -> _Remembered | None:
        with self._lock:
            held = self._by_history.get(id(messages))
        return held if held is not None and held.messages is messages and held.body is body else None

    def _bucket_of(self, body: bytes, key: str) -> int:
        """Which remembered bodies to compare with: those whose history opens with the same bytes."""
        start = max(body.find(orjson.dumps(key) + b":[", 0, _HEAD_BYTES), 0)
        return hash((key, body[start:start + self._key_bytes]))

    def _recalled(self, body: bytes, key: str, bucket: int) -> dict[str, Any] | None:
        with self._lock:
            candidates = list(self._buckets.get(bucket, ()))
        best, shared = None, 0
        for candidate in candidates:
            count = bisect.bisect_right(candidate.ends, common_prefix(body, candidate.body))
            if count > shared:
                best, shared = candidate, count
        if best is None:
            return None
        payload = self._read_rest(body, key, bucket, best, shared)
        if payload is not None:
            self.reused += 1
        return payload

    def _read_rest(self, body: bytes, key: str, bucket: int, earlier: _Remembered,
                   shared: int) -> dict[str, Any] | None:
        """The body read from `earlier`'s first `shared` messages and a parse of the rest; None: read it whole."""
        first, last = earlier.starts[0], earlier.ends[shared - 1]
        after = body[last:last + 2]
        if after[:1] == b"]":
            rest = body[:first] + body[last:]
        elif after == b",{":  # a message follows (an element of any other kind is not a message: read whole)
            rest = body[:first] + body[last + 1:]
        else:
            return None
        reused = earlier.messages[:shared]
        try:
            payload = json_object(rest)
        except BadRequest:
            return None  # read whole, which says what is wrong with the body itself
        spans = _spans(body, payload, key, first, last)
        if spans is None:
            return None
        messages = payload[key] = reused + payload[key]
        starts, ends, encoded = spans
        self._remember(bucket, _Remembered(body, earlier.starts[:shared] + starts, earlier.ends[:shared] + ends,
                                           messages, earlier.keys[:shared] + list(map(hash, encoded))), earlier,
                       shared)
        return payload

    def _remember(self, bucket: int, entry: _Remembered | None, replaced: _Remembered | None,
                  shared: int = 0) -> None:
        """`entry` first in its bucket (None: nothing new), `replaced` (the body it grew from, sharing its first
        `shared` messages) out of it; a reader's state kept with `replaced` goes on with `entry` when it read no
        further than those."""
        with self._lock:
            kept = self._buckets.setdefault(bucket, [])
            self._buckets.move_to_end(bucket)
            read = self._reads.get(id(replaced.messages)) if replaced is not None else None
            if replaced is not None and replaced in kept:
                self._let_go(kept, replaced)
            if entry is not None and COST_PER_BYTE * len(entry.body) <= self._budget:
                kept.insert(0, entry)
                self._held += COST_PER_BYTE * len(entry.body)
                self._by_history[id(entry.messages)] = entry
                if read is not None and replaced is not None and read.messages is replaced.messages and \
                        read.count <= shared:
                    self._reads[id(entry.messages)] = _Kept(entry.messages, read.read, read.count, read.keys)
                    self._held += len(entry.body) // READ_COST_DIVISOR
            while len(kept) > PER_KEY:
                self._let_go(kept, kept[-1])
            if not kept:
                del self._buckets[bucket]
            self._within_budget()

    def _within_budget(self) -> None:
        """Called with the lock held: the least recently used buckets go while more than the budget is held."""
        while self._held > self._budget and self._buckets:
            _, dropped = self._buckets.popitem(last=False)
            while dropped:
                self._let_go(dropped, dropped[-1])

    def _let_go(self, kept: list[_Remembered], entry: _Remembered) -> None:
        """Called with the lock held: `entry` out of the bucket `kept` and out of every account."""
        kept.remove(entry)
        self._held -= COST_PER_BYTE * len(entry.body)
        if self._by_history.get(id(entry.messages)) is entry:
            del self._by_history[id(entry.messages)]
        read = self._reads.get(id(entry.messages))
        if read is not None and read.messages is entry.messages:
            del self._reads[id(entry.messages)]
            self._held -= len(entry.body) // READ_COST_DIVISOR

    def intact(self) -> bool:
        """Whether every remembered history still encodes to the bytes it was read from, and every kept read still
        makes what reading afresh makes: False when something changed a shared value in place (which nothing in the
        proxy may do; the test suite asks after each run)."""
        with self._lock:
            held = [entry for kept in self._buckets.values() for entry in kept]
            reads = [kept.read for kept in self._reads.values()]
        return all(_encodes_to(entry.messages, entry.body, entry.starts[0], entry.ends[-1]) for entry in held) \
            and all(read.intact() for read in reads)

    @property
    def held_bytes(self) -> int:
        """The remembered bodies' cost against the budget."""
        return self._held


def _spans(body: bytes, payload: dict[str, Any], key: str, first: int,
           last: int) -> tuple[list[int], list[int], list[bytes]] | None:
    """Where the history's messages in `payload` lie in `body` (starts, ends, their bytes), when the body is
    orjson's encoding of it with the messages already shared (bytes `first` to `last`; none when `last` is 0) in
    front of them."""
    messages = payload.get(key)
    if not isinstance(messages, list):
        return None
    try:
        skeleton = orjson.dumps({**payload, key: _SENTINEL})
    except (TypeError, orjson.JSONEncodeError):
        return None
    at = skeleton.find(_SENTINEL_JSON)
    head, tail = skeleton[:at], skeleton[at + len(_SENTINEL_JSON):]
    opening = len(head) + 1
    # The body's ends first: a client that spells JSON otherwise (spaces after separators) is told by them, before
    # every message is encoded on each of its requests for nothing.
    if not body.startswith(head + b"[") or not body.endswith(b"]" + tail) or (last and first != opening):
        return None
    try:
        encoded = list(map(orjson.dumps, messages))
    except (TypeError, orjson.JSONEncodeError):
        return None
    position = last or opening
    separator = b"," if last and encoded else b""
    joined = separator + b",".join(encoded)
    if body[position:position + len(joined)] != joined or body[position + len(joined):] != b"]" + tail:
        return None
    if not encoded:
        return [], [], []
    starts = list(itertools.accumulate((len(piece) + 1 for piece in encoded[:-1]),
                                       initial=position + len(separator)))
    ends = [start + len(piece) for start, piece in zip(starts, encoded, strict=True)]
    return starts, ends, encoded


def _encodes_to(messages: list[Any], body: bytes, first: int, last: int) -> bool:
    """Whether `messages` still encode to the body's bytes `first` to `last` (the first message's start, the last
    one's end)."""
    encoded = orjson.dumps(messages)
    return len(encoded) == last - first + 2 and body.startswith(memoryview(encoded)[1:-1], first)


def common_prefix(left: bytes, right: bytes) -> int:
    """How many bytes two byte strings share from their start: compared a block at a time, then halved; each
    comparison a memcmp of `left` against a view of `right`, nothing copied."""
    limit = min(len(left), len(right))
    view = memoryview(right)
    low = 0
    while low + _BLOCK <= limit and left.startswith(view[low:low + _BLOCK], low):
        low += _BLOCK
    high = min(low + _BLOCK, limit)  # the two part in [low, high], or one runs out at high
    while low < high:
        middle = (low + high + 1) // 2
        if left.startswith(view[low:middle], low):
            low = middle
        else:
            high = middle - 1
    return low
