"""The summariser: request shape, the ladder on overflow, chunk-and-merge, rejected replies, usage, concurrency."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.core import budget
from proxy.core.tokens import TokenCounter
from proxy.summarizer.result_removal import REMOVED_TOOL_RESULT, removal_ladder
from proxy.summarizer.summarizer import (
    MAX_SPLIT_DEPTH,
    ConversationPrefix,
    SummarizerError,
    SummarizerOverflow,
    Summary,
    SummaryTruncated,
    summarize,
)
from proxy.summarizer.templates import Templates
from proxy.summarizer.transcript import format_message_for_compacting, format_transcript

Message = dict[str, Any]
MARKER = re.compile(r"FACT-[0-9a-z.]+")
REPORTED_USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
ECHO = object()  # the scripted model's default reply: the markers it saw


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    return Templates(user_dir=tmp_path_factory.mktemp("no-user-prompts"))


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def markers(text: str) -> list[str]:
    """The distinct markers in `text`, in order of first appearance."""
    return list(dict.fromkeys(MARKER.findall(text)))


@dataclass(frozen=True)
class Request:
    system: str
    messages: list[Message]

    @property
    def transcript(self) -> str:
        return self.system.split("\n<transcript>\n", 1)[1].rsplit("\n</transcript>", 1)[0]

    @property
    def instruction(self) -> str:
        return str(self.messages[0]["content"])


def echo_reply(transcript: str, padding: int) -> str:
    """A structured reply listing every marker seen: a mechanical but faithful summary and merge."""
    fields: dict[str, Any] = {"user_intent": markers(transcript)}
    if padding:
        fields["problem_solving"] = ["p" * padding]
    return f"<analysis>{len(fields['user_intent'])} facts</analysis>\n```json\n{json.dumps(fields)}\n```"


class ScriptedModel:
    """Records every request; overflows past `limit` transcript characters (or when `overflows` says so)."""

    def __init__(self, *, limit: int | None = None, overflows: Callable[[Request], bool] | None = None,
                 usage: Any = REPORTED_USAGE, padding: int = 0, reply: Any = ECHO,
                 finish_reason: str | None = None, context_window: int | None = None) -> None:
        self.requests: list[Request] = []
        self.overflowed: list[Request] = []
        self.limit, self.overflows, self.usage, self.padding = limit, overflows, usage, padding
        self.reply, self.finish_reason, self.context_window = reply, finish_reason, context_window

    async def complete(self, system: str, messages: list[Message]) -> tuple[Message, Any]:
        request = Request(system, messages)
        self.requests.append(request)
        await asyncio.sleep(0)  # lets concurrent callers interleave
        if (self.limit is not None and len(request.transcript) > self.limit) or (
                self.overflows is not None and self.overflows(request)):
            self.overflowed.append(request)
            raise SummarizerOverflow("prompt is too long")
        content = echo_reply(request.transcript, self.padding) if self.reply is ECHO else self.reply
        message: Message = {"role": "assistant", "content": content}
        if self.finish_reason is not None:
            message["finish_reason"] = self.finish_reason
        return message, json.loads(json.dumps(self.usage))


class RaisingModel:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def complete(self, system: str, messages: list[Message]) -> tuple[Message, Any]:
        raise self.error


def label(request: Request, templates: Templates) -> str:
    """Which kind of request this was: the direct summary, part i/n of a chunked one, or a merge of k (in the
    full form, or the tiny one of a window below 1,536 tokens)."""
    if request.instruction == templates.compaction_instruction():
        return "direct"
    for count, window in ((count, window) for count in range(1, 65) for window in (None, 1024)):
        if request.instruction == templates.merge_instruction(count, window=window):
            return f"merge {count}"
        for index in range(1, count + 1):
            if request.instruction == templates.chunk_instruction(index, count, window=window):
                return f"part {index}/{count}"
    raise AssertionError(f"unknown instruction: {request.instruction!r}")


def chat(count: int, padding: int = 0, tag: str = "") -> list[Message]:
    """Alternating user/assistant messages, each with its own marker."""
    roles = ("user", "assistant")
    return [{"role": roles[index % 2], "content": f"FACT-{tag}{index} " + "c" * padding} for index in range(count)]


def tool_history(results: int = 10, result_size: int = 2000, user_padding: int = 0) -> list[Message]:
    """`results` rounds of user request, assistant tool call and tool result, each with distinct markers."""
    history: list[Message] = []
    for index in range(results):
        call = {"id": f"call_{index}", "type": "function",
                "function": {"name": "run_step", "arguments": json.dumps({"step": index})}}
        history += [
            {"role": "user", "content": f"FACT-u{index} run step {index} " + "u" * user_padding},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{index}", "content": f"FACT-r{index} " + "x" * result_size},
        ]
    return history


# --- the request ------------------------------------------------------------------------------------------

async def test_request_shape(templates: Templates) -> None:
    history = [
        *tool_history(2, result_size=20),
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
        {"role": "assistant", "content": "line one\nline two", "reasoning_content": "secret scratch"},
    ]
    model = ScriptedModel()
    summary = await summarize(model, history, templates)
    assert len(model.requests) == 1 and summary.calls == 1 and summary.strategy == "direct"
    request = model.requests[0]
    assert request.system == templates.compaction_prompt(format_transcript(history))
    assert all(format_message_for_compacting(message) in request.transcript for message in history)
    assert request.messages == [{"role": "user", "content": templates.compaction_instruction()}]
    assert "secret scratch" not in request.system


@pytest.mark.parametrize("rung", range(5))
async def test_success_at_rung_r_takes_r_plus_one_requests(rung: int, templates: Templates) -> None:
    history = tool_history(10)
    fits = format_transcript(list(removal_ladder(history))[rung][1])
    model = ScriptedModel(limit=len(fits))
    summary = await summarize(model, history, templates)
    assert len(model.requests) == summary.calls == rung + 1
    assert summary.strategy == ["direct", "removed_tool_results_10", "removed_tool_results_20",
                                "removed_tool_results_50", "removed_tool_results_100"][rung]
    removed_at = [set(), {4}, {4, 5}, {2, 3, 4, 5, 6}, set(range(10))]
    for request, removed in zip(model.requests, removed_at, strict=False):
        kept = {index for index in range(10) if f"FACT-r{index} " in request.transcript}
        assert kept == set(range(10)) - removed
        assert request.transcript.count(REMOVED_TOOL_RESULT) == len(removed)
        assert request.transcript.count("tool_request(run_step)") == 10
        assert all(f"FACT-u{index} " in request.transcript for index in range(10))
    assert markers(summary.text) == markers(fits)


# --- chunk and merge --------------------------------------------------------------------------------------

async def test_no_tool_results_overflow_goes_straight_to_chunks(templates: Templates) -> None:
    history = chat(8, padding=500)
    model = ScriptedModel(limit=len(format_transcript(history[:4])))
    summary = await summarize(model, history, templates)
    assert [label(request, templates) for request in model.requests] == [
        "direct", "part 1/2", "part 2/2", "merge 2"]
    first, second, merge = model.requests[1:]
    assert first.transcript == format_transcript(history[:4])
    assert second.transcript == format_transcript(history[4:])
    assert markers(merge.transcript) == [f"FACT-{index}" for index in range(8)]
    assert merge.transcript.count("# Conversation Summary") == 2
    assert summary.strategy == "chunked" and summary.calls == 4
    assert markers(summary.text) == [f"FACT-{index}" for index in range(8)]
    assert summary.text.startswith("# Conversation Summary")


async def test_bisection_and_merge_tree_keep_every_fact(templates: Templates) -> None:
    history = chat(16, padding=200)
    limit = len(format_transcript(history[-4:]))  # four messages fit, and a merge of two padded summaries
    model = ScriptedModel(limit=limit, padding=limit // 4)
    summary = await summarize(model, history, templates)
    assert [label(request, templates) for request in model.requests] == [
        "direct", "part 1/2", "part 1/4", "part 2/4", "part 2/2", "part 3/4", "part 4/4",
        "merge 4", "merge 2", "merge 2", "merge 2"]
    assert markers(summary.text) == [f"FACT-{index}" for index in range(16)]
    assert summary.strategy == "chunked" and summary.calls == 11


async def test_full_removal_still_overflowing_chunks_with_every_tool_result(templates: Templates) -> None:
    history = tool_history(10, result_size=2000, user_padding=600)
    model = ScriptedModel(limit=4000)
    summary = await summarize(model, history, templates)
    labels = [label(request, templates) for request in model.requests]
    assert labels[:5] == ["direct"] * 5 and labels[5].startswith("part ") and labels[-1].startswith("merge ")
    assert summary.strategy == "chunked"
    assert set(markers(summary.text)) == {f"FACT-{kind}{index}" for kind in "ur" for index in range(10)}
    assert not any(REMOVED_TOOL_RESULT in request.transcript for request in model.requests[5:])


def window_model(history: list[Message], templates: Templates, counter: TokenCounter, padding: int) -> ScriptedModel:
    """A model whose window holds the prompt, about five history messages and a quarter left for the reply."""
    per_message = counter.count_text(format_message_for_compacting(history[0]))
    framing = counter.count_messages([{"role": "system", "content": templates.compaction_prompt("")},
                                      {"role": "user", "content": templates.chunk_instruction(1, 2)}])
    window = (framing + 5 * per_message + 60) * 4 // 3

    def over_window(request: Request) -> bool:
        return counter.count_messages([{"role": "system", "content": request.system}, *request.messages]) > window

    return ScriptedModel(overflows=over_window, context_window=window, padding=padding)


class WindowedModel:
    """A summariser behind a server that enforces its window, as ModelClient sends to it: a request's output cap
    is what its prompt leaves (up to the ask), a prompt that leaves less than the ask overflows before it is sent,
    and the model writes `reply_tokens`, or its cap when that is less (it keeps to the limit it is told)."""

    def __init__(self, counter: TokenCounter, *, window: int = 1024, ask: int = 256, reply_tokens: int = 170,
                 sent: list[tuple[str, int]] | None = None, keeps_to_limit: bool = True) -> None:
        self.context_window, self.max_output_tokens, self.reply_tokens = window, ask, reply_tokens
        self.counter, self.keeps_to_limit = counter, keeps_to_limit
        self.sent: list[tuple[str, int]] = [] if sent is None else sent  # (instruction, output cap), every part

    def limited(self, tokens: int) -> WindowedModel:
        return WindowedModel(self.counter, window=self.context_window, ask=min(tokens, self.max_output_tokens),
                             reply_tokens=self.reply_tokens, sent=self.sent, keeps_to_limit=self.keeps_to_limit)

    def output_limit(self, messages: list[Message]) -> int:
        room = budget.summarizer_output_room(self.context_window, self.counter.count_messages(messages),
                                             self.max_output_tokens)
        if room is None:
            raise SummarizerOverflow("the prompt leaves no room for the summary")
        return room

    async def complete(self, system: str, messages: list[Message]) -> tuple[Message, Any]:
        request = Request(system, messages)
        cap = self.output_limit([{"role": "system", "content": system}, *messages])
        self.sent.append((request.instruction, cap))
        fields = {"user_intent": markers(request.transcript)}
        words = min(self.reply_tokens, cap) - self.counter.count_text(json.dumps(fields)) - 8
        fields["problem_solving"] = [" ".join(["note"] * max(0, words))]
        cut_off = not self.keeps_to_limit and self.reply_tokens > cap
        return {"role": "assistant", "content": f"```json\n{json.dumps(fields)}\n```",
                "finish_reason": "length" if cut_off else "stop"}, {}


def sent_labels(model: WindowedModel, templates: Templates) -> list[str]:
    """What each request the model was sent asked for (its instruction), in order."""
    return [label(Request("<transcript>\n\n</transcript>", [{"content": text}]), templates) for text, _ in model.sent]


def small_window_chat(turns: int = 6) -> list[Message]:
    """The conversation of the n_ctx 1,024 test: ~150-token user turns, ~48-token replies, a fact in each."""
    history: list[Message] = []
    for index in range(turns):
        history += [{"role": "user", "content": f"FACT-u{index} " + "detail " * 140},
                    {"role": "assistant", "content": f"FACT-a{index} " + "answer " * 45}]
    return history


async def test_a_history_in_parts_at_a_1024_window_needs_one_merge(templates: Templates,
                                                                    counter: TokenCounter) -> None:
    """Measured on SmolLM2 at n_ctx 1024: a 965-token span took 11 summariser requests (80-92 s idle; past the
    180 s deadline on a busy machine). Parts sized to the window and asking for their share of one merge: four."""
    history = small_window_chat()
    model = WindowedModel(counter)
    summary = await summarize(model, history, templates, counter=counter)
    labels = sent_labels(model, templates)
    parts = [cap for (_, cap), text in zip(model.sent, labels, strict=True) if text.startswith("part ")]
    assert len(model.sent) <= 4 and labels[-1].startswith("merge ") and len(labels) == len(parts) + 1, labels
    assert max(parts) < 256 and model.sent[-1][1] == 256  # the merge keeps the summary's own ask
    assert markers(summary.text) == [f"FACT-{kind}{index}" for index in range(6) for kind in "ua"]


async def test_a_part_cut_off_at_its_share_is_asked_again_with_the_summarys_own_ask(
        templates: Templates, counter: TokenCounter) -> None:
    """SmolLM2 at n_ctx 1024 ran past a part's share (a JSON reply cut off): that would fail the whole summary."""
    model = WindowedModel(counter, reply_tokens=200, keeps_to_limit=False)
    summary = await summarize(model, small_window_chat(), templates, counter=counter)
    caps = [cap for _, cap in model.sent]
    assert caps[0] < 200 and caps[1] == 256, "the part is cut off at its share, then asked again at the whole ask"
    assert markers(summary.text) == [f"FACT-{kind}{index}" for index in range(6) for kind in "ua"]


async def test_a_summary_cut_off_at_its_own_ask_still_fails(templates: Templates, counter: TokenCounter) -> None:
    model = WindowedModel(counter, reply_tokens=400, keeps_to_limit=False)
    with pytest.raises(SummaryTruncated):
        await summarize(model, small_window_chat(), templates, counter=counter)
    assert [cap for _, cap in model.sent][:2] == [model.sent[0][1], 256] and model.sent[0][1] < 256


class RamblingMerger(WindowedModel):
    """Keeps to its limit in every part; a merge runs past the summary's own ask (cut off), for `rambles` merges."""

    def __init__(self, counter: TokenCounter, templates: Templates, rambles: int) -> None:
        super().__init__(counter)
        self.templates, self.rambles = templates, rambles

    async def complete(self, system: str, messages: list[Message]) -> tuple[Message, Any]:
        reply, usage = await super().complete(system, messages)
        merging = label(Request(system, messages), self.templates).startswith("merge ")
        if merging and self.rambles > 0:
            self.rambles -= 1
            reply = {**reply, "content": str(reply["content"])[:200], "finish_reason": "length"}
        return reply, usage


@pytest.mark.parametrize(("turns", "rambles", "expected", "structured"), [
    (4, 0, ["part 1/2", "part 2/2", "merge 2"], True),
    # Measured: SmolLM2 at n_ctx 1024 ran a two-part merge past its 256 tokens, and the summary was lost.
    (4, 1, ["part 1/2", "part 2/2", "merge 2"], False),
    (4, 9, ["part 1/2", "part 2/2", "merge 2"], False),
    # Three parts: the merge of all three is cut off, so two smaller merges; the last of them keeps to its ask.
    (6, 1, ["part 1/3", "part 2/3", "part 3/3", "merge 3", "merge 2", "merge 2"], True),
    (6, 9, ["part 1/3", "part 2/3", "part 3/3", "merge 3", "merge 2", "merge 2"], False),
], ids=["two-parts-merged", "two-parts-cut-off-once", "two-parts-always-cut-off", "three-parts-cut-off-once",
        "three-parts-always-cut-off"])
async def test_a_merge_cut_off_at_its_ask_loses_no_part(turns: int, rambles: int, expected: list[str],
                                                       structured: bool, templates: Templates,
                                                       counter: TokenCounter) -> None:
    """A cut-off merge is merged in smaller groups, and two parts that still do not merge stand side by side."""
    model = RamblingMerger(counter, templates, rambles)
    summary = await summarize(model, small_window_chat(turns), templates, counter=counter)
    assert sent_labels(model, templates) == expected
    assert (summary.structured is not None) is structured and summary.strategy == "chunked"
    assert markers(summary.text) == [f"FACT-{kind}{index}" for index in range(turns) for kind in "ua"]


async def test_a_model_that_cannot_be_limited_still_summarises_in_parts(templates: Templates,
                                                                         counter: TokenCounter) -> None:
    class Unlimited(WindowedModel):
        limited = None  # type: ignore[assignment]
    model = Unlimited(counter)
    summary = await summarize(model, small_window_chat(), templates, counter=counter)
    assert all(cap == 256 for _, cap in model.sent) and len(model.sent) > 4
    assert markers(summary.text) == [f"FACT-{kind}{index}" for index in range(6) for kind in "ua"]


async def test_a_known_window_plans_chunks_by_tokens(templates: Templates, counter: TokenCounter) -> None:
    history = chat(24, padding=400)
    model = window_model(history, templates, counter, padding=0)
    summary = await summarize(model, history, templates, counter=counter)
    labels = [label(request, templates) for request in model.requests]
    parts = len(labels) - 2
    assert parts >= 3
    assert labels == ["direct", *(f"part {index}/{parts}" for index in range(1, parts + 1)), f"merge {parts}"]
    assert [label(request, templates) for request in model.overflowed] == ["direct"]
    chunk_markers = [marker for request in model.requests[1:-1] for marker in markers(request.transcript)]
    assert chunk_markers == [f"FACT-{index}" for index in range(24)]
    assert markers(summary.text) == [f"FACT-{index}" for index in range(24)]


async def test_a_known_window_plans_merge_groups_by_tokens(templates: Templates, counter: TokenCounter) -> None:
    history = chat(24, padding=400)
    model = window_model(history, templates, counter, padding=400)  # two or three partials fill a merge
    summary = await summarize(model, history, templates, counter=counter)
    labels = [label(request, templates) for request in model.requests]
    parts = sum(text.startswith("part ") for text in labels)
    merges = [int(text.removeprefix("merge ")) for text in labels if text.startswith("merge ")]
    assert parts >= 3 and len(merges) >= 2 and max(merges) < parts
    # Every merge group was planned to fit.
    assert [label(request, templates) for request in model.overflowed] == ["direct"]
    assert markers(summary.text) == [f"FACT-{index}" for index in range(24)]


@pytest.mark.parametrize(
    ("history", "expected_labels"),
    [([{"role": "user", "content": "FACT-0 " + "z " * 3000 + "FACT-1"}], ["direct"]),
     ([{"role": "user", "content": "FACT-0 short"},
       {"role": "assistant", "content": "FACT-1 " + "z " * 3000 + "FACT-2"}],
      ["direct", "part 1/2", "part 2/2"])],
)
async def test_a_single_message_that_overflows_is_sent_with_its_middle_elided(
    history: list[Message], expected_labels: list[str], templates: Templates
) -> None:
    model = ScriptedModel(limit=1000)
    summary = await summarize(model, history, templates)
    labels = [label(request, templates) for request in model.requests]
    assert labels[:len(expected_labels)] == expected_labels
    marker_tail = templates.elision_marker(7).split("7", 1)[1]  # the marker's wording after its count
    elided = [request for request in model.requests if marker_tail in request.transcript]
    assert elided, "the summariser's copy carries the marker"
    assert all(len(request.transcript) <= 1000 for request in model.requests[-2:] if request not in model.overflowed)
    expected = markers(" ".join(str(message["content"]) for message in history))
    assert markers(summary.text) == expected, "both ends of the long message reach the summary"
    assert history[-1]["content"].endswith("FACT-2" if len(history) == 2 else "FACT-1"), "the input is untouched"


@pytest.mark.parametrize(
    "message",
    [{"role": "user", "content": "FACT-0 " + "q" * 40},  # too short to elide: the prompt itself is too big
     {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],  # no text to shorten
)
async def test_a_single_message_that_cannot_be_shortened_is_an_error(message: Message, templates: Templates) -> None:
    model = ScriptedModel(overflows=lambda request: True)
    with pytest.raises(SummarizerError, match="single message") as caught:
        await summarize(model, [message], templates)
    assert type(caught.value) is SummarizerError
    assert len(model.requests) == caught.value.calls == 1


async def test_eliding_one_message_stops_after_the_split_depth(templates: Templates) -> None:
    model = ScriptedModel(overflows=lambda request: True)
    with pytest.raises(SummarizerError, match="single message"):
        await summarize(model, [{"role": "user", "content": "word " * 200_000}], templates)
    assert len(model.requests) <= MAX_SPLIT_DEPTH + 1


async def test_partial_summaries_too_long_to_merge_stand_side_by_side(templates: Templates) -> None:
    model = ScriptedModel(overflows=lambda request: "partial summaries" in request.instruction
                          or len(request.transcript) > 3000)
    summary = await summarize(model, chat(8, padding=500), templates)
    assert [label(request, templates) for request in model.requests] == [
        "direct", "part 1/2", "part 2/2", "merge 2"]
    assert summary.strategy == "chunked" and summary.structured is None
    assert markers(summary.text) == [f"FACT-{index}" for index in range(8)], "both parts, whole, oldest first"


async def test_no_messages_is_an_error_without_a_request(templates: Templates) -> None:
    model = ScriptedModel()
    with pytest.raises(SummarizerError, match="no messages"):
        await summarize(model, [], templates)
    assert model.requests == []


# --- replies that are not summaries -----------------------------------------------------------------------

@pytest.mark.parametrize(("chunked", "expected_calls"), [(False, 1), (True, 2)], ids=["direct", "chunk"])
async def test_a_reply_cut_off_by_the_output_limit_is_not_accepted(
    chunked: bool, expected_calls: int, templates: Templates
) -> None:
    history = chat(8, padding=500)
    # A truncated part is not split further: the merge would need at least as much output.
    model = ScriptedModel(limit=len(format_transcript(history[4:])) if chunked else None, finish_reason="length")
    with pytest.raises(SummaryTruncated) as caught:
        await summarize(model, history, templates)
    assert len(model.requests) == caught.value.calls == expected_calls
    assert caught.value.usage == REPORTED_USAGE  # the cut-off reply was billed; the overflowed request was not


@pytest.mark.parametrize("finish_reason", ["stop", None])
async def test_a_reply_that_finished_normally_is_accepted(finish_reason: str | None, templates: Templates) -> None:
    summary = await summarize(ScriptedModel(finish_reason=finish_reason), chat(2), templates)
    assert markers(summary.text) == ["FACT-0", "FACT-1"]


@pytest.mark.parametrize("content", ["", "  \n\t", None, [], [{"type": "text", "text": " "}], 42])
async def test_an_empty_reply_is_an_error(content: Any, templates: Templates) -> None:
    with pytest.raises(SummarizerError, match="empty") as caught:
        await summarize(ScriptedModel(reply=content), chat(2), templates)
    assert type(caught.value) is SummarizerError


async def test_a_reply_in_text_parts_is_joined(templates: Templates) -> None:
    parts = [{"type": "text", "text": "first half, "}, {"type": "text", "text": "second half"}]
    summary = await summarize(ScriptedModel(reply=parts), chat(2), templates, evidence_room=None)
    assert summary.text == "first half, second half"


@pytest.mark.parametrize(
    "error", [RuntimeError("boom"), ValueError("bad json"), TimeoutError(), ConnectionResetError("reset")])
async def test_other_model_errors_become_summarizer_errors(error: Exception, templates: Templates) -> None:
    with pytest.raises(SummarizerError) as caught:
        await summarize(RaisingModel(error), chat(2), templates)
    assert caught.value.__cause__ is error and caught.value.calls == 1
    assert type(error).__name__ in str(caught.value)


@pytest.mark.parametrize("error", [SummarizerError("adapter gave up"), SummaryTruncated("cut")])
async def test_summarizer_errors_from_the_model_pass_through(error: SummarizerError, templates: Templates) -> None:
    with pytest.raises(type(error)) as caught:
        await summarize(RaisingModel(error), chat(2), templates)
    assert caught.value is error


async def test_cancellation_is_not_wrapped(templates: Templates) -> None:
    with pytest.raises(asyncio.CancelledError):
        await summarize(RaisingModel(asyncio.CancelledError()), chat(2), templates)


class ShapelessModel:
    def __init__(self, result: Any) -> None:
        self.result = result

    async def complete(self, system: str, messages: list[Message]) -> Any:
        return self.result


@pytest.mark.parametrize("result", [None, "text", ({"content": "x"},), ("not a message", {})])
async def test_a_malformed_model_result_is_an_error(result: Any, templates: Templates) -> None:
    with pytest.raises(SummarizerError):
        await summarize(ShapelessModel(result), chat(2), templates)


# --- usage ------------------------------------------------------------------------------------------------

async def test_usage_is_summed_over_every_call_that_got_a_reply(templates: Templates) -> None:
    history = chat(8, padding=500)
    model = ScriptedModel(limit=len(format_transcript(history[:4])))
    summary = await summarize(model, history, templates)
    assert summary.calls == 4  # the first request overflowed: nothing to bill
    assert summary.usage == {key: value * 3 for key, value in REPORTED_USAGE.items()}


def estimate(request: Request, reply: str, counter: TokenCounter) -> dict[str, int]:
    prompt = counter.count_messages([{"role": "system", "content": request.system}, *request.messages])
    completion = counter.count_text(reply)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@pytest.mark.parametrize("usage", [None, {}, {"prompt_tokens": None}, "n/a", {"prompt_tokens": True}])
async def test_missing_usage_is_estimated(usage: Any, templates: Templates, counter: TokenCounter) -> None:
    model = ScriptedModel(usage=usage, reply="a plain summary of the chat")
    summary = await summarize(model, chat(4), templates, counter=counter)
    expected = estimate(model.requests[0], "a plain summary of the chat", counter)
    assert summary.usage == expected and expected["prompt_tokens"] > 400 and expected["completion_tokens"] > 0


async def test_partial_usage_is_completed_by_estimate(templates: Templates, counter: TokenCounter) -> None:
    model = ScriptedModel(usage={"prompt_tokens": 7}, reply="a plain summary")
    summary = await summarize(model, chat(2), templates, counter=counter)
    completion = counter.count_text("a plain summary")
    assert summary.usage == {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}


async def test_estimated_usage_is_summed_across_chunks(templates: Templates, counter: TokenCounter) -> None:
    history = chat(8, padding=500)
    model = ScriptedModel(limit=len(format_transcript(history[:4])), usage=None)
    summary = await summarize(model, history, templates, counter=counter)
    answered = model.requests[1:]
    expected = [estimate(request, echo_reply(request.transcript, 0), counter) for request in answered]
    assert summary.usage == {key: sum(item[key] for item in expected) for key in expected[0]}


# --- the summary ------------------------------------------------------------------------------------------

async def test_structured_reply_is_rendered(templates: Templates) -> None:
    reply = ("<analysis>notes</analysis>\n```json\n"
             + json.dumps({"user_intent": ["ship it"], "next_step": "run `make release`"}) + "\n```")
    summary = await summarize(ScriptedModel(reply=reply), chat(2), templates, evidence_room=None)
    assert summary.structured is not None and summary.structured.user_intent == ("ship it",)
    assert summary.text.startswith("# Conversation Summary") and "## Next Step" in summary.text
    assert "notes" not in summary.text
    assert summary.message == {"role": "user", "content": summary.text}


async def test_unparsable_reply_is_kept_verbatim(templates: Templates) -> None:
    reply = "  The user asked for retries; see proxy/app.py.\n```json\n{\"user_intent\": [\"cut off"
    summary = await summarize(ScriptedModel(reply=reply), chat(2), templates, evidence_room=None)
    assert summary.structured is None
    assert summary.text == reply and summary.message == {"role": "user", "content": reply}


# --- concurrency ------------------------------------------------------------------------------------------

async def test_concurrent_summaries_on_one_model_do_not_interfere(templates: Templates) -> None:
    histories = [chat(4 + task, padding=300 * (task % 3), tag=f"t{task}.") for task in range(10)]
    limit = len(format_transcript(chat(6, padding=300)))

    async def alone(history: list[Message]) -> Summary:
        return await summarize(ScriptedModel(limit=limit), history, templates)

    expected = [await alone(history) for history in histories]
    shared = ScriptedModel(limit=limit)
    results = await asyncio.gather(*(summarize(shared, history, templates) for history in histories))
    assert list(results) == expected
    assert {summary.strategy for summary in results} == {"direct", "chunked"}
    for task, summary in enumerate(results):
        assert markers(summary.text) == [f"FACT-t{task}.{index}" for index in range(4 + task)]
    assert len(shared.requests) == sum(summary.calls for summary in expected)


@pytest.mark.parametrize("max_calls", [1, 3, 6])
async def test_calls_per_summary_are_capped(max_calls: int, templates: Templates) -> None:
    history = chat(16, padding=200)
    model = ScriptedModel(limit=len(format_transcript(history[-4:])), padding=50)  # needs 11 calls uncapped
    with pytest.raises(SummarizerError, match=f"more than {max_calls}") as caught:
        await summarize(model, history, templates, max_calls=max_calls)
    assert len(model.requests) == max_calls == caught.value.calls


async def test_the_deadline_covers_the_whole_summary(templates: Templates) -> None:
    class SlowModel(ScriptedModel):
        async def complete(self, system: str, messages: list[Message]) -> tuple[Message, Any]:
            await asyncio.sleep(0.2)  # each call is well within any per-call limit; together they are not
            return await super().complete(system, messages)

    history = chat(16, padding=200)
    model = SlowModel(limit=len(format_transcript(history[-4:])), padding=50)
    started = asyncio.get_running_loop().time()
    with pytest.raises(SummarizerError, match="deadline") as caught:
        await summarize(model, history, templates, deadline=0.5)
    assert asyncio.get_running_loop().time() - started < 1.0
    assert caught.value.calls >= len(model.requests) >= 2  # the call cut short by the deadline counts too


class PrefixModel:
    """Records (system, messages, tools) of every request; overflows every request with a system of None."""

    def __init__(self, *, prefix_overflows: bool = False) -> None:
        self.calls: list[tuple[str | None, list[Message], Any]] = []
        self.prefix_overflows = prefix_overflows

    async def complete(self, system: str | None, messages: list[Message], tools: Any = None) -> tuple[Message, Any]:
        self.calls.append((system, messages, tools))
        if system is None and self.prefix_overflows:
            raise SummarizerOverflow("prompt is too long")
        seen = system if system is not None else json.dumps(messages)
        return {"role": "assistant", "content": echo_reply(seen, 0)}, REPORTED_USAGE


TOOLS = [{"type": "function", "function": {"name": "run_step", "parameters": {"type": "object"}}}]


async def test_the_prefix_layout_sends_the_conversation_as_it_was_then_one_instruction(templates: Templates) -> None:
    system = {"role": "system", "content": "You are an agent."}
    sent = (system, *tool_history(3, result_size=20))
    model = PrefixModel()
    summary = await summarize(model, list(sent[1:]), templates,
                              prefix=ConversationPrefix(sent, TOOLS, "Understood."))
    assert summary.strategy == "prefix" and summary.calls == 1
    [(sent_system, messages, tools)] = model.calls
    assert sent_system is None and tools is TOOLS
    assert messages[:len(sent)] == list(sent), "the conversation's own messages, unchanged, come first"
    assert messages[len(sent):] == [{"role": "user", "content": templates.compaction_request()}]
    assert summary.structured is not None and list(summary.structured.user_intent) == markers(json.dumps(sent))


async def test_a_prefix_ending_with_a_user_message_gets_the_acknowledgement_between(templates: Templates) -> None:
    sent = ({"role": "system", "content": "s"}, {"role": "user", "content": "FACT-1"})
    model = PrefixModel()
    await summarize(model, list(sent[1:]), templates, prefix=ConversationPrefix(sent, None, "Understood."))
    [(_, messages, tools)] = model.calls
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"] and tools is None
    assert messages[2]["content"] == "Understood."


async def test_a_prefix_that_overflows_falls_back_to_the_transcript(templates: Templates) -> None:
    history = tool_history(3, result_size=20)
    model = PrefixModel(prefix_overflows=True)
    summary = await summarize(model, history, templates,
                              prefix=ConversationPrefix(({"role": "system", "content": "s"}, *history), TOOLS))
    assert summary.strategy == "direct" and summary.calls == 2
    (first, _, _), (second, _, tools) = model.calls
    assert first is None and second == templates.compaction_prompt(format_transcript(history)) and tools is None


class FittedModel(PrefixModel):
    """A model whose client reports the output a request gets (as proxy.model_client does)."""

    context_window = 3072
    max_output_tokens = 800

    def __init__(self, room: int | Exception) -> None:
        super().__init__()
        self.room = room
        self.measured: list[list[Message]] = []

    def output_limit(self, messages: list[Message]) -> int:
        self.measured.append(messages)
        if isinstance(self.room, Exception):
            raise self.room
        return self.room


@pytest.mark.parametrize(("room", "stated"), [(500, 500), (800, 800), (1200, 800),
                                              (SummarizerOverflow("no room"), 800)])
@pytest.mark.parametrize("layout", ["prefix", "transcript"])
async def test_the_prompt_states_the_output_the_request_gets(templates: Templates, layout: str,
                                                             room: int | Exception, stated: int) -> None:
    # An ask beyond the part that must fit whole gives way to a long prompt; a model told 800 tokens and given
    # 500 runs past its limit and is cut off, so the prompt states what the request gets.
    history = tool_history(3, result_size=20)
    model = FittedModel(room)
    prefix = ConversationPrefix(({"role": "system", "content": "s"}, *history), TOOLS) if layout == "prefix" else None
    await summarize(model, history, templates, prefix=prefix)
    [(system, messages, _)] = model.calls
    sent = system if system is not None else str(messages[-1]["content"])
    assert f"fit in {stated} tokens" in sent
    assert "fit in 800 tokens" in json.dumps(model.measured[0]), "measured as first built, with the ask"


async def test_the_prompt_is_the_short_form_on_a_small_window(templates: Templates) -> None:
    model = ScriptedModel(context_window=1024)
    await summarize(model, chat(4), templates)
    assert model.requests[0].system == templates.compaction_prompt(format_transcript(chat(4)), window=1024)
    assert "<analysis>" not in model.requests[0].system
