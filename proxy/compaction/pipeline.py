"""One request's journey: reuse, proactive compaction, forward, detect overflow, compact, retry once."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Generic

from multidict import CIMultiDict

from proxy.compaction import glance
from proxy.compaction.ahead import Ahead
from proxy.compaction.answer_headers import AnswerHeaders
from proxy.compaction.compactor import Compactor
from proxy.compaction.conversation import Conversation
from proxy.compaction.forwarded_body import ForwardedBody
from proxy.compaction.journey import C, Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.compaction.recorder import Origin, Recorder, origin_of
from proxy.compaction.tool_stages import ToolStages
from proxy.config import TARGET_SHARE_OF_THRESHOLD, Settings
from proxy.core import budget
from proxy.core.budget import Limits
from proxy.core.calibration import Calibration
from proxy.core.elision import elide_oversized
from proxy.core.history_index import HistoryIndex
from proxy.core.tenants import namespace_for
from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage
from proxy.core.view import View
from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.dialect import Dialect
from proxy.errors import ProxyError
from proxy.headers import (
    COMPACTION,
    SHADOW,
    SHADOW_TOKENS_AFTER,
    SHADOW_TOKENS_BEFORE,
)
from proxy.metrics import Metrics
from proxy.request_context import annotate, current_request_id
from proxy.upstream.answer import Answer, attempt_answer, journey_answer
from proxy.upstream.attempt import Attempt, OpenResponses, send
from proxy.upstream.overflow import context_limit_from_error
from proxy.upstream.upstream import Upstream
from proxy.upstream.windows import ContextWindows

log = logging.getLogger("proxy.pipeline")


class Pipeline(Generic[C]):
    """The journey for one client API: its dialect says everything API-shaped, the rest is shared."""

    def __init__(self, dialect: Dialect[C], settings: Settings, upstream: Upstream, compactor: Compactor,
                 counter: TokenCounter, calibration: Calibration, windows: ContextWindows, metrics: Metrics,
                 history: HistoryIndex | None = None, count: Callable[[str], None] | None = None,
                 stages: ToolStages | None = None, recorder: Recorder | None = None,
                 bodies: BodyMemo | None = None) -> None:
        """`count` sees what compaction did for each answer (x-compaction), for a dialect's own counter; `stages`
        are the tool-result stages (without: clearing only, no pair summaries)."""
        self._settings = settings
        self._stages = stages or ToolStages(settings, counter, calibration, None)
        self._count = count
        self._dialect = dialect
        self._upstream = upstream
        self._compactor = compactor
        self._counter = counter
        self._calibration = calibration
        self._windows = windows
        self._metrics = metrics
        self._history = history or HistoryIndex(counter)
        self._bodies = bodies or BodyMemo()
        self._recorder = recorder or Recorder(None)
        self._tokens = JourneyTokens(counter, calibration, self._stages)
        self._ahead = Ahead(settings, dialect, compactor, self._stages, self._tokens)
        self._answer_headers = AnswerHeaders(settings, dialect, metrics, self._recorder, self._tokens)
        self._forwarded = ForwardedBody(dialect, self._bodies, compactor.replacements, self._tokens)
        self._first_limits: glance.Limits = {}
        self._markers = glance.markers_for(settings, dialect.quick_markers, dialect.uncounted_markers,
                                           dialect.alone_markers)

    def parse(self, body: bytes, headers: Mapping[str, str], query: str) -> C:
        """The client's request as its dialect reads it (BadRequest when it cannot)."""
        return self._dialect.parse(body, headers, query, self._read(body), self._bodies)

    def _read(self, body: bytes) -> dict[str, Any]:
        return self._bodies.read(body, self._dialect.history_key)

    def glanced(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """The request's model when it can be relayed as it came, unread (compaction.glance), else None."""
        started = time.perf_counter()
        # A large body is read as the whole way would read it (kept for its parse, should the glance not do).
        read = self._read if self._bodies.remembers(body) else None
        model = glance.judged(self._settings, self._windows.smallest_stated, self._markers, body,
                              headers, read, self._first_limits)
        if model is not None:  # the proxy's own time before forwarding, as the whole way's is
            self._metrics.overhead_seconds.observe(time.perf_counter() - started)
        return model

    def relay(self, body: bytes, headers: Mapping[str, str], query: str, model: str) -> _Relay[C]:
        """`async with` it: a glanced request relayed as it came (a live stream open until the block is left); an
        overflow answer takes the whole way: read, compact, retry."""
        return _Relay(self, body, headers, query, model)

    async def _relayed(self, stack: OpenResponses, body: bytes, headers: Mapping[str, str], query: str,
                       model: str) -> Answer:
        try:
            attempt = await send(self._upstream, stack, path=self._dialect.path, reader=self._dialect, query=query,
                                 headers=headers, body=body, usage=False)  # relayed: nothing learns from it
            if attempt.overflow and (call := self._parsed_or_none(body, headers, query)) is not None:
                return await self._overflowed(call, attempt, stack)
        except BaseException:
            stack.close()  # no block will be left: what was opened for the answer closes now
            raise
        if self._count is not None:
            self._count("none")
        annotate(model=model, upstream_status=attempt.status)
        return attempt_answer(self._upstream, attempt, {COMPACTION: "none"})

    def _parsed_or_none(self, body: bytes, headers: Mapping[str, str], query: str) -> C | None:
        try:
            return self.parse(body, headers, query)
        except ProxyError:
            return None  # a body the proxy cannot read: the upstream's answer stands

    async def _overflowed(self, call: C, attempt: Attempt, stack: OpenResponses) -> Answer:
        """A glanced request the upstream found too long after all (its window was not what was stated)."""
        call, view = self._edited(call)
        if view is None:
            return self._finish(call, attempt, self._answer_headers.untouched(call, attempt), hide_usage=False)
        self._metrics.labelled(self._metrics.overflow_errors, "first").inc()
        journey = await self._begin(call, view)
        await self._stages.shape(journey)
        attempt = await self._react(journey, attempt, stack)
        return self._finish(call, attempt, self._answer_headers.of(journey), hide_usage=self._inject_usage(call),
                            journey=journey)

    @asynccontextmanager
    async def answer(self, call: C) -> AsyncIterator[Answer]:
        """The answer to send; a live upstream stream stays open until the caller leaves the block."""
        async with OpenResponses() as stack:
            call, view = self._edited(call)
            if view is None:
                attempt = await self._forward(call, stack, call.body)
                yield self._finish(call, attempt, self._answer_headers.untouched(call, attempt), hide_usage=False)
                return
            if self._mode(call) == "shadow":
                yield await self._shadow(call, view, stack)
                return
            yield await self._journey(call, view, stack)

    async def compacted(self, call: C) -> Journey[C] | None:
        """The request's conversation compacted now, as the journey would, whatever its size (a client asking for
        it: POST /responses/compact, a compaction trigger); None when the proxy may not compact it (its mode, its
        model or its dialect says so), and the request is the upstream's to answer."""
        call, view = self._edited(call)
        if view is None:
            return None
        journey = await self._begin(call, view)
        if journey.conversation.record is None:
            await self._compact(journey, "requested", force=True)
        return journey

    def compaction_answer(self, journey: Journey[C]) -> Answer:
        """The answer that is the compaction alone (asked for, or a turn paused after one), in the client's API."""
        conversation = journey.conversation
        body, content_type = self._dialect.compaction_answer(journey.call, journey.view, conversation.messages,
                                                             conversation.synthetic, self.summary_usage(journey))
        headers = CIMultiDict({"Content-Type": content_type, **self._answer_headers.of(journey)})
        return Answer(200, headers, body=body)

    def edited(self, call: C) -> C:
        """The request with the edits its client asked of its context applied to what is forwarded (Anthropic's
        clearing edits), whether or not the proxy may compact it: they cost no model call."""
        model = call.model
        return self._dialect.edited(call, lambda: self.estimate(call),
                                    lambda value: self._calibration.adjust(model, self._counter.count_value(value)))

    def _edited(self, call: C) -> tuple[C, View | None]:
        """The request edited as its client asked, and the history the journey may compact."""
        edited = self.edited(call)
        return edited, self._history_of(edited)

    def estimate(self, call: C) -> int:
        """The request's prompt as sent, in the upstream's tokens as far as calibration knows them (a count the
        client asked for: POST /messages/count_tokens on an upstream without one)."""
        view = self._dialect.history(call)
        raw = sum(self._counter.count_each(view.messages)) + self._dialect.overhead(call, self._counter) \
            if view is not None else self._counter.count_text(call.body.decode("utf-8", "replace"))
        return self._calibration.adjust(call.model, raw)

    def summary_usage(self, journey: Journey[C]) -> Usage:
        """What a requested compaction reports: the conversation's tokens before, the summary's after."""
        record = journey.conversation.record
        return Usage(self._tokens.original(journey), record.tokens_after if record else 0)

    def _mode(self, call: C) -> str:
        return call.mode or self._settings.compaction.mode

    async def close(self) -> None:
        await self._ahead.close()

    def _history_of(self, call: C) -> View | None:
        """The history the journey may compact, or None: compaction off, or the request not compactable."""
        settings = self._settings
        if (not settings.compaction.enabled or self._mode(call) == "off"
                or settings.model_for(call.model).manages_own_context):
            return None
        return self._dialect.history(call, self._bodies)

    async def _forward(self, call: C, stack: OpenResponses, body: bytes) -> Attempt:
        return await send(self._upstream, stack, path=self._dialect.path, reader=self._dialect, query=call.query,
                          headers=call.headers, body=body)

    def _limits(self, call: C) -> Limits:
        config = self._settings.compaction
        limits = Limits(window=self._windows.window(call.model), threshold=config.threshold if config.proactive else 0,
                        target=config.target, reserve=call.reserved_output(config.reserved_output_tokens),
                        tail_share=config.tail_budget, instruction_share=config.instruction_budget,
                        max_summary_tokens=config.summarizer.max_output_tokens)
        return budget.with_client_threshold(limits, call.compact_threshold, TARGET_SHARE_OF_THRESHOLD)

    async def _begin(self, call: C, view: View) -> Journey[C]:
        """The journey's start: the history read (chain, counts), a stored summary spliced in, the window known."""
        namespace = namespace_for(call.headers, self._settings.server.tenant_header, call.model)
        # A history the memo read (a chat one, or the items another dialect's view was read from): its messages'
        # keys come with it.
        history = await self._history.read_off_loop(view.messages, namespace,
                                                    self._bodies.keys_of_view(view, self._dialect.name))
        conversation = await self._compactor.reuse(view.messages, history.chain, namespace)
        # Windows the upstream states are looked up before planning (once per upstream, then cached), so the
        # summariser client built later, background ones included, knows its window without waiting.
        await self._windows.prepare(call.model, self._settings.compaction.summarizer.model or call.model,
                                    headers=call.headers)
        return Journey(call, view, conversation, self._limits(call), history, self._raw_overhead(call),
                       trigger="reused" if conversation.record else "none", origin=self._origin(call, conversation))

    def _origin(self, call: C, conversation: Conversation) -> Origin | None:
        """The request as the journal names it; None without a journal."""
        if not self._recorder.enabled:
            return None
        return origin_of(call.headers, self._settings.server.tenant_header, conversation.backoff_key,
                         self._dialect.name, call.model or "")

    async def _journey(self, call: C, view: View, stack: OpenResponses) -> Answer:
        started = time.perf_counter()
        journey = await self._begin(call, view)
        await self._stages.shape(journey)
        summarising = 0.0
        forced = self._mode(call) == "force"
        if forced or budget.over_threshold(journey.limits, self._tokens.estimate(journey)):
            compacting = time.perf_counter()
            if not forced:
                await self._ahead.splice(journey)
            if forced or budget.over_threshold(journey.limits, self._tokens.estimate(journey)):
                await self._compact(journey, "forced" if forced else "proactive")
            summarising = time.perf_counter() - compacting
            if call.pauses_after_compaction and journey.conversation.record is not None:
                return self.compaction_answer(journey)  # the client asked to stop there: nothing is sampled
        # The proxy's own time before forwarding (fingerprint, reuse lookup, planning), a summary's excluded.
        self._metrics.overhead_seconds.observe(time.perf_counter() - started - summarising)
        attempt = await self._send(journey, stack)
        if attempt.overflow:
            self._metrics.labelled(self._metrics.overflow_errors, "first").inc()
        near = attempt.empty_stream and budget.near_window(journey.limits, self._tokens.estimate(journey))
        if attempt.overflow or near:
            attempt = await self._react(journey, attempt, stack)
        return self._finish(call, attempt, self._answer_headers.of(journey), hide_usage=self._inject_usage(call),
                            journey=journey)

    async def _shadow(self, call: C, view: View, stack: OpenResponses) -> Answer:
        """Decide as the real journey would, report it, and forward the request exactly as the client sent it."""
        journey = await self._begin(call, view)
        conversation = journey.conversation
        before = self._tokens.estimate(journey)
        decision = "reused" if conversation.record else "none"
        if budget.over_threshold(journey.limits, before):
            decision = "proactive"
        attempt = await self._forward(call, stack, call.body)
        if attempt.overflow:
            self._metrics.labelled(self._metrics.overflow_errors, "first").inc()
            decision = "reactive"
            journey.limits = replace(journey.limits, window=min(journey.limits.window, before + journey.limits.reserve))
        headers = {COMPACTION: "none", SHADOW: decision}
        plan = self._compactor.plan(conversation, journey.limits, model=call.model,
                                    overhead=self._tokens.overhead(journey)) \
            if decision in ("proactive", "reactive") else None
        fillers = self._compactor.filler_tokens(conversation.messages)
        if plan is not None and plan.worthwhile(fillers):
            saved = plan.span_tokens - plan.kept_system_tokens - plan.kept_user_tokens - plan.summary_tokens - fillers
            headers[SHADOW_TOKENS_BEFORE] = str(before)
            headers[SHADOW_TOKENS_AFTER] = str(before - saved)
            self._metrics.shadow_saved_tokens.inc(saved)
        self._metrics.labelled(self._metrics.shadow_decisions, decision).inc()
        if (origin := journey.origin) is not None:
            self._recorder.safely("journal_shadow", lambda: self._recorder.shadow(
                origin, headers, limits=journey.limits, tokens_before=before))
        log.info(json.dumps({"event": "compaction_shadow", "request_id": current_request_id(), "decision": decision,
                             "tokens_before": before, **(plan.as_log() if plan is not None else {})}))
        return self._finish(call, attempt, headers, hide_usage=False)

    async def _react(self, journey: Journey[C], first: Attempt, stack: OpenResponses) -> Attempt:
        """Compact and retry exactly once; the first answer stands if that does not produce a better one."""
        if first.body is not None and self._windows.learn(journey.call.model, context_limit_from_error(first.body)):
            journey.limits = self._limits(journey.call)
        if journey.failed:
            return first
        before = self._tokens.estimate(journey)
        # The upstream just refused this prompt: whatever window is known, the real one is smaller than the
        # request, so plan within that.
        journey.limits = replace(journey.limits, window=min(journey.limits.window, before + journey.limits.reserve))
        if not await self._compact(journey, "reactive") and self._tokens.estimate(journey) >= before:
            journey.failed = True  # nothing could make the request smaller: the upstream's answer stands
            return first
        try:
            retry = await self._send(journey, stack)
        except ProxyError as error:
            log.warning("retry after compaction failed: %s", error.message)
            retry = None
        if retry is not None and retry.overflow:
            self._metrics.labelled(self._metrics.overflow_errors, "retry").inc()
        if retry is None or retry.overflow or retry.empty_stream:
            journey.failed = True
            return first
        journey.failed = False
        return retry

    async def _compact(self, journey: Journey[C], trigger: str, *, force: bool = False) -> bool:
        """Summarise, then elide what still does not fit (a huge tool result); True when a summary was applied.

        A summary that failed or is backed off marks the journey failed: it is not tried again for this request.
        """
        if not journey.tokens_before:
            journey.tokens_before = self._tokens.original(journey)
        outcome = await self._compactor.compact(journey.conversation, journey.limits, model=journey.call.model,
                                                trigger=trigger, headers=journey.call.headers,
                                                overhead=self._tokens.overhead(journey),
                                                force=force or self._mode(journey.call) == "force",
                                                tools=self._dialect.tools(journey.call),
                                                instructions=journey.call.summary_instructions,
                                                origin=journey.origin)
        if outcome.record is not None:
            journey.conversation = Conversation(journey.conversation.original, journey.conversation.chain,
                                                journey.conversation.namespace, outcome.record)
        else:
            journey.reason = outcome.reason
            journey.failed = journey.failed or outcome.reason in ("failed", "backoff")
            journey.failure = outcome.failure or journey.failure
        await self._stages.shape(journey)
        self._elide(journey)
        if outcome.record is not None or journey.elided:
            journey.trigger = trigger
        return outcome.record is not None

    def _elide(self, journey: Journey[C]) -> None:
        """Shrink what still does not fit (a huge tool result in the tail); the client's copy stays whole."""
        messages = self._stages.base(journey)
        elided = elide_oversized(messages, journey.conversation.replaced, self._counter.count_message,
                                 self._counter.count_text, journey.limits, self._compactor.elision_marker)
        journey.forwarded = elided.messages
        journey.elided = elided.count

    def _raw_overhead(self, call: C) -> int:
        return self._dialect.overhead(call, self._counter)

    def _inject_usage(self, call: C) -> bool:
        return call.stream and self._settings.compaction.background and not self._dialect.asks_usage(call)

    async def _send(self, journey: Journey[C], stack: OpenResponses) -> Attempt:
        body = self._forwarded.of(journey, ask_usage=self._inject_usage(journey.call))
        return await self._forward(journey.call, stack, body)

    def _finish(self, call: C, attempt: Attempt, headers: dict[str, str], *, hide_usage: bool,
                journey: Journey[C] | None = None) -> Answer:
        if self._count is not None:
            self._count(headers[COMPACTION])
        annotate(model=call.model, upstream_status=attempt.status)
        learn = journey is not None and attempt.ok

        def on_done(usage: Usage | None) -> None:
            assert journey is not None
            self._learn(journey, usage)

        announce = None if not attempt.ok else self._announced(journey) if journey is not None else \
            self._dialect.announced(call, View([]), None, frozenset())  # the edits applied, nothing compacted
        return journey_answer(self._upstream, attempt, headers,
                              tap=self._dialect.tap(call, hide_usage=hide_usage, announce=announce),
                              on_done=on_done if learn else None,
                              reshape=lambda body: self._dialect.answer_body(call, attempt.status, body, announce))

    def _announced(self, journey: Journey[C]) -> Any:
        """What the answer tells a client that asked to hear of its context management; the conversation whole,
        not elided: a client may drop what a compaction item stands for, so it must hold every word of it."""
        conversation = journey.conversation
        history = conversation.messages if conversation.record is not None else None
        return self._dialect.announced(journey.call, journey.view, history, conversation.synthetic,
                                       failed=journey.failed)

    def _learn(self, journey: Journey[C], usage: Usage | None) -> None:
        """After a good answer: calibrate the estimate, and start the next summary ahead if usage is high."""
        if usage is None or not usage.input_tokens:
            return
        self._calibration.observe(journey.call.model, self._tokens.raw_estimate(journey), usage.input_tokens)
        self._ahead.after_answer(journey, usage.input_tokens, usage.output_tokens or 0)
        self._stages.after_answer(journey, journey.call.headers)


class _Relay(Generic[C]):
    """Pipeline.relay's context. A class, not a generator-based context manager: every glanced request enters
    one, and each frame on the request's await chain is passed through every time its task resumes."""

    __slots__ = ("_body", "_headers", "_model", "_pipeline", "_query", "_stack")

    def __init__(self, pipeline: Pipeline[C], body: bytes, headers: Mapping[str, str], query: str,
                 model: str) -> None:
        self._pipeline = pipeline
        self._body = body
        self._headers = headers
        self._query = query
        self._model = model
        self._stack = OpenResponses()

    def __aenter__(self) -> Coroutine[Any, Any, Answer]:
        return self._pipeline._relayed(self._stack, self._body, self._headers, self._query, self._model)

    async def __aexit__(self, *exc_info: Any) -> None:
        self._stack.close()
