"""One chat completion's journey: reuse, proactive compaction, forward, detect overflow, compact, retry once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from multidict import CIMultiDict

from proxy.attempt import Attempt, send
from proxy.compaction import Message
from proxy.compactor import Compactor, Conversation
from proxy.config import Settings
from proxy.errors import BadRequest, ProxyError
from proxy.fingerprint import hash_chain, namespace_for
from proxy.metrics import Metrics
from proxy.overflow import context_limit_from_error
from proxy.store import SummaryRecord
from proxy.streaming import UsageTap
from proxy.tokens import Calibration, TokenCounter
from proxy.upstream import Upstream
from proxy.windows import ContextWindows

log = logging.getLogger(__name__)

MODE_HEADER = "x-compaction-mode"
MODES = ("off", "auto", "force")
# Request fields through which a provider manages the context itself; such requests are left alone.
SELF_MANAGED_FIELDS = ("context_management", "truncation", "transforms")
LARGE_BODY_BYTES = 256 * 1024


def encode_json(payload: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(payload)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(payload, ensure_ascii=False).encode()


@dataclass(frozen=True)
class ChatCall:
    """A parsed chat-completion request, as the client sent it."""

    body: bytes
    payload: dict[str, Any]
    headers: Mapping[str, str]
    query: str
    mode: str

    @classmethod
    def parse(cls, body: bytes, headers: Mapping[str, str], query: str) -> ChatCall:
        try:
            payload = json.loads(body)
        except ValueError as error:
            raise BadRequest(f"request body is not valid JSON: {error}") from None
        if not isinstance(payload, dict):
            raise BadRequest("request body must be a JSON object")
        mode = headers.get(MODE_HEADER, "auto").strip().lower()
        if mode not in MODES:
            raise BadRequest(f"{MODE_HEADER} must be one of {', '.join(MODES)}", param=MODE_HEADER)
        forwarded = CIMultiDict(headers)
        forwarded.popall(MODE_HEADER, None)
        return cls(body, payload, forwarded, query, mode)

    @property
    def model(self) -> str:
        return str(self.payload.get("model") or "")

    @property
    def messages(self) -> list[Message] | None:
        messages = self.payload.get("messages")
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
            return messages
        return None

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    def reserved_output(self, default: int) -> int:
        for key in ("max_completion_tokens", "max_tokens"):
            value = self.payload.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return default


@dataclass
class Answer:
    """What the handler sends: a buffered body, or a live upstream stream with its held-back head."""

    attempt: Attempt
    compaction: dict[str, str]
    tap: UsageTap | None = None
    on_done: Callable[[dict[str, Any] | None], None] | None = None

    def finished(self) -> None:
        if self.on_done is not None:
            self.on_done(self.tap.usage if self.tap is not None else self.attempt.usage())


@dataclass
class Journey:
    """The state of one request as it moves through the pipeline."""

    call: ChatCall
    conversation: Conversation
    window: int
    trigger: str = "none"
    failed: bool = False
    tokens_before: int = 0


class ChatPipeline:
    def __init__(self, settings: Settings, upstream: Upstream, compactor: Compactor, counter: TokenCounter,
                 calibration: Calibration, windows: ContextWindows, metrics: Metrics) -> None:
        self._settings = settings
        self._upstream = upstream
        self._compactor = compactor
        self._counter = counter
        self._calibration = calibration
        self._windows = windows
        self._metrics = metrics
        self._background: set[asyncio.Task[Any]] = set()

    @asynccontextmanager
    async def answer(self, call: ChatCall) -> AsyncIterator[Answer]:
        """The answer to send; a live upstream stream stays open until the caller leaves the block."""
        async with AsyncExitStack() as stack:
            if not self._compactable(call):
                attempt = await send(self._upstream, stack, query=call.query, headers=call.headers, body=call.body)
                yield self._finish(call, attempt, {"x-compaction": "none"}, hide_usage=False)
                return
            yield await self._journey(call, stack)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _compactable(self, call: ChatCall) -> bool:
        settings = self._settings
        return (settings.compaction.enabled and call.mode != "off" and call.messages is not None
                and not settings.model_for(call.model).manages_own_context
                and not any(name in call.payload for name in SELF_MANAGED_FIELDS))

    async def _journey(self, call: ChatCall, stack: AsyncExitStack) -> Answer:
        assert call.messages is not None
        if len(call.body) > LARGE_BODY_BYTES:
            # Tokenising a large history is CPU work: done off the event loop, it fills the per-message cache
            # that every estimate below reads.
            await asyncio.to_thread(self._counter.count_request, call.payload)
        namespace = namespace_for(call.headers, self._settings.server.tenant_header)
        conversation = await self._compactor.reuse(call.messages, hash_chain(call.messages, namespace), namespace)
        journey = Journey(call, conversation, self._windows.window(call.model),
                          trigger="reused" if conversation.record else "none")
        if call.mode == "force" or self._over_threshold(journey):
            await self._compact(journey, "proactive")
        attempt = await self._send(journey, stack)
        if attempt.overflow or (attempt.empty_stream and self._near_window(journey)):
            attempt = await self._react(journey, attempt, stack)
        return self._finish(call, attempt, self._headers(journey), hide_usage=self._inject_usage(call),
                            journey=journey)

    async def _react(self, journey: Journey, first: Attempt, stack: AsyncExitStack) -> Attempt:
        """Compact and retry exactly once; the first answer stands if that does not produce a better one."""
        if first.body is not None:
            self._windows.learn(journey.call.model, context_limit_from_error(first.body))
            journey.window = self._windows.window(journey.call.model)
        if journey.failed or not await self._compact(journey, "reactive"):
            journey.failed = True
            return first
        try:
            retry = await self._send(journey, stack)
        except ProxyError as error:
            log.warning("retry after compaction failed: %s", error.message)
            retry = None
        if retry is None or retry.overflow or retry.empty_stream:
            journey.failed = True
            return first
        return retry

    async def _compact(self, journey: Journey, trigger: str) -> bool:
        try:
            record = await self._compactor.compact(journey.conversation, model=journey.call.model,
                                                      window=journey.window, trigger=trigger,
                                                      headers=journey.call.headers)
        except Exception as error:
            log.warning("compaction failed (%s): %s", trigger, error)
            journey.failed = True
            return False
        if record is None:
            return False
        self._apply(journey, record, trigger)
        return True

    def _apply(self, journey: Journey, record: SummaryRecord, trigger: str) -> None:
        if not journey.tokens_before:
            journey.tokens_before = self._estimate(journey.call, list(journey.conversation.original))
        journey.conversation = Conversation(journey.conversation.original, journey.conversation.chain,
                                            journey.conversation.namespace, record)
        journey.trigger = trigger

    def _estimate(self, call: ChatCall, messages: list[Message]) -> int:
        raw = self._counter.count_request({**call.payload, "messages": messages})
        return self._calibration.adjust(call.model, raw)

    def _over_threshold(self, journey: Journey) -> bool:
        config = self._settings.compaction
        if not config.proactive:
            return False
        needed = self._estimate(journey.call, journey.conversation.messages) \
            + journey.call.reserved_output(config.reserved_output_tokens)
        return needed > config.threshold * journey.window

    def _near_window(self, journey: Journey) -> bool:
        estimate = self._estimate(journey.call, journey.conversation.messages)
        return estimate > self._settings.compaction.target * journey.window

    def _inject_usage(self, call: ChatCall) -> bool:
        options = call.payload.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        return call.stream and self._settings.compaction.background and not asked

    async def _send(self, journey: Journey, stack: AsyncExitStack) -> Attempt:
        call = journey.call
        body = call.body
        inject_usage = self._inject_usage(call)
        if journey.conversation.record is not None or inject_usage:
            payload = {**call.payload, "messages": journey.conversation.messages}
            if inject_usage:
                options = call.payload.get("stream_options")
                payload["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                             "include_usage": True}
            body = encode_json(payload)
        return await send(self._upstream, stack, query=call.query, headers=call.headers, body=body)

    def _headers(self, journey: Journey) -> dict[str, str]:
        headers = {"x-compaction": "failed" if journey.failed else journey.trigger}
        if journey.conversation.record is not None:
            before = journey.tokens_before or self._estimate(journey.call, list(journey.conversation.original))
            headers["x-compaction-tokens-before"] = str(before)
            headers["x-compaction-tokens-after"] = str(
                self._estimate(journey.call, journey.conversation.messages))
        return headers

    def _finish(self, call: ChatCall, attempt: Attempt, headers: dict[str, str], *, hide_usage: bool,
                journey: Journey | None = None) -> Answer:
        tap = UsageTap(hide_usage_chunk=hide_usage) if attempt.response is not None else None
        if tap is not None:
            attempt.head = tap.feed(attempt.head)
        self._metrics.chat_requests.labels(headers["x-compaction"]).inc()
        if journey is None or not attempt.ok:
            return Answer(attempt, headers, tap)
        return Answer(attempt, headers, tap, on_done=lambda usage: self._learn(journey, usage))

    def _learn(self, journey: Journey, usage: dict[str, Any] | None) -> None:
        """After a good answer: calibrate the estimate, and start the next summary early if usage is high."""
        prompt_tokens = (usage or {}).get("prompt_tokens")
        if not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
            return
        raw = self._counter.count_request({**journey.call.payload, "messages": journey.conversation.messages})
        self._calibration.observe(journey.call.model, raw, prompt_tokens)
        config = self._settings.compaction
        # The next turn resends this prompt and reply, then reserves output again: if that will not fit under
        # the threshold, build its summary now so the next request finds it ready.
        next_turn = prompt_tokens + int((usage or {}).get("completion_tokens") or 0) \
            + self._last_user_tokens(journey) + journey.call.reserved_output(config.reserved_output_tokens)
        if config.background and config.proactive and next_turn > config.threshold * journey.window:
            self._start_background(journey)

    def _start_background(self, journey: Journey) -> None:
        try:
            flight = self._compactor.begin(journey.conversation, model=journey.call.model, window=journey.window,
                                           trigger="background", headers=journey.call.headers)
        except Exception:
            log.warning("could not plan a background summary", exc_info=True)
            return
        if flight is not None:
            task = flight[0]
            self._background.add(task)
            task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background summary failed: %s", task.exception())

    def _last_user_tokens(self, journey: Journey) -> int:
        """A stand-in for the size of the next user message: the size of the last one."""
        messages = journey.conversation.messages
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        return self._counter.count_message(last_user) if last_user else 0
