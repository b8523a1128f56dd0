"""The summariser: one request for a summary (the conversation's own prefix, or a transcript), a tool-result
removal ladder on overflow, then chunk-and-merge."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from proxy.core import budget
from proxy.core.elision import elide_text
from proxy.core.messages import Message, content_text, with_text
from proxy.core.tokens import TokenCounter
from proxy.offload import LARGE_REPLY, off_loop_above, off_loop_if_large
from proxy.summarizer import current_state, summary_check
from proxy.summarizer.current_state import Correction
from proxy.summarizer.evidence import Evidence, complete, gather, text_size
from proxy.summarizer.result_removal import removal_ladder
from proxy.summarizer.summary import StructuredSummary, rendered_text
from proxy.summarizer.summary_run import (
    ChatModel,
    ConversationPrefix,
    SummarizerError,
    SummarizerOverflow,
    SummaryRun,
    SummaryTruncated,
)
from proxy.summarizer.templates import Templates, default_templates
from proxy.summarizer.transcript import format_message_for_compacting, format_transcript

# The summary's interface is imported from here; its request machinery lives in proxy.summary_run.
__all__ = ["MAX_SPLIT_DEPTH", "NO_CALL_LIMIT", "ChatModel", "ConversationPrefix", "SummarizerError",
           "SummarizerOverflow", "Summary", "SummaryTruncated", "summarize"]

Item = TypeVar("Item")

NO_CALL_LIMIT = 0  # the library default; the proxy passes `compaction.summarizer.max_calls`
MAX_SPLIT_DEPTH = 8  # halvings of one stretch of history: at most 2**8 parts before giving up
PARTS_SEPARATOR = "\n\n"  # between partial summaries that could not be merged into one
# A message shorter than this is not worth eliding: its overflow comes from the prompt, not from its text.
MIN_ELIDABLE_TOKENS = 32
# What one partial summary adds to a merge request besides its reply: its record in the transcript (~14 tokens)
# and the rendering of its fields, which can come out a little longer than the JSON.
RECORD_OVERHEAD_TOKENS = 20
# Tokens of exact values (the user's words, errors, commands, files) a library caller's summary may gain by default.
DEFAULT_EVIDENCE_ROOM = 512


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
    corrections: tuple[Correction, ...] = ()  # what the checks after the model changed (proxy.current_state)


async def summarize(model: ChatModel, messages: Sequence[Any], templates: Templates | None = None, *,
                    counter: TokenCounter | None = None, max_calls: int = NO_CALL_LIMIT,
                    deadline: float | None = None, prefix: ConversationPrefix | None = None,
                    evidence_room: int | None = DEFAULT_EVIDENCE_ROOM, later: Sequence[Message] = ()) -> Summary:
    """Summarise `messages` into one user-role message, shrinking or splitting the work when it overflows.

    With `prefix` the first request is the conversation's own prefix plus one instruction (prefix layout); when
    that does not fit, the transcript ladder follows. At most `max_calls` requests are sent, and the whole summary
    (every call) must be done within `deadline` seconds: a hostile history cannot buy unbounded calls or minutes.
    The checks after the model (proxy.current_state) always run; with `evidence_room` the user's words, errors,
    commands and files the model left out are added from `messages` within that many tokens (the proxy passes
    None and adds them itself, by the same `with_evidence`, within its plan's budget). `later` are the messages
    that stay after the summary: a change of mind there makes a value replaced too.
    """
    history = list(messages)
    if not history:
        raise SummarizerError("there are no messages to summarise")
    run = SummaryRun(model, templates or default_templates(), counter, max_calls)
    try:
        async with asyncio.timeout(deadline):
            strategy, reply = await _summarize_history(run, history, prefix)
            await off_loop_above(LARGE_REPLY, len(reply), _judge, reply, history)
            structured, text = await run.parse(reply), await run.text_of(reply)
            corrections: tuple[Correction, ...] = ()
            if structured is not None:
                # The checks read the whole history (every user and assistant message): a huge one is read in a
                # thread, as the reply is.
                read = [*history, *later]
                structured, corrections, text = await off_loop_above(LARGE_REPLY, len(reply) + text_size(read),
                                                                     _checked, structured, read, text, run.templates)
    except TimeoutError:
        error = SummarizerError(f"the summary took longer than its deadline of {deadline:g}s")
        error.usage, error.calls = dict(run.usage), run.calls
        raise error from None
    except SummarizerError as error:
        error.usage, error.calls = dict(run.usage), run.calls
        raise
    summary = Summary(message={"role": "user", "content": text}, usage=dict(run.usage), calls=run.calls,
                      structured=structured, text=text, strategy=strategy, corrections=corrections)
    if evidence_room is None:
        return summary
    found = await off_loop_if_large(text_size(history), gather, history)
    return with_evidence(summary, found, evidence_room, run.counter.count_text, run.templates)


def with_evidence(summary: Summary, evidence: Evidence, room: int, count: Callable[[str], int],
                  templates: Templates, *, exact_room: int = 0) -> Summary:
    """The summary with the evidence it lacks (proxy.evidence.complete), within `room` tokens and `exact_room`
    more for exact values, rendered again; the same summary when nothing was added."""
    structured, added = complete(summary.structured, summary.text, evidence, room, count, exact_room=exact_room)
    if not added:
        return summary
    if (rendered := rendered_text(structured, templates)) is None:
        return summary
    # A reply that did not parse stays verbatim, the evidence after it.
    text = rendered if summary.structured is not None else f"{summary.text}\n\n{rendered}"
    return replace(summary, message={**summary.message, "content": text}, text=text, evidence=added,
                   structured=structured if summary.structured is not None else None)


def _checked(structured: StructuredSummary, history: list[Message], text: str,
             templates: Templates) -> tuple[StructuredSummary, tuple[Correction, ...], str]:
    """The deterministic checks applied (proxy.current_state), and the summary rendered again when they changed
    it; the proxy's path and the library's both come through here."""
    checked, corrections = current_state.corrected(structured, history)
    if not corrections:
        return structured, (), text
    rendered = rendered_text(checked, templates)
    return checked, corrections, rendered if rendered is not None else text


def _judge(reply: str, history: list[Message]) -> None:
    """Refuse a reply that cannot be a summary of `history` (markup, a loop, a word or two): the raw-text fallback
    takes any text, and what replaces the history is reused on every later turn."""
    replaced = sum(len(content_text(message.get("content"))) for message in history)
    if (reason := summary_check.problem(reply, replaced)) is not None:
        raise SummarizerError(f"the summariser's reply is not a summary: {reason}")


async def _summarize_history(run: SummaryRun, history: list[Message],
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


async def _summarize_in_chunks(run: SummaryRun, history: list[Message]) -> str:
    if len(history) < 2:  # it was just sent whole and overflowed
        return await _ask_eliding(run, history[0], run.templates.compaction_instruction(), depth=1,
                                  overflow=SummarizerOverflow("the only message overflowed"))
    sizes = await _record_sizes(run, [format_message_for_compacting(message) for message in history])
    instruction = run.templates.chunk_instruction(1, 2, window=run.window)
    partials: list[str] = []
    # Parts that ask for less leave room for more history each, and their summaries fit one merge request.
    with run.asking(_part_ask(run, len(run.token_groups(sizes, instruction)))):
        chunks = [history[group] for group in run.token_groups(sizes, instruction)]
        if len(chunks) < 2:  # the whole history just overflowed: resending it would only overflow again
            chunks = list(_halves(history))
        for index, chunk in enumerate(chunks, start=1):
            partials += await _summarize_part(run, chunk, index, len(chunks), depth=1)
    return await _merge(run, partials)


async def _record_sizes(run: SummaryRun, records: list[str]) -> list[int]:
    return await off_loop_if_large(sum(map(len, records)), run.record_sizes, records)


def _part_ask(run: SummaryRun, parts: int) -> int | None:
    """The output each of `parts` partial summaries may ask for so that all of them fit one merge request (a merge
    that overflows becomes a tree of merges, a request each); None when the summary's own ask already does."""
    limit = run.limit
    if parts < 2 or limit is None:
        return None
    room = run.input_room(run.templates.merge_instruction(parts, window=run.window))
    if room is None:  # the window is unknown
        return None
    ask = max(budget.MIN_SUMMARIZER_OUTPUT, room // parts - RECORD_OVERHEAD_TOKENS)
    return ask if ask < limit else None


async def _summarize_part(run: SummaryRun, chunk: list[Message], index: int, count: int, depth: int) -> list[str]:
    """Partial summaries of one chunk; a part cut off at its share of the merge is asked again with the summary's
    own ask, one request more where failing would lose the whole summary (its merge may then need a tree)."""
    try:
        return await _split_part(run, chunk, index, count, depth)
    except SummaryTruncated:
        if not run.limited:
            raise
    with run.asking(None):
        return await _split_part(run, chunk, index, count, depth)


async def _split_part(run: SummaryRun, chunk: list[Message], index: int, count: int, depth: int) -> list[str]:
    """Partial summaries of one chunk, halving it while it overflows.

    Part (i of n) halves into (2i-1 of 2n) and (2i of 2n), so each request still says where its stretch sits.
    A truncated reply is not retried by splitting: the merged summary must hold at least as much as a part's,
    so a limit too small for a part would only fail again at the merge after many more calls.
    """
    instruction = run.templates.chunk_instruction(index, count, window=run.window)
    if len(chunk) < 2:
        return [await run.text_of(await _ask_eliding(run, chunk[0], instruction, depth))]
    try:
        reply = await run.ask(format_transcript(chunk), instruction)
        return [await run.text_of(reply)]
    except SummarizerOverflow as overflow:
        if depth >= MAX_SPLIT_DEPTH:
            raise SummarizerError(f"history still overflows after {depth} halvings") from overflow
    first, second = _halves(chunk)
    return [*await _summarize_part(run, first, 2 * index - 1, 2 * count, depth + 1),
            *await _summarize_part(run, second, 2 * index, 2 * count, depth + 1)]


async def _ask_eliding(run: SummaryRun, message: Message, instruction: str, depth: int,
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


def _elided_half(run: SummaryRun, message: Message, instruction: str) -> Message | None:
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


async def _merge(run: SummaryRun, partials: list[str]) -> str:
    """The raw reply merging `partials`; groups that do not fit are merged first (a tree), oldest first."""
    messages: list[Message] = [{"role": "user", "content": text} for text in partials]
    instruction = run.templates.merge_instruction(len(partials), window=run.window)
    records = [format_message_for_compacting(message) for message in messages]
    groups = run.token_groups(await _record_sizes(run, records), instruction)
    if 1 < len(groups) < len(partials):
        return await _merge(run, [await _merged_text(run, partials[group]) for group in groups])
    try:
        return await run.ask(format_transcript(messages), instruction)
    except (SummarizerOverflow, SummaryTruncated):
        # A merge too long to send, or one whose reply ran past the summary's ask (SmolLM2 at n_ctx 1,024 restated
        # two parts in more than the 256 tokens asked): smaller merges first, and two parts that still do not merge
        # stand side by side, oldest first. Nothing is lost; the compactor shortens or refuses what does not fit.
        if len(partials) <= 2:
            return PARTS_SEPARATOR.join(partials)
    first, second = _halves(partials)
    return await _merge(run, [await _merged_text(run, first), await _merged_text(run, second)])


async def _merged_text(run: SummaryRun, partials: list[str]) -> str:
    if len(partials) == 1:
        return partials[0]
    return await run.text_of(await _merge(run, partials))
