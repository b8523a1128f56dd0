"""Compaction as a service: plan, summarise once per prefix (single-flight, stored), splice."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from proxy.compaction import Message, Plan, apply_replacement, plan_compaction, replacement
from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.store import SingleFlight, SummaryRecord, SummaryStore
from proxy.summarizer import ChatModel, Summary, summarize
from proxy.templates import Templates
from proxy.tokens import TokenCounter

log = logging.getLogger("proxy.compaction")

# (summariser model name, client headers, output token limit) -> a model to call
ModelFactory = Callable[[str, Mapping[str, str], int], ChatModel]
MIN_SUMMARY_TOKENS = 256


@dataclass(frozen=True)
class Conversation:
    """A client's history as sent, and the stored summary (if any) that stands in for its first messages."""

    original: Sequence[Message]
    chain: Sequence[str]
    namespace: str
    record: SummaryRecord | None = None

    @cached_property
    def messages(self) -> list[Message]:
        """The history as forwarded: read-only, computed once."""
        if self.record is None:
            return list(self.original)
        return [*self.record.replacement, *self.original[self.record.prefix_len:]]

    def original_index(self, index: int) -> int:
        """Where a position in `messages` falls in `original`."""
        if self.record is None:
            return index
        return index - len(self.record.replacement) + self.record.prefix_len


class Compactor:
    def __init__(self, settings: Settings, store: SummaryStore, counter: TokenCounter, templates: Templates,
                 metrics: Metrics, model_factory: ModelFactory) -> None:
        self._settings = settings
        self._store = store
        self._counter = counter
        self._templates = templates
        self._metrics = metrics
        self._model_factory = model_factory
        self._flights = SingleFlight()

    async def reuse(self, original: Sequence[Message], chain: Sequence[str], namespace: str) -> Conversation:
        """The conversation with the longest stored summary spliced in, when one matches its prefix."""
        plain = Conversation(original, chain, namespace)
        # A summary of this conversation may be on its way (built in the background after the last turn):
        # waiting for it beats building another one for a slightly longer prefix.
        await self._flights.wait_for_any([f"{namespace}:{prefix}" for prefix in reversed(chain)])
        try:
            record = await self._store.longest_match(namespace, chain)
        except Exception:  # a broken store must not break serving
            log.warning("summary store lookup failed; serving without reuse", exc_info=True)
            self._metrics.store_errors.labels("lookup").inc()
            return plain
        if record is None or apply_replacement(original, record.replacement, record.prefix_len) is None:
            return plain
        return Conversation(original, chain, namespace, record)

    async def compact(self, conversation: Conversation, *, model: str, window: int, trigger: str,
                      headers: Mapping[str, str]) -> SummaryRecord | None:
        """Summarise what the plan gives up, once per prefix; None when nothing can be summarised."""
        flight = self.begin(conversation, model=model, window=window, trigger=trigger, headers=headers)
        if flight is None:
            return None
        return await asyncio.shield(flight[0])

    def begin(self, conversation: Conversation, *, model: str, window: int, trigger: str,
              headers: Mapping[str, str]) -> tuple[asyncio.Task[SummaryRecord], int] | None:
        """Plan and claim the summary now (no await), so a request arriving next finds it in flight."""
        working = conversation.messages
        config = self._settings.compaction
        plan = plan_compaction(working, self._counter.count_message, int(config.tail_budget * window))
        replaced = len(conversation.record.replacement) if conversation.record else 0
        if plan is None or plan.prefix_len <= replaced:
            return None
        prefix_len = conversation.original_index(plan.prefix_len)
        prefix_hash = conversation.chain[prefix_len - 1]
        summary_tokens = max(MIN_SUMMARY_TOKENS, min(
            config.summarizer.max_output_tokens, int(config.target * window) - plan.kept_tokens))

        async def build() -> SummaryRecord:
            stored = await self._stored(conversation.namespace, prefix_hash)
            if stored is not None:
                return stored
            return await self._summarise(plan, prefix_hash, prefix_len, model=model, trigger=trigger,
                                         headers=headers, summary_tokens=summary_tokens,
                                         namespace=conversation.namespace)

        return self._flights.start(f"{conversation.namespace}:{prefix_hash}", build), prefix_len

    async def _stored(self, namespace: str, prefix_hash: str) -> SummaryRecord | None:
        try:
            return await self._store.get(namespace, prefix_hash)
        except Exception:
            log.warning("summary store read failed", exc_info=True)
            self._metrics.store_errors.labels("get").inc()
            return None

    async def _summarise(self, plan: Plan, prefix_hash: str, prefix_len: int, *, model: str, trigger: str,
                         headers: Mapping[str, str], summary_tokens: int, namespace: str) -> SummaryRecord:
        summarizer_model = self._settings.compaction.summarizer.model or model
        started = time.monotonic()
        try:
            summary = await summarize(self._model_factory(summarizer_model, headers, summary_tokens),
                                      list(plan.to_summarise), self._templates, counter=self._counter)
        except Exception:
            self._metrics.summarizer_calls.labels("error").inc()
            raise
        continuation = {"role": "assistant", "content": self._templates.continuation_note()}
        messages = replacement(plan, summary.message, continuation)
        tokens_after = sum(self._counter.count_message(m) for m in messages)
        record = SummaryRecord(prefix_hash, prefix_len, tuple(messages), plan.tokens_before - plan.tail_tokens,
                               tokens_after, summarizer_model, time.time())
        await self._put(namespace, record)
        self._account(summary, plan, record, trigger=trigger, model=summarizer_model,
                      seconds=time.monotonic() - started)
        return record

    async def _put(self, namespace: str, record: SummaryRecord) -> None:
        try:
            await self._store.put(namespace, record)
        except Exception:
            log.warning("summary store write failed; the summary is used once", exc_info=True)
            self._metrics.store_errors.labels("put").inc()

    def _account(self, summary: Summary, plan: Plan, record: SummaryRecord, *, trigger: str, model: str,
                 seconds: float) -> None:
        metrics = self._metrics
        metrics.compactions.labels(trigger).inc()
        metrics.summarizer_calls.labels("ok").inc(summary.calls)
        metrics.compaction_seconds.observe(seconds)
        for kind in ("prompt_tokens", "completion_tokens"):
            metrics.summarizer_tokens.labels(kind.removesuffix("_tokens")).inc(int(summary.usage.get(kind, 0)))
        log.info(json.dumps(_event(summary, plan, record, trigger=trigger, model=model, seconds=seconds)))


def _event(summary: Summary, plan: Plan, record: SummaryRecord, *, trigger: str, model: str,
           seconds: float) -> dict[str, Any]:
    """The structured log line of one compaction: figures only, never message text."""
    return {"event": "compaction", "trigger": trigger, "summarizer_model": model,
            "messages_before": record.prefix_len, "messages_after": len(record.replacement),
            "tokens_before": record.tokens_before, "tokens_after": record.tokens_after,
            "summarized_messages": len(plan.to_summarise), "summarizer_calls": summary.calls,
            "summarizer_strategy": summary.strategy,
            "summarizer_prompt_tokens": summary.usage.get("prompt_tokens", 0),
            "summarizer_completion_tokens": summary.usage.get("completion_tokens", 0),
            "structured": summary.structured is not None, "duration_ms": round(seconds * 1000, 1)}
