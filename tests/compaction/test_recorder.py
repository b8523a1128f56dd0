"""proxy.compaction.recorder: entries made from what compaction did, written on tasks, never failing a request."""

from __future__ import annotations

import asyncio

import pytest

from proxy.compaction.recorder import Origin, Recorder, conversation_of, point_of, span_of, summary_id
from proxy.core.budget import Limits
from proxy.store.journal import Event, JournalBounds, MemoryJournal, Point

ORIGIN = Origin("ab" * 12, "cd" * 12, "chat", "m", "req-1")
LIMITS = Limits(window=8000, threshold=0.8, target=0.5, reserve=500)


class Broken(MemoryJournal):
    async def record(self, event: Event) -> None:
        raise ConnectionError("the store is gone")

    async def point(self, point: Point) -> None:
        raise ConnectionError("the store is gone")


class Stuck(MemoryJournal):
    def __init__(self) -> None:
        super().__init__(JournalBounds())
        self.release = asyncio.Event()

    async def point(self, point: Point) -> None:
        await self.release.wait()
        await super().point(point)


def point(**counts: int) -> Point:
    headers = {"x-compaction": "none", **{f"x-compaction-{k.replace('_', '-')}": str(v) for k, v in counts.items()}}
    return point_of(ORIGIN, headers, limits=LIMITS, tokens_before=100, tokens_after=90)


async def test_a_broken_journal_is_counted_never_raised() -> None:
    errors: list[str] = []
    recorder = Recorder(Broken(JournalBounds()), on_error=errors.append)
    recorder.point(point())
    await recorder.drain()
    assert errors == ["journal_point"]


async def test_a_failure_making_an_entry_is_counted_never_raised() -> None:
    errors: list[str] = []
    recorder = Recorder(MemoryJournal(JournalBounds()), on_error=errors.append)
    recorder.safely("journal_request", lambda: Event.model_validate({"id": "not hex"}))
    assert errors == ["journal_request"]


async def test_without_a_journal_nothing_is_made() -> None:
    made: list[int] = []
    recorder = Recorder(None)
    recorder.safely("journal_request", lambda: made.append(1))
    recorder.point(point())
    assert made == [] and not recorder.enabled


async def test_writes_waiting_on_a_slow_store_are_bounded() -> None:
    errors: list[str] = []
    journal = Stuck()
    recorder = Recorder(journal, on_error=errors.append)
    for _ in range(300):
        recorder.point(point())
    await asyncio.sleep(0)
    # 256 wait (the writers have not run yet); the rest are dropped and counted, not queued without end.
    assert len(errors) == 300 - 256
    journal.release.set()
    await recorder.drain()
    [listed] = await journal.conversations(None, 10)
    assert listed.requests == 256


@pytest.mark.parametrize(("before", "now", "kinds"), [
    ({}, {"cleared": 3}, ["clearing"]),
    ({"cleared": 3}, {"cleared": 3}, []),
    ({"cleared": 3}, {"cleared": 5}, ["clearing"]),
    ({"cleared": 5}, {"cleared": 2}, []),
    ({}, {"cleared": 2, "pair_summaries": 1}, ["clearing", "pair_summaries"]),
    ({"cleared": 2, "pair_summaries": 1}, {"cleared": 2, "pair_summaries": 2}, ["pair_summaries"]),
])
async def test_a_stage_event_is_made_only_when_the_stage_went_further(before: dict[str, int], now: dict[str, int],
                                                                      kinds: list[str]) -> None:
    journal = MemoryJournal(JournalBounds())
    recorder = Recorder(journal)
    recorder.stage_events(ORIGIN, point(**before), freed=0)
    await recorder.drain()
    earlier = len(journal)
    made = recorder.stage_events(ORIGIN, point(**now), freed=400)
    await recorder.drain()
    detail = await journal.conversation(None, ORIGIN.conversation)
    events = (detail.events if detail is not None else [])[earlier:]
    assert [event.kind for event in events] == kinds
    assert (made is not None) is bool(kinds) and (not kinds or made == events[-1].id)


def test_names_are_stable_and_distinct() -> None:
    assert summary_id("ns", "h1") == summary_id("ns", "h1") != summary_id("ns", "h2")
    assert summary_id("ns", "h1") != summary_id("ns2", "h1")
    assert conversation_of("o1", "k") != conversation_of("o2", "k")


def test_a_span_counts_roles_never_holds_content() -> None:
    span = span_of([{"role": "user", "content": "secret words"}, {"role": "assistant", "content": "x"},
                    {"role": "tool", "content": "y"}, {"role": "user", "content": "z"}])
    assert (span.count, span.roles) == (4, {"user": 2, "assistant": 1, "tool": 1})
    assert "secret" not in span.model_dump_json()
