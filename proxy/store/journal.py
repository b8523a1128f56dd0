"""The compaction journal: what compaction did to each conversation, per request and per event, kept bounded."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Clock = Callable[[], float]
# A stored text is bounded, a name is short: the store may hand back anything, and a read must stay small.
_MAX_SUMMARY_CHARS = 1024 * 1024
_NAME = 200
_ID = Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")
_COUNT = Field(ge=0, le=10**12)
# What one entry costs in memory besides its summary's text, measured with tracemalloc (a point: ~1.4 KB).
ENTRY_BYTES = 2048
POINT_BYTES = 1400
EventKind = Literal["summary", "clearing", "pair_summaries", "shadow"]
EventOutcome = Literal["applied", "failed", "shadow"]


class _Entry(BaseModel):
    # Frozen, unknown keys refused: a stored entry that is not exactly one of ours is not read as one.
    model_config = ConfigDict(frozen=True, extra="forbid")


class Span(_Entry):
    """The part of the conversation an event replaced: where it starts, how long it is, and its roles counted.
    The messages themselves stay with the client."""

    start: int = Field(0, ge=0, le=10**12)
    count: int = Field(0, ge=0, le=10**12)
    roles: dict[str, int] = Field(default_factory=dict, max_length=16)


class SummarizerRun(_Entry):
    """What making a summary cost: calls, tokens, time, and how the reply was read."""

    model: str = Field(max_length=_NAME)
    calls: int = _COUNT
    prompt_tokens: int = _COUNT
    completion_tokens: int = _COUNT
    latency_ms: float = Field(ge=0)
    strategy: str = Field("", max_length=_NAME)
    structured: bool = False


class Event(_Entry):
    """One compaction event. Tokens are the upstream's: `tokens_before`/`tokens_after` of the whole request,
    `replaced_tokens`/`replacement_tokens` of the span the summary (or the stage) replaced."""

    id: str = _ID
    kind: EventKind
    outcome: EventOutcome
    at: float = Field(ge=0)
    owner: str = _ID
    conversation: str = _ID
    dialect: str = Field(max_length=_NAME)
    model: str = Field(max_length=_NAME)
    trigger: str = Field(max_length=_NAME)
    reason: str | None = Field(None, max_length=_NAME)
    request_id: str | None = Field(None, max_length=_NAME)
    window: int = _COUNT
    threshold_tokens: int = _COUNT
    tokens_before: int = _COUNT
    tokens_after: int = _COUNT
    replaced_tokens: int = Field(0, ge=0, le=10**12)
    replacement_tokens: int = Field(0, ge=0, le=10**12)
    span: Span = Field(default_factory=Span)
    summary: str | None = Field(None, max_length=_MAX_SUMMARY_CHARS)
    summarizer: SummarizerRun | None = None

    def listed(self) -> dict[str, object]:
        """The event without its summary's text (a conversation's list of events stays small)."""
        return self.model_dump(exclude={"summary", "owner"}) | {"has_summary": self.summary is not None}


class Point(_Entry):
    """One request of a conversation: its prompt as the client sent it and as forwarded, against its window."""

    at: float = Field(ge=0)
    owner: str = _ID
    conversation: str = _ID
    dialect: str = Field(max_length=_NAME)
    model: str = Field(max_length=_NAME)
    request_id: str | None = Field(None, max_length=_NAME)
    tokens_before: int = _COUNT
    tokens_after: int = _COUNT
    window: int = _COUNT
    threshold_tokens: int = _COUNT
    outcome: str = Field(max_length=_NAME)
    event_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")
    cleared: int = _COUNT
    pair_summaries: int = _COUNT


class ConversationInfo(_Entry):
    """A conversation as listed: its model, when it was seen, how many requests and compactions."""

    id: str = _ID
    owner: str = _ID
    dialect: str = Field(max_length=_NAME)
    model: str = Field(max_length=_NAME)
    first_at: float = Field(ge=0)
    last_at: float = Field(ge=0)
    requests: int = _COUNT
    compactions: int = _COUNT


@dataclass(frozen=True)
class ConversationDetail:
    info: ConversationInfo
    points: list[Point]
    events: list[Event]


E = TypeVar("E", bound=_Entry)


def parse_entry(kind: type[E], raw: object) -> E | None:
    """A stored entry read back, or None when it is not one (the store may hold anything)."""
    if not isinstance(raw, str | bytes):
        return None
    try:
        return kind.model_validate_json(raw)
    except (ValidationError, ValueError):
        return None


def detail_of(info: ConversationInfo, points: Sequence[object], events: Sequence[object],
              fresh: Callable[[float], bool]) -> ConversationDetail:
    """A conversation read back from a shared store: each stored point and event checked to be this conversation's
    and its owner's, and still fresh, so a hand-edited or hostile value shows nothing of another's."""
    def ours(entry: Point | Event) -> bool:
        return entry.conversation == info.id and entry.owner == info.owner and fresh(entry.at)

    kept_points = [point for raw in points if (point := parse_entry(Point, raw)) is not None and ours(point)]
    kept_events = [event for raw in events if (event := parse_entry(Event, raw)) is not None and ours(event)]
    return ConversationDetail(info, kept_points, kept_events)


def event_id(*parts: str) -> str:
    """An event's id from what names it: the same summary has the same id on every replica."""
    text = "\x00".join(("compaction-proxy/event", *parts))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def counts_as_compaction(event: Event) -> bool:
    return event.outcome == "applied"


@runtime_checkable
class Journal(Protocol):
    """Where events and points are kept. `owner` None reads every owner's (an operator); otherwise only
    that owner's entries exist for the reader."""

    async def record(self, event: Event) -> None: ...

    async def point(self, point: Point) -> None: ...

    async def conversations(self, owner: str | None, limit: int) -> list[ConversationInfo]: ...

    async def conversation(self, owner: str | None, conversation: str) -> ConversationDetail | None: ...

    async def event(self, owner: str | None, event_id: str) -> Event | None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class JournalBounds:
    """How much a journal keeps: events in all (oldest evicted first), conversations (least recently seen
    evicted first, with their points), points per conversation (oldest dropped), and for how long; in memory also
    bytes in all (the oldest event, or the least recently seen conversation, goes first)."""

    max_events: int = 2000
    max_conversations: int = 1000
    max_points: int = 200
    ttl_seconds: float = 7 * 24 * 3600
    max_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        if min(self.max_events, self.max_conversations, self.max_points, self.max_bytes) < 1 \
                or self.ttl_seconds <= 0:
            raise ValueError("journal bounds must be at least 1 and its ttl positive")


@dataclass
class _Conversation:
    """One conversation's entry, kept mutable (a request touches it): made into a ConversationInfo when read."""

    id: str
    owner: str
    dialect: str
    model: str
    first_at: float
    last_at: float
    points: deque[Point]
    events: deque[str] = field(default_factory=deque)
    requests: int = 0
    compactions: int = 0

    @property
    def info(self) -> ConversationInfo:
        return ConversationInfo.model_construct(
            id=self.id, owner=self.owner, dialect=self.dialect, model=self.model, first_at=self.first_at,
            last_at=self.last_at, requests=self.requests, compactions=self.compactions)


def event_bytes(event: Event) -> int:
    """What an event is charged in memory: its summary's characters (up to four bytes each) and its fields."""
    return ENTRY_BYTES + 4 * len(event.summary or "")


class MemoryJournal:
    """The journal in this process: bounded by count and by bytes, entries older than the TTL not read."""

    def __init__(self, bounds: JournalBounds, clock: Clock = time.time) -> None:
        self.bounds = bounds
        self._clock = clock
        self._events: OrderedDict[str, Event] = OrderedDict()
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._events)

    async def record(self, event: Event) -> None:
        # The same id again (a summary recorded by two replicas, say) is one compaction, not two.
        known = self._events.pop(event.id, None)
        if known is not None:
            self.total_bytes -= event_bytes(known)
        self._events[event.id] = event
        self.total_bytes += event_bytes(event)
        while len(self._events) > self.bounds.max_events:
            self.total_bytes -= event_bytes(self._events.popitem(last=False)[1])
        held = self._touch(event.owner, event.conversation, event.dialect, event.model, event.at)
        self._within_bytes(keep=held)
        if known is not None:
            return
        held.events.append(event.id)
        while len(held.events) > self.bounds.max_events:
            held.events.popleft()
        if counts_as_compaction(event):
            held.compactions += 1

    async def point(self, point: Point) -> None:
        held = self._touch(point.owner, point.conversation, point.dialect, point.model, point.at)
        if len(held.points) < self.bounds.max_points:
            self.total_bytes += POINT_BYTES  # (a full deque drops its oldest point as it takes this one)
        held.points.append(point)
        held.requests += 1
        self._within_bytes(keep=held)

    def _within_bytes(self, keep: _Conversation) -> None:
        """Over max_bytes: the oldest event goes while events hold most of the bytes, else the least recently seen
        conversation with its points (never the one just written)."""
        while self.total_bytes > self.bounds.max_bytes:
            points = sum(len(held.points) for held in self._conversations.values()) * POINT_BYTES
            if self._events and (points <= self.total_bytes // 2 or len(self._conversations) <= 1):
                self.total_bytes -= event_bytes(self._events.popitem(last=False)[1])
            elif len(self._conversations) > 1:
                oldest = next(iter(self._conversations))
                if self._conversations[oldest] is keep:
                    break
                self._drop(oldest)
            else:
                break

    def _touch(self, owner: str, conversation: str, dialect: str, model: str, at: float) -> _Conversation:
        held = self._conversations.pop(conversation, None)
        if held is None or held.owner != owner:
            held = _Conversation(conversation, owner, dialect, model, at, at, deque(maxlen=self.bounds.max_points))
        else:
            held.last_at, held.model = max(at, held.last_at), model
        self._conversations[conversation] = held
        while len(self._conversations) > self.bounds.max_conversations:
            self._drop(next(iter(self._conversations)))
        return held

    def _drop(self, conversation: str) -> None:
        held = self._conversations.pop(conversation)
        self.total_bytes -= len(held.points) * POINT_BYTES

    def _fresh(self, at: float) -> bool:
        return self._clock() - at < self.bounds.ttl_seconds

    async def conversations(self, owner: str | None, limit: int) -> list[ConversationInfo]:
        found = [held.info for held in reversed(self._conversations.values())
                 if (owner is None or held.owner == owner) and self._fresh(held.last_at)]
        return found[:max(0, limit)]

    async def conversation(self, owner: str | None, conversation: str) -> ConversationDetail | None:
        held = self._conversations.get(conversation)
        if held is None or (owner is not None and held.owner != owner) or not self._fresh(held.last_at):
            return None
        events = [event for event_id in held.events if (event := self._events.get(event_id)) is not None
                  and self._fresh(event.at)]
        return ConversationDetail(held.info, [p for p in held.points if self._fresh(p.at)], events)

    async def event(self, owner: str | None, event_id: str) -> Event | None:
        event = self._events.get(event_id)
        if event is None or (owner is not None and event.owner != owner) or not self._fresh(event.at):
            return None
        return event

    async def close(self) -> None:
        self._events.clear()
        self._conversations.clear()
        self.total_bytes = 0
