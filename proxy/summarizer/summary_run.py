"""One summary's requests to the summariser model: their shapes, the errors they end in, what they cost."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Protocol

from proxy.core import budget
from proxy.core.messages import Message, content_text, is_user, valid_text
from proxy.core.tokens import TokenCounter
from proxy.offload import LARGE_REPLY, off_loop_above, off_loop_if_large
from proxy.summarizer.summary import StructuredSummary, rendered_text
from proxy.summarizer.templates import Templates

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


class SummarizerError(Exception):
    """The summary could not be produced; `usage` and `calls` say what the attempt cost."""

    usage: Mapping[str, int] = MappingProxyType({})  # set per instance by summarize()
    calls: int = 0


class SummarizerOverflow(SummarizerError):
    """The summariser's own request did not fit its context window (raised by the model adapter)."""


class SummaryTruncated(SummarizerError):
    """The reply was cut off by the output limit (`finish_reason: length`): it is not a summary."""


class ChatModel(Protocol):
    """A chat model for summaries. It may also carry `context_window: int | None` to plan chunks by tokens,
    `reply_parsed(parsed: bool)`, told after each accepted reply whether it parsed as a structured summary, and
    `limited(tokens: int) -> ChatModel`, the same model asked for at most `tokens` (each part of a history in parts)."""

    async def complete(self, system: str | None, messages: list[dict[str, Any]],
                       tools: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(assistant message, usage); the message carries the choice's `finish_reason` when there was one.

        `system` None sends `messages` as they are; `tools` (the conversation's, prefix layout only) are sent
        with `tool_choice: "none"`, so the request renders like the conversation's own and asks for text.
        """
        ...


@dataclass(frozen=True)
class ConversationPrefix:
    """The conversation as the upstream last saw it, up to the end of what is summarised, with its tools.

    A summariser request made of these messages plus one instruction shares its whole prefix with the requests
    the upstream has just answered, so a server with prefix caching (llama.cpp's slot, vLLM, OpenAI) does not
    evaluate the history again.
    """

    messages: tuple[Message, ...]
    tools: Any = None
    acknowledgement: str = ""  # the assistant filler put between a last user message and the instruction


@cache
def _default_counter() -> TokenCounter:
    return TokenCounter()


class SummaryRun:
    """One summary (a summarize() call): the model, what it has cost so far, and the single request shape it sends."""

    def __init__(self, model: ChatModel, templates: Templates, counter: TokenCounter | None,
                 max_calls: int = 0) -> None:
        self.model = model
        self.own_model = model  # the summary's own ask; `model` may ask for a part's share (asking())
        self.templates = templates
        self._counter = counter
        self._max_calls = max_calls
        self.calls = 0
        self.usage = dict.fromkeys(USAGE_KEYS, 0)
        self._parsed: tuple[str, StructuredSummary | None] | None = None  # the last reply parsed, and what it gave

    @property
    def counter(self) -> TokenCounter:
        # Loaded only when needed: a model that reports usage and no window never tokenises anything.
        if self._counter is None:
            self._counter = _default_counter()
        return self._counter

    @property
    def window(self) -> int | None:
        return _positive(getattr(self.model, "context_window", None))

    @property
    def limit(self) -> int | None:
        """The output the model is asked for, stated in the prompt."""
        return _positive(getattr(self.model, "max_output_tokens", None))

    async def ask(self, transcript: str, instruction: str) -> str:
        """One transcript-layout request (no tools); the reply text once it is accepted as a summary."""
        def build(limit: int | None) -> list[Message]:
            return [{"role": "system", "content": self.templates.compaction_prompt(transcript, window=self.window,
                                                                                   limit=limit)},
                    {"role": "user", "content": instruction}]
        sent = await self._stating_its_limit(build)
        return await self._send(str(sent[0]["content"]), sent[1:])

    async def ask_after(self, prefix: ConversationPrefix) -> str:
        """One prefix-layout request: the conversation's messages as they were sent, then the instruction."""
        messages = list(prefix.messages)
        if messages and is_user(messages[-1]) and prefix.acknowledgement:
            messages.append({"role": "assistant", "content": prefix.acknowledgement})  # roles keep alternating

        def build(limit: int | None) -> list[Message]:
            return [*messages, {"role": "user", "content": self.templates.compaction_request(window=self.window,
                                                                                             limit=limit)}]
        return await self._send(None, await self._stating_its_limit(build), prefix.tools)

    @contextmanager
    def asking(self, tokens: int | None) -> Iterator[None]:
        """Within the block, requests ask for at most `tokens` of output; None (or a model that cannot be
        limited): the summary's own ask."""
        limited = getattr(self.own_model, "limited", None)
        before = self.model
        self.model = limited(tokens) if tokens is not None and callable(limited) else self.own_model
        try:
            yield
        finally:
            self.model = before

    @property
    def limited(self) -> bool:
        """Whether requests now ask for less than the summary's own ask."""
        return self.model is not self.own_model

    async def _stating_its_limit(self, build: Callable[[int | None], list[Message]]) -> list[Message]:
        """The request built to state the output it will get: the ask, or less when its prompt leaves less (an
        ask beyond the part that must fit whole gives way, before the input loses anything). A model told more
        than it gets runs past its limit and is cut off."""
        sent = build(self.limit)
        fit = getattr(self.model, "output_limit", None)
        if not (self.limit and callable(fit)):
            return sent
        try:
            # Counting a long prompt (a transcript, partial summaries to merge) is the costly part.
            actual = await off_loop_if_large(sum(len(content_text(m.get("content"))) for m in sent), fit, sent)
        except SummarizerOverflow:
            return sent  # sending it reports the overflow, as for any request
        return build(actual) if isinstance(actual, int) and 0 < actual < self.limit else sent

    async def _send(self, system: str | None, messages: list[Message], tools: Any = None) -> str:
        try:
            return await self._send_once(system, messages, tools)
        except SummaryTruncated:
            # A model that can be constrained is asked once more under a schema bounded to its output limit.
            retry = getattr(self.model, "retry_constrained", None)
            if not (callable(retry) and retry()):
                raise
        return await self._send_once(system, messages, tools)

    async def _send_once(self, system: str | None, messages: list[Message], tools: Any = None) -> str:
        if self._max_calls and self.calls >= self._max_calls:
            raise SummarizerError(f"the summary needs more than {self._max_calls} summariser calls")
        self.calls += 1
        try:
            reply, usage = await (self.model.complete(system, messages, tools) if tools is not None else
                                  self.model.complete(system, messages))
        except SummarizerError:
            raise
        except Exception as error:
            raise SummarizerError(f"summariser request failed: {type(error).__name__}: {error}") from error
        if not isinstance(reply, dict):
            raise SummarizerError(f"summariser reply is not a chat message: {type(reply).__name__}")
        # A lone surrogate (a `\ud800` escape in the answer's JSON) would make the summary unstorable and unsendable.
        text = valid_text(content_text(reply.get("content")))
        self._add_usage(usage, system, messages, text)  # a rejected reply was still billed
        if reply.get("finish_reason") == "length":
            await self._report_parse(None)  # a reply that ran to its limit failed to parse too: it was never whole
            raise SummaryTruncated("summariser reply was cut off by the output limit")
        if not text.strip():
            raise SummarizerError("summariser reply is empty")
        await self._report_parse(text)
        return text

    async def _report_parse(self, text: str | None) -> None:
        # A model that may ask for structured output (proxy.model_client) learns from whether its replies parse.
        report = getattr(self.model, "reply_parsed", None)
        if callable(report):
            report(text is not None and await self.parse(text) is not None)

    async def parse(self, reply: str) -> StructuredSummary | None:
        """The reply's structured summary, parsed once however often it is asked for, in a thread when large."""
        if self._parsed is None or self._parsed[0] is not reply:
            self._parsed = (reply, await off_loop_above(LARGE_REPLY, len(reply), StructuredSummary.parse, reply))
        return self._parsed[1]

    async def text_of(self, reply: str) -> str:
        """The reply rendered as a summary, or verbatim when it does not parse or render (see summary_text)."""
        structured = await self.parse(reply)
        if structured is None:
            return reply
        rendered = await off_loop_above(LARGE_REPLY, len(reply), rendered_text, structured, self.templates)
        return rendered if rendered is not None else reply

    def _add_usage(self, usage: Any, system: str | None, messages: list[Message], text: str) -> None:
        reported = usage if isinstance(usage, dict) else {}
        prompt = _tokens(reported.get("prompt_tokens"))
        if prompt is None:
            framing: list[Message] = [] if system is None else [{"role": "system", "content": system}]
            prompt = self.counter.count_messages([*framing, *messages])
        completion = _tokens(reported.get("completion_tokens"))
        if completion is None:
            completion = self.counter.count_text(text)
        total = _tokens(reported.get("total_tokens"))
        for key, value in zip(USAGE_KEYS, (prompt, completion, prompt + completion if total is None else total),
                              strict=True):
            self.usage[key] += value

    def input_room(self, instruction: str) -> int | None:
        """Tokens of transcript a request with `instruction` can carry; None when the window is unknown."""
        window = self.window
        if window is None:
            return None
        framing = self.counter.count_messages([{"role": "system",
                                                "content": self.templates.compaction_prompt("", window=window,
                                                                                            limit=self.limit)},
                                               {"role": "user", "content": instruction}])
        return budget.summarizer_input_budget(window, framing, getattr(self.model, "max_output_tokens", window))

    def record_sizes(self, records: list[str]) -> list[int]:
        """Each transcript record's tokens, with its separator: counted once, planned by as often as asks change."""
        return [self.counter.count_text(record) + 1 for record in records]

    def token_groups(self, sizes: list[int], instruction: str) -> list[slice]:
        """Consecutive records (by `record_sizes`) grouped to fit a known window; one group when it is unknown."""
        allowed = self.input_room(instruction)
        if allowed is None or allowed <= 0:  # unknown or too small to plan by: halving on overflow decides
            return [slice(0, len(sizes))]
        return _pack(sizes, allowed)


def _pack(sizes: list[int], budget: int) -> list[slice]:
    """Greedy consecutive groups within `budget`; a record larger than the budget gets a group of its own."""
    groups: list[slice] = []
    start, used = 0, 0
    for index, size in enumerate(sizes):
        if index > start and used + size > budget:
            groups.append(slice(start, index))
            start, used = index, 0
        used += size
    if sizes:
        groups.append(slice(start, len(sizes)))
    return groups


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _tokens(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
