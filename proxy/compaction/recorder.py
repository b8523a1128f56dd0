"""Journal entries made from what compaction did, written off the request's path and never failing it."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from proxy.core.budget import Limits
from proxy.core.messages import Message, role
from proxy.core.plan import Plan
from proxy.core.tenants import journal_owner
from proxy.headers import CLEARED, COMPACTION, COMPACTION_ID, PAIR_SUMMARIES, SHADOW, SHADOW_TOKENS_AFTER
from proxy.request_context import current_request_id
from proxy.store.journal import Event, Journal, Point, Span, SummarizerRun, event_id
from proxy.store.store import CompactedPrefix
from proxy.summarizer.summarizer import Summary

log = logging.getLogger("proxy.journal")
# Where a failed summary's error carries the id of its journal event (see tell_failure).
_FAILURE_ATTRIBUTE = "compaction_failure_event"

# Entries waiting for the store at once: past this one is dropped (and counted) rather than queued without bound
# behind a slow store.
_MAX_PENDING = 256
# Writer tasks draining the queue: a shared store's round trips overlap this much.
_WRITERS = 4
# Conversations whose last stage counts are remembered, to tell a stage event from a request that only kept it.
_STAGE_MEMORY = 10000
_ROLES = 12
_NAME = 200  # the journal's bound on a name (proxy.store.journal)


@dataclass(frozen=True)
class Origin:
    """Where a compaction event comes from: whose conversation, in which API, for which request."""

    owner: str
    conversation: str
    dialect: str
    model: str
    request_id: str | None


def origin_of(headers: Mapping[str, str], tenant_header: str | None, backoff_key: str, dialect: str,
              model: str) -> Origin:
    """A request's origin: its owner (credentials and tenant), its conversation, its API and model."""
    owner = journal_owner(headers, tenant_header)
    return Origin(owner, conversation_of(owner, backoff_key), dialect[:_NAME], model[:_NAME],
                  (current_request_id() or "")[:_NAME] or None)


@lru_cache(maxsize=4096)
def conversation_of(owner: str, backoff_key: str) -> str:
    """A conversation's journal id: its owner and its first message after the instructions (the backoff key)."""
    return event_id("conversation", owner, backoff_key)


@lru_cache(maxsize=4096)
def summary_id(namespace: str, prefix_hash: str) -> str:
    """The id of the event that made a stored summary: the same on every replica and every reuse of it (asked
    again on every request that reuses it: remembered, as conversation_of is)."""
    return event_id("summary", namespace, prefix_hash)


def span_of(messages: Sequence[Message], start: int = 0) -> Span:
    roles = Counter(role(message) or "other" for message in messages)
    return Span(start=start, count=len(messages), roles=dict(roles.most_common(_ROLES)))


def summary_event(origin: Origin, *, namespace: str, trigger: str, limits: Limits, plan: Plan,
                  record: CompactedPrefix, source: Sequence[Message], summary: Summary, ratio: float,
                  seconds: float) -> Event:
    """A summary made: the whole request's tokens before and after, and the span's, in the upstream's tokens."""
    replacement = math.ceil(record.tokens_after * ratio)
    before = plan.tokens_before + plan.overhead
    return Event(id=summary_id(namespace, record.prefix_hash), kind="summary", outcome="applied",
                 at=record.created_at, owner=origin.owner, conversation=origin.conversation, dialect=origin.dialect,
                 model=origin.model, trigger=trigger, request_id=origin.request_id, window=limits.window,
                 threshold_tokens=limits.trigger_tokens, tokens_before=before,
                 tokens_after=max(0, before - record.tokens_before + replacement),
                 replaced_tokens=record.tokens_before, replacement_tokens=replacement, span=span_of(source),
                 summary=_summary_text(record), summarizer=_run(record.model, summary, seconds))


def failure_event(origin: Origin, *, event_id: str, trigger: str, limits: Limits, plan: Plan,
                  source: Sequence[Message], model: str, error: Exception, calls: int, usage: dict[str, int],
                  seconds: float) -> Event:
    run = SummarizerRun(model=model[:200], calls=calls, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                        completion_tokens=int(usage.get("completion_tokens", 0)),
                        latency_ms=round(seconds * 1000, 1))
    before = plan.tokens_before + plan.overhead
    # The error's type only: its message may quote an upstream's answer.
    return Event(id=event_id, kind="summary", outcome="failed", at=time.time(), owner=origin.owner,
                 conversation=origin.conversation, dialect=origin.dialect, model=origin.model, trigger=trigger,
                 reason=type(error).__name__, request_id=origin.request_id, window=limits.window,
                 threshold_tokens=limits.trigger_tokens, tokens_before=before, tokens_after=before,
                 span=span_of(source), summarizer=run)


def tell_failure(error: BaseException, event_id: str) -> None:
    """Mark `error` (raised to every request waiting on the summary) with the journal event of the failure."""
    setattr(error, _FAILURE_ATTRIBUTE, event_id)


def failure_told(error: BaseException) -> str | None:
    """The journal event of the failure `error` ended a summary with; None when none was recorded here."""
    told = getattr(error, _FAILURE_ATTRIBUTE, None)
    return told if isinstance(told, str) else None


def point_of(origin: Origin, headers: Mapping[str, str], *, limits: Limits, tokens_before: int,
             tokens_after: int, event_id: str | None = None) -> Point:
    """One request: its prompt as the client sent it and as forwarded, and what its headers say was done. Made
    without validation, on every request: every value is the proxy's own and in bounds (the origin's strings are
    cut to size); what is read back from a store is validated."""
    return Point.model_construct(
        at=time.time(), event_id=event_id, owner=origin.owner, conversation=origin.conversation,
        dialect=origin.dialect, model=origin.model, request_id=origin.request_id, tokens_before=tokens_before,
        tokens_after=tokens_after, window=limits.window, threshold_tokens=limits.trigger_tokens,
        outcome=headers.get(COMPACTION, "none"), cleared=_count(headers.get(CLEARED)),
        pair_summaries=_count(headers.get(PAIR_SUMMARIES)))


def _count(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def _summary_text(record: CompactedPrefix) -> str | None:
    """The summary as the model is sent it: the replacement's user message."""
    for message in record.replacement:
        if role(message) == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


def _run(model: str, summary: Summary, seconds: float) -> SummarizerRun:
    return SummarizerRun(model=model[:200], calls=summary.calls,
                         prompt_tokens=int(summary.usage.get("prompt_tokens", 0)),
                         completion_tokens=int(summary.usage.get("completion_tokens", 0)),
                         latency_ms=round(seconds * 1000, 1), strategy=summary.strategy[:200],
                         structured=summary.structured is not None)


class Recorder:
    """Sends entries to the journal from a queue, off the request's path: a few writer tasks drain it, at most
    _MAX_PENDING entries wait, and a slow or broken store costs a request nothing."""

    def __init__(self, journal: Journal | None, on_error: Callable[[str], None] | None = None) -> None:
        self.journal = journal
        self._on_error = on_error
        self._queue: deque[Event | Point] = deque()
        self._writers: set[asyncio.Task[None]] = set()
        self._stages: OrderedDict[str, tuple[int, int]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.journal is not None

    def safely(self, operation: str, write: Callable[[], object]) -> None:
        """Make and send entries; whatever goes wrong making them (a bug, a count out of bounds) is logged and
        counted, never raised into the request or the summary that is being recorded."""
        if self.journal is None:
            return
        try:
            write()
        except Exception:  # the journal records; it must never be what fails a request
            log.warning("journal %s could not be made", operation, exc_info=True)
            self._failed(operation)

    def record(self, event: Event) -> None:
        self._enqueue("journal_record", event)

    def point(self, point: Point) -> None:
        self._enqueue("journal_point", point)

    def request(self, origin: Origin, headers: dict[str, str], *, summary: tuple[str, str] | None, limits: Limits,
                tokens_before: int, tokens_after: int, freed: int, failure: str | None = None) -> None:
        """One request answered: its point, the stages' events when they went further, and on its answer
        x-compaction-id: the summary's event when the request holds one (`summary`: its namespace and prefix
        hash), else the event of the summary that failed for it (`failure`), else a stage event made now."""
        if summary is not None:
            headers[COMPACTION_ID] = summary_id(*summary)
        elif failure is not None:
            headers[COMPACTION_ID] = failure
        point = point_of(origin, headers, limits=limits, tokens_before=max(0, tokens_before),
                         tokens_after=max(0, tokens_after), event_id=headers.get(COMPACTION_ID))
        if (stage := self.stage_events(origin, point, freed)) is not None and COMPACTION_ID not in headers:
            headers[COMPACTION_ID] = stage
            point = point.model_copy(update={"event_id": stage})
        self.point(point)

    def shadow(self, origin: Origin, headers: Mapping[str, str], *, limits: Limits, tokens_before: int) -> None:
        """What shadow mode would have done, as an event when it would have compacted; the request as a point."""
        decision = headers.get(SHADOW, "none")
        after = _count(headers.get(SHADOW_TOKENS_AFTER)) if SHADOW_TOKENS_AFTER in headers else tokens_before
        point = point_of(origin, headers, limits=limits, tokens_before=tokens_before, tokens_after=tokens_before)
        if decision in ("proactive", "reactive"):
            made = secrets.token_hex(12)
            self.record(Event(id=made, kind="shadow", outcome="shadow", at=point.at, owner=origin.owner,
                              conversation=origin.conversation, dialect=origin.dialect, model=origin.model,
                              trigger=decision, request_id=origin.request_id, window=limits.window,
                              threshold_tokens=limits.trigger_tokens, tokens_before=tokens_before,
                              tokens_after=after))
            point = point.model_copy(update={"event_id": made})
        self.point(point)

    def stage_events(self, origin: Origin, point: Point, freed: int) -> str | None:
        """Events for the tool-result stages when this request went further than the conversation's last one:
        more results cleared, or more rounds sent as their summaries. Returns the newest event's id."""
        last = self._stages.pop(origin.conversation, (0, 0))
        self._stages[origin.conversation] = (point.cleared, point.pair_summaries)
        while len(self._stages) > _STAGE_MEMORY:
            self._stages.popitem(last=False)
        made = None
        stages: tuple[tuple[Literal["clearing", "pair_summaries"], int, int], ...] = (
            ("clearing", point.cleared, last[0]), ("pair_summaries", point.pair_summaries, last[1]))
        for kind, now, before in stages:
            if now > before:
                made = secrets.token_hex(12)
                self.record(Event(id=made, kind=kind, outcome="applied", at=point.at, owner=origin.owner,
                                  conversation=origin.conversation, dialect=origin.dialect, model=origin.model,
                                  trigger=kind, request_id=origin.request_id, window=point.window,
                                  threshold_tokens=point.threshold_tokens, tokens_before=point.tokens_before,
                                  tokens_after=point.tokens_after, replaced_tokens=freed if kind == "clearing" else 0,
                                  span=Span(start=0, count=now, roles={"tool": now})))
        return made

    def _enqueue(self, operation: str, entry: Event | Point) -> None:
        if self.journal is None:
            return
        if len(self._queue) >= _MAX_PENDING:
            self._failed(operation)  # dropped, counted: the journal falls behind, requests never wait for it
            return
        self._queue.append(entry)
        if len(self._writers) < _WRITERS:
            writer = asyncio.get_running_loop().create_task(self._write(self.journal))
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)

    async def _write(self, journal: Journal) -> None:
        while self._queue:
            entry = self._queue.popleft()
            operation = "journal_record" if isinstance(entry, Event) else "journal_point"
            try:
                await (journal.record(entry) if isinstance(entry, Event) else journal.point(entry))
            except Exception:  # a journal must never fail what it records
                log.warning("journal %s failed", operation, exc_info=True)
                self._failed(operation)

    def _failed(self, operation: str) -> None:
        if self._on_error is not None:
            self._on_error(operation)

    async def drain(self) -> None:
        """Wait for the writes queued and under way (shutdown, and tests reading what was just written)."""
        while self._writers:
            await asyncio.gather(*list(self._writers), return_exceptions=True)
