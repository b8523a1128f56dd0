"""What the proxy remembers of each message it has seen, so a history resent whole costs one pass at C speed.

A stateless client resends its whole history on every turn: 400 messages and 100k tokens to add one. Digesting
and tokenising all of it again each time made the proxy's cost grow with the conversation. Here every message is
keyed by its canonical JSON (the bytes its fingerprint digests anyway, written by orjson), and the key finds its
digest, its token count and the hash-chain link through it. A repeated prefix then costs a serialisation and
a dict lookup per message; only new messages are digested and counted.

The key is Python's hash of those bytes: SipHash under a per-process random key, so a client cannot aim a
collision, and an accidental one (about 2**-64 per pair) gives a message another's digest, which makes the chain
miss every stored summary rather than match a wrong one, because each link also depends on the whole prefix.
A reader that already holds bytes encoding each message exactly (dialects.body_memo: the message as it lies in
its body) may pass their hashes as the keys instead: equal bytes read as equal values, so such a key finds the
same entry as any other spelling's would compute, and nothing is serialised or hashed again.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from proxy.core.fingerprint import canonical_json, chain_link, chain_root, digest_of
from proxy.core.tokens import TokenCounter
from proxy.offload import LARGE, LARGE_COUNT

DEFAULT_ENTRIES = 100_000  # messages remembered; about 0.55 KB each (the counter's entry too), whatever their size
# Conversations whose last read is kept, so the next is read from where it grew (about 16 KB each at 400 messages).
MAX_LINEAGES = 64
_SORTED_DUMPS = functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)
_TOKENS, _BEFORE, _AFTER, _AFTER_HEX = (operator.itemgetter(field) for field in (1, 2, 3, 4))


@dataclass(frozen=True, slots=True)
class History:
    """One request's messages as the index read them. Its lists are also the index's memory of the read (the
    next read of the conversation starts from them): read them, never change them."""

    chain: list[str]  # equal to proxy.fingerprint.hash_chain(messages, namespace)
    tokens: list[int]  # equal to TokenCounter.count_message of each message
    new: int  # distinct messages that were not in the index


@dataclass(frozen=True, slots=True)
class _LastRead:
    """A conversation's last read: its keys, what they read as, the chain's state after the last message, and the
    index's count of entry operations when its entries were last all marked used (see HistoryIndex._grown_from)."""

    keys: list[int]
    history: History
    state: bytes
    touched: int


# One message: (digest, tokens, state before, state after, state after as hex) -- the last link of the chain
# through it; one is enough, as a message shared by many prefixes (a system prompt under many tenants) pays one
# hash per request. A plain tuple of bytes, ints and strings: the garbage collector stops tracking it, so a full
# index adds nothing to a collection's pause (entries with fields of their own made it tens of milliseconds).
_Entry = tuple[bytes, int, bytes, bytes, str]


class HistoryIndex:
    """Digests, token counts and chain links of the messages seen lately, least recently used dropped first.

    Used from the event loop only: the work on new messages may run in a thread, their entries are added here.
    """

    def __init__(self, counter: TokenCounter, max_entries: int = DEFAULT_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self._counter = counter
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._max_entries = max_entries
        self._roots: dict[str, bytes] = {}
        # By (namespace, first key, second key): conversations that open alike share a slot, and take turns.
        self._lineages: OrderedDict[tuple[str, int, int], _LastRead] = OrderedDict()
        # Entries added or marked used so far, counted from above: an entry is dropped only once max_entries
        # others were added or used after it.
        self._operations = 0

    def __len__(self) -> int:
        return len(self._entries)

    def read(self, messages: Sequence[Any], namespace: str, keys: Sequence[int] | None = None) -> History:
        """The history's chain and token counts, computing only what the index does not hold. `keys`, one per
        message, are the hashes of bytes that encode each exactly (see above); None: computed here."""
        last, shared, touched = self._grown_from(namespace, keys)
        keys, found, missing = self._look_up(messages[shared:], keys[shared:] if keys is not None else None)
        return self._finished(namespace, last, shared, touched, keys, found,
                              self._entries_for(messages[shared:], missing))

    async def read_off_loop(self, messages: Sequence[Any], namespace: str,
                            keys: Sequence[int] | None = None) -> History:
        """As read(), the loop let go while the new messages are counted when there is much to count: a slice of
        text at a time (a turn's large tool result), or in a thread when there is more than LARGE."""
        last, shared, touched = self._grown_from(namespace, keys)
        rest = messages[shared:]
        keys, found, missing = self._look_up(rest, keys[shared:] if keys is not None else None)
        size = sum(len(canonical) for _, canonical in missing.values())
        if size > LARGE:
            fresh = await asyncio.to_thread(self._entries_for, rest, missing)
        else:
            if size > LARGE_COUNT:
                # On the loop, not in a thread: tiktoken counts about a third slower on any thread but the first
                # that used it, and the loop is let go after every slice.
                for _ in self._counter.counting_in_slices(rest[index] for index, _ in missing.values()):
                    await asyncio.sleep(0)
            fresh = self._entries_for(rest, missing)
        return self._finished(namespace, last, shared, touched, keys, found, fresh)

    def _grown_from(self, namespace: str, keys: Sequence[int] | None) -> tuple[_LastRead | None, int, int]:
        """The conversation's last read, how many keys these open with alike (a history resent with more, or with
        its last messages changed), and when their entries were last all marked used; (None, 0, 0) without one.

        The shared messages' chain links and counts are what they were: both depend on those messages alone (and
        the namespace). Their entries are marked used again, or the index would drop the entries of its busiest
        conversations first; but only once half the index has been added or used since they last were: before
        that none of them can have been dropped, and a pass over every shared entry on every request was a tenth
        of the history read. One that was dropped sends the read the whole way."""
        if keys is None or len(keys) < 2:
            return None, 0, 0
        last = self._lineages.get((namespace, keys[0], keys[1]))
        if last is None:
            return None, 0, 0
        shared = _common_prefix(last.keys, keys if isinstance(keys, list) else list(keys))
        if shared < 2:
            return None, 0, 0
        if self._operations - last.touched < self._max_entries // 2:
            return last, shared, last.touched
        touched = self._operations
        try:
            deque(map(self._entries.move_to_end, last.keys[:shared]), maxlen=0)
        except KeyError:
            return None, 0, 0
        self._operations += shared
        return last, shared, touched

    def _finished(self, namespace: str, last: _LastRead | None, shared: int, touched: int, keys: list[int],
                  found: list[_Entry | None], fresh: dict[int, _Entry]) -> History:
        """The read finished (from the first `shared` messages of `last`, if any, last all marked used when the
        count of operations was `touched`), and remembered as its conversation's last."""
        if last is None:
            touched = self._operations  # every entry is marked used by _finish, from here on
            history, state = self._finish(namespace, keys, found, fresh)
        else:
            chain = last.history.chain[:shared]
            start = last.state if shared == len(last.keys) else bytes.fromhex(chain[-1])
            history, state = self._finish(namespace, keys, found, fresh, start)
            keys = last.keys[:shared] + keys
            history = History(chain + history.chain, last.history.tokens[:shared] + history.tokens, history.new)
        if len(keys) >= 2:
            lineage = (namespace, keys[0], keys[1])
            self._lineages[lineage] = _LastRead(keys, history, state, touched)
            self._lineages.move_to_end(lineage)
            if len(self._lineages) > MAX_LINEAGES:
                self._lineages.popitem(last=False)
        return history

    def _look_up(self, messages: Sequence[Any], given: Sequence[int] | None) \
            -> tuple[list[int], list[_Entry | None], dict[int, tuple[int, bytes]]]:
        """Each message's key and entry (None when new), and the new ones: key -> (first position, canonical)."""
        canonical: list[bytes] | None = None
        if given is not None and len(given) == len(messages):
            keys = list(given)
        else:
            canonical = _canonical(messages)
            keys = list(map(hash, canonical))
        found = list(map(self._entries.get, keys))
        missing: dict[int, tuple[int, bytes]] = {}
        if None not in found:  # a history resent whole: nothing new, told at C speed
            return keys, found, missing
        for index, entry in enumerate(found):
            if entry is None and keys[index] not in missing:
                missing[keys[index]] = (index, canonical[index] if canonical is not None
                                        else canonical_json(messages[index]))
        return keys, found, missing

    def _entries_for(self, messages: Sequence[Any], missing: dict[int, tuple[int, bytes]]) -> dict[int, _Entry]:
        # Thread-safe: reads nothing of the index; the counter guards its own cache.
        return {key: (digest_of(canonical), self._counter.count_message(messages[index]),
                      b"", b"", "")
                for key, (index, canonical) in missing.items()}

    def _finish(self, namespace: str, keys: list[int], found: list[_Entry | None], fresh: dict[int, _Entry],
                start: bytes | None = None) -> tuple[History, bytes]:
        """The chain through these messages from `start` (the namespace's root when None), and its state after
        them."""
        entries = self._entries
        for key, entry in fresh.items():
            entries.setdefault(key, entry)  # another read may have added it while this one was in a thread
        # Nothing fresh: every message was found (the two go together, see _look_up).
        known = cast(list[_Entry], found) if not fresh else \
            [entry if entry is not None else entries[key] for key, entry in zip(keys, found, strict=True)]
        root = self._root(namespace) if start is None else start
        # The links already stored, as far as they run unbroken from the root: on a history resent whole, all of
        # them. Read at C speed; the loop below is for what is new or was linked through another history.
        linked = _linked(known, root)
        chain = list(map(_AFTER_HEX, known[:linked]))
        try:  # each used again, the last most recently
            deque(map(entries.move_to_end, keys[:linked]), maxlen=0)
        except KeyError:  # dropped by a read that finished while this one was in a thread
            for key, entry in zip(keys[:linked], known, strict=False):
                entries.setdefault(key, entry)
                entries.move_to_end(key)
        state = known[linked - 1][3] if linked else root
        append, used = chain.append, entries.move_to_end
        for key, entry in zip(keys[linked:], known[linked:], strict=True):  # what is new or linked otherwise
            digest, tokens, before, after, after_hex = entry
            if before != state:
                after = chain_link(state, digest)
                after_hex = after.hex()
                entry = entries[key] = (digest, tokens, state, after, after_hex)
            try:
                used(key)
            except KeyError:  # dropped by a read that finished while this one was in a thread
                entries[key] = entry
            append(after_hex)
            state = after
        self._operations += len(fresh) + 2 * len(keys)  # at most: each key added back and marked used
        while len(entries) > self._max_entries:
            entries.popitem(last=False)
        return History(chain, list(map(_TOKENS, known)), len(fresh)), state

    def _root(self, namespace: str) -> bytes:
        root = self._roots.get(namespace)
        if root is None:
            if len(self._roots) >= self._max_entries:
                self._roots.clear()
            root = self._roots[namespace] = chain_root(namespace)
        return root


def _linked(known: list[_Entry], root: bytes) -> int:
    """How many entries from the first hold the links this history's chain goes through: each one's state before
    is the state after the one in front of it (the first's: the namespace's root). A new entry links nothing (its
    states are empty), so the run stops at it."""
    if not known or known[0][2] != root:
        return 0
    befores, afters = list(map(_BEFORE, known)), list(map(_AFTER, known))
    del befores[0], afters[-1]  # entry i + 1's state before against entry i's after
    return _common_prefix(befores, afters) + 1


def _common_prefix(first: list[Any], second: list[Any]) -> int:
    """How many items the two lists open with alike, compared at C speed (and whole, not copied, when they are
    as long as each other).

    Two lists that part usually part near their end (a history resent with another message, or its last one
    changed), so openings are compared from there back, in doubling steps, then by halves: each a comparison of
    slices, which passes an item that is the very object at once (the keys a history shares with its last read
    are). Comparing item by item (map(operator.eq)) was a twentieth of a 400-message history's read."""
    length = min(len(first), len(second))
    if first == second if len(first) == len(second) else _open_alike(first, second, length):
        return length
    low, high = 0, length - 1  # they open alike for at least `low` items and at most `high`
    probe, step = high, 1
    while probe > low and not _open_alike(first, second, probe):
        high = probe - 1
        step *= 2
        probe = max(high + 1 - step, low)
    low = probe
    while low < high:
        middle = (low + high + 1) // 2
        if _open_alike(first, second, middle):
            low = middle
        else:
            high = middle - 1
    return low


def _open_alike(first: list[Any], second: list[Any], count: int) -> bool:
    return first[:count] == second[:count]


def _canonical(messages: Sequence[Any]) -> list[bytes]:
    """Each message's canonical JSON, mapped at C speed: a Python step per message was a tenth of this pass on a
    400-message history."""
    try:
        return list(map(_SORTED_DUMPS, messages))  # canonical_json's fast path
    except (TypeError, orjson.JSONEncodeError):
        return list(map(canonical_json, messages))
