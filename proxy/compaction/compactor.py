"""Compaction as a service: plan, summarise once per prefix (single-flight, stored, backed off), splice."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.compaction.conversation import Conversation
from proxy.compaction.job import Job
from proxy.compaction.pace import smoothed
from proxy.compaction.recorder import Origin, Recorder, failure_event, failure_told, summary_event, tell_failure
from proxy.config import Settings
from proxy.core import budget
from proxy.core.backoff import Backoff, shrink
from proxy.core.budget import Limits
from proxy.core.calibration import Calibration
from proxy.core.elision import elide_text
from proxy.core.messages import Message, is_tool_result, valid_text
from proxy.core.plan import Plan, plan_compaction, replacement, replacement_applies
from proxy.core.stored_replacements import StoredReplacements
from proxy.core.tail_walks import TailWalks
from proxy.core.tokens import TokenCounter
from proxy.metrics import Metrics
from proxy.offload import LARGE_REPLY, off_loop_above, off_loop_if_large
from proxy.request_context import current_request_id
from proxy.store.flights import Flights, LocalFlights, RemoteFailure
from proxy.store.store import CompactedPrefix, SummaryStore
from proxy.summarizer.evidence import Evidence, gather, text_size
from proxy.summarizer.summarizer import (
    ChatModel,
    ConversationPrefix,
    SummarizerError,
    Summary,
    summarize,
    with_evidence,
)
from proxy.summarizer.templates import Templates

log = logging.getLogger("proxy.compaction")

# (summariser model name, client headers, output token limit, the part of it that must fit whole) -> a model to call
ModelFactory = Callable[[str, Mapping[str, str], int, int], ChatModel]
# The smallest summary ask a backed-off retry may shrink to.
MIN_RETRY_SUMMARY_TOKENS = 128


@dataclass(frozen=True)
class Outcome:
    """What one request for a compaction came to: a record, or why there is none."""

    record: CompactedPrefix | None
    reason: str  # "compacted" | "nothing_to_summarize" | "not_smaller" | "backoff" | "failed"
    failure: str | None = None  # the journal event of a summary that failed, when one was recorded here


@dataclass(frozen=True)
class Flight:
    task: asyncio.Task[CompactedPrefix]
    prefix_len: int


class Compactor:
    def __init__(self, settings: Settings, store: SummaryStore, counter: TokenCounter, templates: Templates,
                 metrics: Metrics, model_factory: ModelFactory, calibration: Calibration | None = None,
                 flights: Flights | None = None, recorder: Recorder | None = None,
                 replacements: StoredReplacements | None = None) -> None:
        self._settings = settings
        self._summary_seconds: float | None = None
        self._recorder = recorder or Recorder(None)
        self._calibration = calibration or Calibration()
        self._store = store
        self._counter = counter
        self._templates = templates
        self._metrics = metrics
        self._model_factory = model_factory
        self._flights = flights or LocalFlights(store, metrics.store_errors_counter())
        self._backoff = Backoff()
        self._tail_walks = TailWalks()
        self.replacements = replacements or StoredReplacements()
        self._fillers = (
            {"role": "assistant", "content": templates.continuation_note()},
            {"role": "assistant", "content": templates.acknowledgement()},
        )
        self._summary_note = templates.summary_note()

    def filler_tokens(self, messages: Sequence[Message]) -> int:
        """What the proxy's own words add to a compaction of `messages`: the fillers, and the summary's closing
        note where the history has tool output for the summary to quote."""
        note = self._counter.count_text(self._note_for(messages))
        return note + sum(self._counter.count_message(filler) for filler in self._fillers)

    def _note_for(self, messages: Sequence[Message]) -> str:
        """The summary's closing note, when `messages` hold tool results (the summary sent as the user's message
        may quote them); nothing for a conversation without tools."""
        return f"\n\n{self._summary_note}" if any(is_tool_result(message) for message in messages) else ""

    def elision_marker(self, tokens: int) -> str:
        return self._templates.elision_marker(tokens)

    async def reuse(self, original: Sequence[Message], chain: Sequence[str], namespace: str) -> Conversation:
        """The conversation with the longest stored summary spliced in, when one matches its prefix."""
        plain = Conversation(original, chain, namespace)
        # A summary of this conversation may be on its way (built in the background after the last turn):
        # waiting for it beats building another one for a slightly longer prefix.
        await self._flights.wait_for_any(namespace, chain)
        try:
            record = await self._store.longest_match(namespace, chain)
        except Exception:  # a broken store must not break serving
            log.warning("summary store lookup failed; serving without reuse", exc_info=True)
            self._metrics.store_errors.labels("lookup").inc()
            return plain
        if record is None or not self._applies(original, chain, namespace, record):
            self._metrics.labelled(self._metrics.reuse_lookups, "miss").inc()
            return plain
        self._metrics.labelled(self._metrics.reuse_lookups, "hit").inc()
        key = (namespace, record.prefix_hash)
        counts = self.replacements.counts(key, record.replacement, self._counter.count_each)
        synthetic = self.replacements.synthetic(key, record.replacement)
        return Conversation(original, chain, namespace, record, counts, synthetic)

    def _applies(self, original: Sequence[Message], chain: Sequence[str], namespace: str,
                 record: CompactedPrefix) -> bool:
        """Whether the stored summary splices in (plan.apply_replacement), its tool-pair walk of the messages after
        its cut going on from where this conversation's last request left it (core.tail_walks)."""
        def splits(messages: Sequence[Message], cut: int) -> bool:
            return self._tail_walks.splits((namespace, record.prefix_hash), messages, chain, cut)

        return replacement_applies(original, record.replacement, record.prefix_len, splits)

    def plan(self, conversation: Conversation, limits: Limits, *, model: str,
             answer_tokens: int | None = None, overhead: int = 0) -> Plan | None:
        """The plan for this conversation's next summary; None when no cut lies past the stored one.

        Counts are scaled to the upstream's own tokenizer (the calibration), as the window is.
        """
        ratio = self._calibration.ratio(model)

        def count(message: Message) -> int:
            return math.ceil(self._counter.count_message(message) * ratio)

        plan = plan_compaction(conversation.messages, count, limits, answer_tokens=answer_tokens,
                               synthetic=conversation.synthetic,
                               overhead=overhead + self.filler_tokens(conversation.messages))
        if plan is None or plan.prefix_len <= conversation.replaced:
            return None
        return plan

    async def compact(self, conversation: Conversation, limits: Limits, *, model: str, trigger: str,
                      headers: Mapping[str, str], overhead: int = 0, force: bool = False,
                      tools: Any = None, instructions: str | None = None, origin: Origin | None = None) -> Outcome:
        """Summarise what the plan gives up, once per prefix; `force` summarises even where it saves nothing;
        `instructions` are the client's for its summary; `origin` names the request in the journal."""
        begun = self.begin(conversation, limits, model=model, trigger=trigger, headers=headers, overhead=overhead,
                           force=force, tools=tools, instructions=instructions, origin=origin)
        if isinstance(begun, str):
            # Skipped for a failure just now (one this request may have waited on): the answer names that failure.
            cause = self._backoff.cause(conversation.backoff_key) if begun == "backoff" else None
            return Outcome(None, begun, cause)
        try:
            return Outcome(await asyncio.shield(begun.task), "compacted")
        except (SummarizerError, RemoteFailure) as error:
            log.warning("compaction failed (%s): %s", trigger, error)
            return Outcome(None, "failed", failure_told(error))
        except Exception as error:  # whatever broke (a store, a bug): the request goes on as it came
            log.error("compaction failed (%s) unexpectedly; forwarding the request without a summary", trigger,
                      exc_info=True)
            return Outcome(None, "failed", failure_told(error))

    def begin(self, conversation: Conversation, limits: Limits, *, model: str, trigger: str,
              headers: Mapping[str, str], answer_tokens: int | None = None, overhead: int = 0,
              force: bool = False, tools: Any = None, instructions: str | None = None,
              origin: Origin | None = None, aside: bool = False, slack: int | None = None) -> Flight | str:
        """Plan and claim the summary now (no await), so a request arriving next finds it in flight.

        `tools` are the request's own, for a prefix-layout summariser request; `aside` stores it where only
        `promote` finds it (a summary prepared ahead), if its plan stays within `slack` of its goal (by default
        budget.prepared_slack). Returns the flight, or the reason there is none.
        """
        plan = self.plan(conversation, limits, model=model, answer_tokens=answer_tokens, overhead=overhead)
        if plan is None:
            return "nothing_to_summarize"
        if aside and plan.allotment.shortfall > (budget.prepared_slack(limits) if slack is None else slack):
            # Made now, it would leave the growth still to come verbatim so far past the target that the
            # conversation would soon need its next summary: it is left to a later turn, nearer the threshold.
            return "not_attainable"
        if not force and not plan.worthwhile(self.filler_tokens(conversation.messages)):
            return "not_smaller"
        prefix_len = conversation.original_index(plan.prefix_len)
        prefix_hash = conversation.chain[prefix_len - 1]
        stored_in = prepared_namespace(conversation.namespace) if aside else conversation.namespace
        if aside and self._flights.running_any(stored_in, conversation.chain):
            return "in_flight"  # one summary prepared ahead at a time: the next turns would each start one
        if (running := self._flights.running(stored_in, prefix_hash)) is not None:
            return Flight(running, prefix_len)
        decision = self._backoff.decide(conversation.backoff_key)
        if not decision.allowed:
            log.info(json.dumps({"event": "compaction_skipped", "request_id": current_request_id(),
                                 "reason": "backoff", "trigger": trigger,
                                 "failures": decision.level, "skips_left": decision.skipped_left}))
            return "backoff"
        job = Job(plan, prefix_hash, prefix_len, conversation.namespace, conversation.backoff_key, limits,
                   model=self._settings.compaction.summarizer.model or model, trigger=trigger, headers=headers,
                   summary_tokens=shrink(plan.summary_tokens, decision.level, MIN_RETRY_SUMMARY_TOKENS),
                   level=decision.level, prefix=self._prefix(conversation, plan, model, tools),
                   ratio=self._calibration.ratio(model),
                   source=tuple(conversation.original[:prefix_len]), instructions=instructions, origin=origin,
                   force=force)
        # The flight looks for a stored record first, and stores what _summarise returns (fenced, across replicas).
        return Flight(self._flights.start(stored_in, prefix_hash, lambda: self._summarise(job)), prefix_len)

    @property
    def summary_seconds(self) -> float | None:
        """How long a summary takes here, smoothed over those made (None before the first)."""
        return self._summary_seconds

    async def prepared(self, conversation: Conversation) -> bool:
        """Whether a summary prepared ahead for a prefix of this conversation (past the one spliced in) is being
        made or is stored, here or on another replica; a broken store says no, and one more is prepared."""
        if self._flights.running_any(prepared_namespace(conversation.namespace), conversation.chain):
            return True
        return await self._prepared_record(conversation) is not None

    async def promote(self, conversation: Conversation) -> Conversation:
        """The conversation with the summary prepared for it spliced in (awaited when still being made) and stored
        where every later request, on any replica, finds it; the same conversation when none applies: the request
        no longer starts with what it summarised, or it summarised no more than what is spliced in already."""
        await self._flights.wait_for_any(prepared_namespace(conversation.namespace), conversation.chain)
        record = await self._prepared_record(conversation)
        if record is None or not self._applies(conversation.original, conversation.chain, conversation.namespace,
                                               record):
            return conversation
        try:
            await self._store.put(conversation.namespace, record)
        except Exception:  # this request still gets it; the next one promotes it again
            log.warning("summary store write failed (a prepared summary)", exc_info=True)
            self._metrics.store_errors.labels("put").inc()
        self._metrics.labelled(self._metrics.reuse_lookups, "prepared").inc()
        return Conversation(conversation.original, conversation.chain, conversation.namespace, record)

    async def _prepared_record(self, conversation: Conversation) -> CompactedPrefix | None:
        """The longest summary prepared for a prefix of this conversation, past the one spliced in; None when there
        is none, or the store is broken (serving goes on without it)."""
        try:
            record = await self._store.longest_match(prepared_namespace(conversation.namespace), conversation.chain)
        except Exception:  # a broken store must not break serving
            log.warning("summary store lookup failed (prepared summaries)", exc_info=True)
            self._metrics.store_errors.labels("lookup").inc()
            return None
        spliced = conversation.record.prefix_len if conversation.record is not None else 0
        return record if record is not None and record.prefix_len > spliced else None

    def _prefix(self, conversation: Conversation, plan: Plan, model: str, tools: Any) -> ConversationPrefix | None:
        """What a prefix-layout request is made of, when the layout calls for one."""
        config = self._settings.compaction.summarizer
        own_model = config.upstream is None and config.model in (None, model)
        if config.layout == "transcript" or (config.layout == "auto" and not own_model):
            return None
        acknowledgement = str(self._fillers[1]["content"])
        return ConversationPrefix(tuple(conversation.messages[:plan.prefix_len]), tools, acknowledgement)

    async def _summarise(self, job: Job) -> CompactedPrefix:
        started = time.monotonic()
        try:
            summary, messages, tokens_after = await self._fitting_summary(job)
        except Exception as error:  # a bug backs off too, rather than failing the same way on every turn
            self._backoff.failed(job.backoff_key, self._account_failure(job, error, time.monotonic() - started))
            raise
        self._backoff.succeeded(job.backoff_key)
        record = CompactedPrefix(job.prefix_hash, job.prefix_len, tuple(messages),
                                 job.plan.tokens_before - job.plan.tail_tokens, tokens_after, job.model, time.time())
        seconds = time.monotonic() - started
        self._summary_seconds = smoothed(self._summary_seconds, seconds)
        self._account(job, summary, record, seconds=seconds)
        return record

    async def _fitting_summary(self, job: Job) -> tuple[Summary, list[Message], int]:
        """The summary, the replacement it makes and that replacement's tokens; SummarizerError when none fits."""
        config = self._settings.compaction.summarizer
        whole = budget.whole_summary_tokens(job.limits, job.summary_tokens)
        summary = await summarize(self._model_factory(job.model, job.headers, job.summary_tokens, whole),
                                  list(job.plan.to_summarise), self._templates.asked(job.instructions),
                                  counter=self._counter,
                                  max_calls=config.max_calls, deadline=config.timeout, prefix=job.prefix,
                                  evidence_room=None,  # added below within the plan's budget, by the same code
                                  later=(*job.plan.kept_users, *job.plan.tail))
        evidence = await off_loop_if_large(text_size(job.source), gather, job.source,
                                           (*job.plan.head, *job.plan.kept_users)) if config.evidence else None
        # Fitting counts the summary's tokens a few times over: a long reply (bounded, but up to ~32 bytes a token
        # asked) is fitted in a thread, so no summariser can hold the event loop with it.
        return await off_loop_above(LARGE_REPLY, len(summary.text), self._fitted, job, summary, evidence)

    def _fitted(self, job: Job, summary: Summary, evidence: Evidence | None) -> tuple[Summary, list[Message], int]:
        messages, tokens_after = self._replacement(job, summary)
        if evidence is not None and (completed := self._with_evidence(job, summary, evidence,
                                                                      tokens_after)) is not summary:
            summary = completed
            messages, tokens_after = self._replacement(job, summary)
        if job.room_beside_tail(tokens_after) < 0 and self._counter.count_text(summary.text) > job.own_ask:
            # Longer than asked (parts kept side by side, say) and, beside the recent turns, past the window: its
            # middle goes, so the conversation goes on rather than failing every turn from here; both ends, the
            # oldest facts and the latest, stay. (The plan sized the ask to fit beside the recent turns.)
            shortened = elide_text(summary.text, job.own_ask, self._counter.count_text,
                                   self._templates.elision_marker)
            summary = replace(summary, message={**summary.message, "content": shortened}, text=shortened,
                              structured=None, strategy=f"{summary.strategy}_elided")
            messages, tokens_after = self._replacement(job, summary)
        replaced = job.plan.tokens_before - job.plan.tail_tokens
        if not job.force and job.upstream_tokens(tokens_after) >= replaced:
            # Longer than what it replaces (a short span, a long rendering): the span is kept as it is.
            longer = SummarizerError(f"the summary and what is kept with it take {job.upstream_tokens(tokens_after)} "
                                     f"tokens, not fewer than the {replaced} they would replace")
            longer.usage, longer.calls = summary.usage, summary.calls
            raise longer
        if not budget.fits_window(job.limits, job.upstream_tokens(tokens_after)):
            # What stays besides the summary leaves no room: stored, it would be spliced into every later turn
            # and summarised again; it is refused. (The tail is not counted: an oversized tool result in it is
            # elided after this.)
            too_long = SummarizerError(f"the summary and what stays before it take {tokens_after} tokens: no room "
                                       f"left in the window of {job.limits.window}")
            too_long.usage, too_long.calls = summary.usage, summary.calls
            raise too_long
        return summary, messages, tokens_after

    def _with_evidence(self, job: Job, summary: Summary, evidence: Evidence, tokens_as_written: int) -> Summary:
        """The summary with the user's words, errors, commands and files it left out, read from the client's own
        messages (not the spliced history: a value an earlier summary dropped comes back)."""
        count = self._counter.count_text
        # What the plan allots the summary, less what the model wrote, or at least a third of it whatever the
        # model wrote; for exact values also what the target leaves unused (the tail takes whole turns); and
        # never more than the window leaves beside the summary as written and the recent turns (evidence must
        # not be what pushes the retried request past the window). Context entries (files read, commands run)
        # get no share of the unused room: the next summary's input would pay for them.
        spare = job.own_tokens(job.room_beside_tail(tokens_as_written))
        room = min(max(job.own_ask - count(summary.text), job.own_ask // 3), spare)
        unused = min(job.own_tokens(job.plan.room_at_goal(job.upstream_tokens(tokens_as_written))), spare)
        return with_evidence(summary, evidence, room, count, self._templates, exact_room=unused - room)

    def _replacement(self, job: Job, summary: Summary) -> tuple[list[Message], int]:
        continuation, acknowledgement = self._fillers
        # The reply is valid text already; the evidence quotes the client's own messages, which may not be. The
        # message goes with the user's role: its closing note says the tool output quoted in it is data.
        message = {**summary.message, "content": valid_text(summary.text) + self._note_for(job.plan.to_summarise)}
        messages = replacement(job.plan, message, continuation, acknowledgement)
        return messages, sum(self._counter.count_message(m) for m in messages)

    def _count_calls(self, calls: int, usage: Mapping[str, int], result: str) -> None:
        metrics = self._metrics
        metrics.summarizer_calls.labels(result).inc(calls)
        for kind in ("prompt_tokens", "completion_tokens"):
            metrics.summarizer_tokens.labels(kind.removesuffix("_tokens")).inc(int(usage.get(kind, 0)))

    def _account(self, job: Job, summary: Summary, record: CompactedPrefix, *, seconds: float) -> None:
        self._metrics.compactions.labels(job.trigger).inc()
        self._metrics.compaction_seconds.observe(seconds)
        self._metrics.compaction_tokens.labels("before").observe(record.tokens_before)
        self._metrics.compaction_tokens.labels("after").observe(record.tokens_after)
        self._count_calls(summary.calls, summary.usage, "ok")
        log.info(json.dumps({**job.log_fields(), "event": "compaction",
                             "replacement_messages": len(record.replacement), "replaced_tokens": record.tokens_before,
                             "replacement_tokens": record.tokens_after, "summarizer_calls": summary.calls,
                             "summarizer_strategy": summary.strategy, "evidence_added": summary.evidence,
                             "corrections": [correction.as_log() for correction in summary.corrections],
                             "summarizer_prompt_tokens": summary.usage.get("prompt_tokens", 0),
                             "summarizer_completion_tokens": summary.usage.get("completion_tokens", 0),
                             "structured": summary.structured is not None, "duration_ms": round(seconds * 1000, 1)}))
        if (origin := job.origin) is not None:
            self._recorder.safely("journal_summary", lambda: self._recorder.record(summary_event(
                origin, namespace=job.namespace, trigger=job.trigger, limits=job.limits, plan=job.plan,
                record=record, source=job.source, summary=summary, ratio=job.ratio, seconds=seconds)))

    def _account_failure(self, job: Job, error: Exception, seconds: float) -> str | None:
        """The failure counted and logged, and in the journal when it is on: then its event's id."""
        calls, usage = (error.calls, error.usage) if isinstance(error, SummarizerError) else (0, {})
        self._metrics.compaction_failures.labels(job.trigger, type(error).__name__).inc()
        self._metrics.compaction_seconds.observe(seconds)
        self._count_calls(max(calls, 1), usage, "error")
        log.warning(json.dumps({**job.log_fields(), "event": "compaction_failed", "error": type(error).__name__,
                                "summarizer_calls": calls,
                                "summarizer_prompt_tokens": usage.get("prompt_tokens", 0),
                                "summarizer_completion_tokens": usage.get("completion_tokens", 0),
                                "duration_ms": round(seconds * 1000, 1)}))
        if (origin := job.origin) is not None:
            self._recorder.safely("journal_failure", lambda: self._recorder.record(failure_event(
                origin, event_id=job.failure_id, trigger=job.trigger, limits=job.limits, plan=job.plan,
                source=job.source, model=job.model, error=error, calls=calls, usage=dict(usage), seconds=seconds)))
            if self._recorder.journal is not None:
                tell_failure(error, job.failure_id)
                return job.failure_id
        return None


def prepared_namespace(namespace: str) -> str:
    """Where summaries prepared ahead are kept: beside the namespace's own, never found by `reuse`."""
    return f"{namespace}.prepared"
