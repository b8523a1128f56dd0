"""The summariser: one request for a summary (the conversation's own prefix, or a transcript), a tool-result
removal ladder on overflow, then chunk-and-merge."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from proxy import budget
from proxy.elision import elide_text
from proxy.messages import Message, content_text, is_user, with_text
from proxy.offload import off_loop_if_large
from proxy.result_removal import removal_ladder
from proxy.summary import StructuredSummary, summary_text
from proxy.templates import Templates, default_templates
from proxy.tokens import TokenCounter
from proxy.transcript import format_message_for_compacting, format_transcript

Item = TypeVar("Item")

NO_CALL_LIMIT = 0  # the library default; the proxy passes `compaction.summarizer.max_calls`
MAX_SPLIT_DEPTH = 8  # halvings of one stretch of history: at most 2**8 parts before giving up
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
PARTS_SEPARATOR = "\n\n"  # between partial summaries that could not be merged into one
# A message shorter than this is not worth eliding: its overflow comes from the prompt, not from its text.
MIN_ELIDABLE_TOKENS = 32
# What one partial summary adds to a merge request besides its reply: its record in the transcript (~14 tokens)
# and the rendering of its fields, which can come out a little longer than the JSON.
RECORD_OVERHEAD_TOKENS = 20


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


@dataclass(frozen=True)
class Summary:
    """A summary ready to splice in, with what it cost and how it was reached."""

    message: Message = field(hash=False)  # role "user", content = text
    usage: dict[str, int] = field(hash=False)  # summed over every call that got a reply
    calls: int  # every request sent, including those that overflowed
    structured: StructuredSummary | None
    text: str
    strategy: str  # "prefix" | "direct" | "removed_tool_results_<percent>" | "chunked"
    evidence: int = 0  # entries the proxy added from the messages themselves (proxy.evidence)


async def summarize(model: ChatModel, messages: Sequence[Any], templates: Templates | None = None, *,
                    counter: TokenCounter | None = None, max_calls: int = NO_CALL_LIMIT,
                    deadline: float | None = None, prefix: ConversationPrefix | None = None) -> Summary:
    """Summarise `messages` into one user-role message, shrinking or splitting the work when it overflows.

    With `prefix` the first request is the conversation's own prefix plus one instruction (prefix layout); when
    that does not fit, the transcript ladder follows. At most `max_calls` requests are sent, and the whole summary
    (every call) must be done within `deadline` seconds: a hostile history cannot buy unbounded calls or minutes.
    """
    history = list(messages)
    if not history:
        raise SummarizerError("there are no messages to summarise")
    run = _Run(model, templates or default_templates(), counter, max_calls)
    try:
        async with asyncio.timeout(deadline):
            strategy, reply = await _summarize_history(run, history, prefix)
    except TimeoutError:
        error = SummarizerError(f"the summary took longer than its deadline of {deadline:g}s")
        error.usage, error.calls = dict(run.usage), run.calls
        raise error from None
    except SummarizerError as error:
        error.usage, error.calls = dict(run.usage), run.calls
        raise
    text = summary_text(reply, run.templates)
    return Summary(message={"role": "user", "content": text}, usage=dict(run.usage), calls=run.calls,
                   structured=StructuredSummary.parse(reply), text=text, strategy=strategy)


@cache
def _default_counter() -> TokenCounter:
    return TokenCounter()


class _Run:
    """One summarize() call: the model, what it has cost so far, and the single request shape it sends."""

    def __init__(self, model: ChatModel, templates: Templates, counter: TokenCounter | None,
                 max_calls: int = 0) -> None:
        self.model = model
        self.templates = templates
        self._counter = counter
        self._max_calls = max_calls
        self.calls = 0
        self.usage = dict.fromkeys(USAGE_KEYS, 0)

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
        sent = self._stating_its_limit(build)
        return await self._send(str(sent[0]["content"]), sent[1:])

    async def ask_after(self, prefix: ConversationPrefix) -> str:
        """One prefix-layout request: the conversation's messages as they were sent, then the instruction."""
        messages = list(prefix.messages)
        if messages and is_user(messages[-1]) and prefix.acknowledgement:
            messages.append({"role": "assistant", "content": prefix.acknowledgement})  # roles keep alternating

        def build(limit: int | None) -> list[Message]:
            return [*messages, {"role": "user", "content": self.templates.compaction_request(window=self.window,
                                                                                             limit=limit)}]
        return await self._send(None, self._stating_its_limit(build), prefix.tools)

    @contextmanager
    def asking(self, tokens: int | None) -> Iterator[None]:
        """Within the block, requests ask for at most `tokens` of output (None, or a model that cannot be limited:
        its own ask)."""
        limited = getattr(self.model, "limited", None)
        if tokens is None or not callable(limited):
            yield
            return
        whole, self.model = self.model, limited(tokens)
        try:
            yield
        finally:
            self.model = whole

    def _stating_its_limit(self, build: Callable[[int | None], list[Message]]) -> list[Message]:
        """The request built to state the output it will get: the ask, or less when its prompt leaves less (an
        ask beyond the part that must fit whole gives way, before the input loses anything). A model told more
        than it gets runs past its limit and is cut off."""
        sent = build(self.limit)
        fit = getattr(self.model, "output_limit", None)
        if not (self.limit and callable(fit)):
            return sent
        try:
            actual = fit(sent)
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
        text = content_text(reply.get("content"))
        self._add_usage(usage, system, messages, text)  # a rejected reply was still billed
        if reply.get("finish_reason") == "length":
            self._report_parse(None)  # a reply that ran to its limit failed to parse too: it was never whole
            raise SummaryTruncated("summariser reply was cut off by the output limit")
        if not text.strip():
            raise SummarizerError("summariser reply is empty")
        self._report_parse(text)
        return text

    def _report_parse(self, text: str | None) -> None:
        # A model that may ask for structured output (proxy.model_client) learns from whether its replies parse.
        report = getattr(self.model, "reply_parsed", None)
        if callable(report):
            report(text is not None and StructuredSummary.parse(text) is not None)

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

    def token_groups(self, records: list[str], instruction: str) -> list[slice]:
        """Consecutive records grouped to fit a known window; one group when the window is unknown."""
        allowed = self.input_room(instruction)
        if allowed is None or allowed <= 0:  # unknown or too small to plan by: halving on overflow decides
            return [slice(0, len(records))]
        return _pack([self.counter.count_text(record) + 1 for record in records], allowed)


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


async def _summarize_history(run: _Run, history: list[Message],
                             prefix: ConversationPrefix | None = None) -> tuple[str, str]:
    """(strategy, raw reply) from the conversation's prefix when given and it fits, else from the first rung of
    the transcript ladder that fits, else from chunk-and-merge over the whole history."""
    if prefix is not None:
        try:
            return "prefix", await run.ask_after(prefix)
        except SummarizerOverflow:
            pass  # a transcript can leave tool results out and split the history; the prefix can do neither
    for strategy, attempt in removal_ladder(history):
        try:
            return strategy, await run.ask(format_transcript(attempt), run.templates.compaction_instruction())
        except SummarizerOverflow:
            continue
    # Chunks carry every tool result again: chunking is the path that can afford them.
    return "chunked", await _summarize_in_chunks(run, history)


async def _summarize_in_chunks(run: _Run, history: list[Message]) -> str:
    if len(history) < 2:  # it was just sent whole and overflowed
        return await _ask_eliding(run, history[0], run.templates.compaction_instruction(), depth=1,
                                  overflow=SummarizerOverflow("the only message overflowed"))
    records = [format_message_for_compacting(message) for message in history]
    partials: list[str] = []
    # Parts that ask for less leave room for more history each, and their summaries fit one merge request.
    with run.asking(_part_ask(run, len(await _groups(run, records)))):
        chunks = [history[group] for group in await _groups(run, records)]
        if len(chunks) < 2:  # the whole history just overflowed: resending it would only overflow again
            chunks = list(_halves(history))
        for index, chunk in enumerate(chunks, start=1):
            partials += await _summarize_part(run, chunk, index, len(chunks), depth=1)
    return await _merge(run, partials)


async def _groups(run: _Run, records: list[str]) -> list[slice]:
    return await off_loop_if_large(sum(map(len, records)), run.token_groups, records,
                                   run.templates.chunk_instruction(1, 2, window=run.window))


def _part_ask(run: _Run, parts: int) -> int | None:
    """The output each of `parts` partial summaries may ask for so that all of them fit one merge request (a merge
    that overflows becomes a tree of merges, a request each); None when the summary's own ask already does."""
    limit, window = run.limit, run.window
    if parts < 2 or limit is None or window is None:
        return None
    room = run.input_room(run.templates.merge_instruction(parts, window=window))
    if room is None:
        return None
    ask = max(budget.MIN_SUMMARIZER_OUTPUT, room // parts - RECORD_OVERHEAD_TOKENS)
    return ask if ask < limit else None


async def _summarize_part(run: _Run, chunk: list[Message], index: int, count: int, depth: int) -> list[str]:
    """Partial summaries of one chunk, halving it while it overflows.

    Part (i of n) halves into (2i-1 of 2n) and (2i of 2n), so each request still says where its stretch sits.
    A truncated reply is not retried by splitting: the merged summary must hold at least as much as a part's,
    so a limit too small for a part would only fail again at the merge after many more calls.
    """
    instruction = run.templates.chunk_instruction(index, count, window=run.window)
    if len(chunk) < 2:
        return [summary_text(await _ask_eliding(run, chunk[0], instruction, depth), run.templates)]
    try:
        reply = await run.ask(format_transcript(chunk), instruction)
        return [summary_text(reply, run.templates)]
    except SummarizerOverflow as overflow:
        if depth >= MAX_SPLIT_DEPTH:
            raise SummarizerError(f"history still overflows after {depth} halvings") from overflow
    first, second = _halves(chunk)
    return [*await _summarize_part(run, first, 2 * index - 1, 2 * count, depth + 1),
            *await _summarize_part(run, second, 2 * index, 2 * count, depth + 1)]


async def _ask_eliding(run: _Run, message: Message, instruction: str, depth: int,
                       overflow: SummarizerOverflow | None = None) -> str:
    """The raw reply for a stretch of one message, whose text loses its middle while the request overflows
    (from the start when `overflow` says the message as it is already did).

    A message too big for the summariser's window on its own (an earlier summary in a small window, a huge
    result) would otherwise stop every later compaction; only the summariser's copy is shortened, with a marker.
    """
    while True:
        if overflow is not None:
            shorter = _elided_half(run, message, instruction) if depth < MAX_SPLIT_DEPTH else None
            if shorter is None:
                raise SummarizerError("a single message does not fit the summariser's context window") from overflow
            message, depth = shorter, depth + 1
        try:
            return await run.ask(format_transcript([message]), instruction)
        except SummarizerOverflow as error:
            overflow = error


def _elided_half(run: _Run, message: Message, instruction: str) -> Message | None:
    """`message` with at most half its text kept (less when the window says so); None when there is no text to
    shorten."""
    text = message.get("content")
    if not isinstance(text, str):
        return None
    tokens = run.counter.count_text(text)
    if tokens < MIN_ELIDABLE_TOKENS:
        return None
    room = run.input_room(instruction)
    keep = tokens // 2 if room is None or room <= 0 else min(tokens // 2, room)
    return with_text(message, elide_text(text, keep, run.counter.count_text, run.templates.elision_marker))


def _halves(items: list[Item]) -> tuple[list[Item], list[Item]]:
    middle = len(items) // 2
    return items[:middle], items[middle:]


async def _merge(run: _Run, partials: list[str]) -> str:
    """The raw reply merging `partials`; groups that do not fit are merged first (a tree), oldest first."""
    messages: list[Message] = [{"role": "user", "content": text} for text in partials]
    instruction = run.templates.merge_instruction(len(partials), window=run.window)
    records = [format_message_for_compacting(message) for message in messages]
    groups = await off_loop_if_large(sum(map(len, records)), run.token_groups, records, instruction)
    if 1 < len(groups) < len(partials):
        return await _merge(run, [await _merged_text(run, partials[group]) for group in groups])
    try:
        return await run.ask(format_transcript(messages), instruction)
    except SummarizerOverflow:
        if len(partials) <= 2:
            # Two parts too long to merge in this window stand side by side, oldest first: nothing is lost, and
            # the compactor refuses the summary if the request it goes into would not fit.
            return PARTS_SEPARATOR.join(partials)
    first, second = _halves(partials)
    return await _merge(run, [await _merged_text(run, first), await _merged_text(run, second)])


async def _merged_text(run: _Run, partials: list[str]) -> str:
    if len(partials) == 1:
        return partials[0]
    return summary_text(await _merge(run, partials), run.templates)
