"""KnownRecords and lookup: the same bytes decoded once, bounded; the tail of a chain asked first, finding what the
whole chain would."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.store.known_records import KnownRecords, lookup
from proxy.store.store import CompactedPrefix, longest_verified

NS = "tenant-a"
OTHER_NS = "tenant-b"


def chain_of(n: int, salt: str = "") -> list[str]:
    return [f"{salt}h{i}" for i in range(n)]


def record_at(chain: Sequence[str], prefix_len: int, text: str = "summary") -> CompactedPrefix:
    return CompactedPrefix(chain[prefix_len - 1], prefix_len, ({"role": "user", "content": text},), 10, 2, "m", 1.0)


class Decoder:
    """CompactedPrefix.from_json, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, raw: bytes | str) -> CompactedPrefix | None:
        self.calls += 1
        try:
            return CompactedPrefix.from_json(raw)
        except ValueError:
            return None


def raw(record: CompactedPrefix) -> bytes:
    return record.to_json().encode()


# --- decoded ------------------------------------------------------------------------------------------------------

def test_the_same_bytes_give_the_same_record_decoded_once() -> None:
    known, decode = KnownRecords(), Decoder()
    record = record_at(chain_of(5), 3)
    first = known.decoded(NS, record.prefix_hash, raw(record), decode)
    second = known.decoded(NS, record.prefix_hash, bytes(raw(record)), decode)  # equal, not the same object
    assert first == record and second is first and decode.calls == 1


@pytest.mark.parametrize("change", ["other bytes", "other namespace", "other hash", "str instead of bytes"])
def test_anything_but_the_same_bytes_under_the_same_key_is_decoded_again(change: str) -> None:
    known, decode = KnownRecords(), Decoder()
    chain = chain_of(5)
    record = record_at(chain, 3)
    first = known.decoded(NS, record.prefix_hash, raw(record), decode)
    namespace, prefix_hash, value = NS, record.prefix_hash, raw(record)
    if change == "other bytes":
        value = raw(record_at(chain, 3, "a newer summary of the same prefix"))
    elif change == "other namespace":
        namespace = OTHER_NS
    elif change == "other hash":
        prefix_hash = chain[1]
    else:
        value = record.to_json()  # type: ignore[assignment]
    again = known.decoded(namespace, prefix_hash, value, decode)
    assert decode.calls == 2 and again is not first


def test_a_replaced_record_is_the_one_kept() -> None:
    known, decode = KnownRecords(), Decoder()
    chain = chain_of(5)
    old, new = record_at(chain, 3, "old"), record_at(chain, 3, "new")
    known.decoded(NS, old.prefix_hash, raw(old), decode)
    kept = known.decoded(NS, new.prefix_hash, raw(new), decode)
    assert known.decoded(NS, new.prefix_hash, raw(new), decode) is kept
    assert kept.replacement[0]["content"] == "new" and decode.calls == 2
    assert len(known) == 1 and known.held_bytes == len(raw(new))


@pytest.mark.parametrize("value", [b"not json", b"{}", b'{"prefix_hash": 3}', "\udc80".encode(errors="surrogatepass")])
def test_what_does_not_decode_is_none_and_never_kept(value: bytes) -> None:
    known, decode = KnownRecords(), Decoder()
    assert known.decoded(NS, "h1", value, decode) is None
    assert known.decoded(NS, "h1", value, decode) is None
    assert decode.calls == 2 and len(known) == 0 and known.held_bytes == 0


def test_a_record_under_another_hash_than_its_own_is_returned_not_kept() -> None:
    """A broken store's value under the wrong key: the caller's chain check decides; nothing is remembered of it."""
    known, decode = KnownRecords(), Decoder()
    chain = chain_of(5)
    record = record_at(chain, 3)
    assert known.decoded(NS, chain[0], raw(record), decode) == record
    assert len(known) == 0 and known.furthest(NS, chain) == 0


def test_bounded_by_entries_least_recently_used_first() -> None:
    known, decode = KnownRecords(size=2), Decoder()
    chain = chain_of(10)
    records = [record_at(chain, n) for n in (2, 4, 6)]
    for record in records[:2]:
        known.decoded(NS, record.prefix_hash, raw(record), decode)
    known.decoded(NS, records[0].prefix_hash, raw(records[0]), decode)  # used again: records[1] is now the oldest
    known.decoded(NS, records[2].prefix_hash, raw(records[2]), decode)
    assert len(known) == 2 and decode.calls == 3
    assert known.held_bytes == len(raw(records[0])) + len(raw(records[2]))
    known.decoded(NS, records[1].prefix_hash, raw(records[1]), decode)
    assert decode.calls == 4  # it had been dropped


def test_bounded_by_bytes_and_a_record_over_a_quarter_of_them_not_kept() -> None:
    chain = chain_of(10)
    small = [record_at(chain, n, "x" * 100) for n in range(2, 8)]  # each JSON of the same length
    size = len(raw(small[0]))
    known, decode = KnownRecords(max_bytes=4 * size + 10), Decoder()
    for record in small:
        known.decoded(NS, record.prefix_hash, raw(record), decode)
    assert len(known) == 4 and known.held_bytes == 4 * size
    assert known.furthest(NS, chain) == 7 and known.decoded(NS, small[1].prefix_hash, raw(small[1]), decode)
    assert decode.calls == 7  # the oldest two had been dropped
    huge = record_at(chain, 8, "y" * 10_000)
    big_known = KnownRecords(max_bytes=4 * len(raw(huge)) - 1)
    assert big_known.decoded(NS, huge.prefix_hash, raw(huge), decode) == huge
    assert len(big_known) == 0 and big_known.held_bytes == 0


@pytest.mark.parametrize("size, max_bytes", [(0, 10), (10, 0), (-1, 10)])
def test_a_bound_below_one_is_refused(size: int, max_bytes: int) -> None:
    with pytest.raises(ValueError):
        KnownRecords(size=size, max_bytes=max_bytes)


def test_threads_at_once_keep_the_counts_straight() -> None:
    known = KnownRecords(size=8)
    chain = chain_of(40)
    records = [record_at(chain, n) for n in range(11, 41)]  # every one's JSON of the same length
    failures: list[str] = []

    def work(offset: int) -> None:
        decode = Decoder()
        for i in range(400):
            record = records[(i + offset) % len(records)]
            if known.decoded(NS, record.prefix_hash, raw(record), decode) != record:
                failures.append(record.prefix_hash)

    threads = [threading.Thread(target=work, args=(k * 7,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures and len(known) == 8
    assert known.held_bytes == 8 * len(raw(records[0]))


# --- furthest -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kept, chain, namespace, expected", [
    ((), chain_of(10), NS, 0),
    ((3,), chain_of(10), NS, 3),
    ((3, 7), chain_of(10), NS, 7),
    ((3, 7), chain_of(5), NS, 3),             # the chain ends before 7
    ((3, 7), chain_of(10, "edited"), NS, 0),  # another conversation's chain
    ((3, 7), chain_of(10), OTHER_NS, 0),
])
def test_furthest_is_the_longest_known_record_that_lines_up(kept: tuple[int, ...], chain: list[str], namespace: str,
                                                             expected: int) -> None:
    known, decode, base = KnownRecords(), Decoder(), chain_of(10)
    for prefix_len in kept:
        record = record_at(base, prefix_len)
        known.decoded(NS, record.prefix_hash, raw(record), decode)
    assert known.furthest(namespace, chain) == expected


# --- lookup -------------------------------------------------------------------------------------------------------

class FakeStore:
    """A store's read by hashes, remembering what it was asked."""

    def __init__(self, records: dict[str, CompactedPrefix], *, failing: bool = False) -> None:
        self.records = records
        self.failing = failing
        self.asked: list[list[str]] = []

    async def fetch(self, hashes: Sequence[str]) -> list[CompactedPrefix] | None:
        self.asked.append(list(hashes))
        if self.failing:
            return None
        return [self.records[prefix_hash] for prefix_hash in hashes if prefix_hash in self.records]


def knowing(*records: CompactedPrefix) -> KnownRecords:
    known = KnownRecords()
    for record in records:
        known.decoded(NS, record.prefix_hash, raw(record), Decoder())
    return known


async def test_nothing_known_asks_the_whole_chain_once() -> None:
    chain = chain_of(50)
    store = FakeStore({chain[29]: record_at(chain, 30)})
    assert await lookup(KnownRecords(), NS, chain, store.fetch) == record_at(chain, 30)
    assert store.asked == [chain]


async def test_a_known_record_asks_from_its_link_on_only() -> None:
    chain = chain_of(50)
    record = record_at(chain, 40)
    store = FakeStore({record.prefix_hash: record, chain[9]: record_at(chain, 10)})
    assert await lookup(knowing(record), NS, chain, store.fetch) == record
    assert store.asked == [chain[39:]]


async def test_a_longer_record_stored_since_is_found() -> None:
    chain = chain_of(50)
    known_one, longer = record_at(chain, 30), record_at(chain, 45)
    store = FakeStore({known_one.prefix_hash: known_one, longer.prefix_hash: longer})
    assert await lookup(knowing(known_one), NS, chain, store.fetch) == longer
    assert store.asked == [chain[29:]]


async def test_a_known_record_gone_falls_back_to_the_links_before_it() -> None:
    chain = chain_of(50)
    gone, shorter = record_at(chain, 40), record_at(chain, 10)
    store = FakeStore({shorter.prefix_hash: shorter})
    assert await lookup(knowing(gone), NS, chain, store.fetch) == shorter
    assert store.asked == [chain[39:], chain[:39]]


async def test_nothing_anywhere_is_none_after_both_parts() -> None:
    chain = chain_of(20)
    store = FakeStore({})
    assert await lookup(knowing(record_at(chain, 5)), NS, chain, store.fetch) is None
    assert store.asked == [chain[4:], chain[:4]]


async def test_a_failing_store_is_asked_once() -> None:
    chain = chain_of(20)
    store = FakeStore({}, failing=True)
    assert await lookup(knowing(record_at(chain, 5)), NS, chain, store.fetch) is None
    assert store.asked == [chain[4:]]


async def test_a_known_record_at_the_first_link_asks_the_whole_chain() -> None:
    chain = chain_of(20)
    store = FakeStore({})
    assert await lookup(knowing(record_at(chain, 1)), NS, chain, store.fetch) is None
    assert store.asked == [chain]


async def test_a_stored_value_that_does_not_line_up_is_not_returned() -> None:
    """What the store holds under a hash of this chain but claims another prefix length is checked, not trusted."""
    chain = chain_of(20)
    liar = CompactedPrefix(chain[9], 15, ({"role": "user", "content": "x"},), 1, 1, "m", 1.0)
    store = FakeStore({chain[9]: liar})
    assert await lookup(KnownRecords(), NS, chain, store.fetch) is None


@settings(max_examples=200, deadline=None)
@given(length=st.integers(1, 40), stored=st.sets(st.integers(1, 40), max_size=6),
       known_at=st.sets(st.integers(1, 40), max_size=4), edited_from=st.integers(1, 41))
def test_lookup_finds_what_asking_the_whole_chain_finds(length: int, stored: set[int], known_at: set[int],
                                                        edited_from: int) -> None:
    """Whatever this process knew (records since gone, or of a conversation that went another way after some
    message), the answer is the longest stored record that lines up with the chain."""
    base = chain_of(40)
    chain = base[:min(length, edited_from - 1)] + chain_of(40, "edited")[min(length, edited_from - 1):length]
    records = {base[n - 1]: record_at(base, n) for n in stored}
    store = FakeStore(records)
    known = knowing(*(record_at(base, n) for n in known_at))
    found = asyncio.run(lookup(known, NS, chain, store.fetch))
    assert found == longest_verified(records.values(), chain)
    assert sum(len(hashes) for hashes in store.asked) <= len(chain)  # never a link asked twice
