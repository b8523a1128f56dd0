"""Structured summariser output over real sockets: which response_format goes out, and what refusals teach."""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.config import ConfigError, SummarizerConfig, settings_from_mapping
from proxy.core.tokens import TokenCounter
from proxy.summarizer.model_client import ModelClient
from proxy.summarizer.structured_output import FormatMemory, refuses, response_format
from proxy.summarizer.summarizer import SummarizerError, SummaryTruncated, summarize
from proxy.summarizer.summary import FIELD_NAMES, StructuredSummary, summary_text
from proxy.summarizer.summary_schema import CHARS_PER_TOKEN, SCHEMA_NAME, summary_schema
from proxy.summarizer.templates import Templates
from proxy.upstream.upstream import Upstream, create_session
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream, completion
from tests.fakes.summariser_requests import is_summarizer_request
from tests.sdk import async_client

SUMMARY = {"user_intent": ["fix the crash in app.py"], "technical_concepts": ["aiohttp"],
           "files": [{"path": "app.py", "summary": "the handler that crashed"}], "errors_and_fixes": [],
           "problem_solving": [], "user_messages": ["please fix the crash"], "pending_tasks": [],
           "current_work": "patching app.py"}
PARSABLE = f"<analysis>short notes</analysis>\n```json\n{json.dumps(SUMMARY)}\n```"
UNPARSABLE = "The user wanted the crash in app.py fixed; I looked at the handler and patched it."
# llama-cpp-python's server answers 500 to `json_schema` but honours llama.cpp's `json_object` + `schema`.
LLAMA_CPP_PYTHON = {"json_schema": (500, {"error": {"message": "Internal Server Error", "type": "internal_server_error",
                                                    "param": None, "code": None}})}
REFUSES_BOTH = {"json_schema": (400, {"error": {"message": "response_format type 'json_schema' is not supported",
                                                "type": "invalid_request_error"}}),
                "json_object": (422, {"detail": "schema-constrained decoding (grammar) is unavailable"})}


@dataclass
class Summariser:
    """A summariser upstream: which response_format types it refuses (and how), and whether plain replies parse."""

    refusals: dict[str, tuple[int, Any]] = field(default_factory=dict)
    plain_parses: bool = False
    plain_cut_off: bool = False  # plain replies run to their output limit, as a small model's loop does
    down: bool = False
    seen: list[dict[str, Any]] = field(default_factory=list)

    def formats(self, model: str | None = None) -> list[str | None]:
        """The response_format type of every summariser request so far (None: plain), oldest first."""
        return [(body.get("response_format") or {}).get("type") for body in self.seen
                if model is None or body.get("model") == model]

    async def __call__(self, request: web.Request, body: dict[str, Any],
                       state: FakeUpstream) -> web.StreamResponse | None:
        if not is_summarizer_request(body.get("messages") or []):
            return None  # a chat request: the fake's default echo
        self.seen.append(body)
        kind = (body.get("response_format") or {}).get("type")
        if self.down:
            return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
        if kind in self.refusals:
            status, payload = self.refusals[kind]
            return web.json_response(payload, status=status)
        text = json.dumps(SUMMARY) if kind else PARSABLE if self.plain_parses else UNPARSABLE
        answer = completion(body, text)
        if self.plain_cut_off and kind is None:
            answer["choices"][0]["finish_reason"] = "length"
        return web.json_response(answer)


@pytest.fixture
def summariser(fake: FakeUpstream) -> Summariser:
    server = Summariser()
    fake.chat_hook = server
    return server


ClientFactory = Callable[..., ModelClient]


@pytest.fixture
def client(upstream: Upstream) -> ClientFactory:
    """A new ModelClient per summary, as the proxy makes one; they share the upstream's memory."""
    def make(mode: str = "auto", model: str = "small", on: Upstream = upstream) -> ModelClient:
        return ModelClient(on, model, {"Authorization": "Bearer sk-test"}, max_output_tokens=512,
                           context_window=None, timeout=10, estimate=lambda messages: 100,
                           structured_output=mode)  # type: ignore[arg-type]
    return make


def history(index: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"please fix crash {index} in app.py"},
            {"role": "assistant", "content": f"Patched crash {index}."}]


async def summarise(client: ModelClient, index: int = 0) -> str:
    """The reply as summarised, without evidence added (these tests are about the reply's format)."""
    return (await summarize(client, history(index), evidence_room=None)).text


# --- the schema and the bare-JSON reply ---------------------------------------------------------------------


def test_the_schema_names_the_fields_of_the_summary() -> None:
    schema = summary_schema()
    assert list(schema["properties"]) == list(FIELD_NAMES)
    assert set(schema["required"]) == set(FIELD_NAMES) - {"current_work", "next_step"}
    assert schema["properties"]["user_intent"] == {"type": "array", "items": {"type": "string"}}
    assert schema["properties"]["next_step"] == {"type": "string"}
    files = schema["properties"]["files"]["items"]
    assert list(files["properties"]) == ["path", "summary", "key_code"] and files["required"] == ["path"]
    assert schema["additionalProperties"] is False


def test_response_format_shapes() -> None:
    assert response_format("json_schema") == {"type": "json_schema", "json_schema": {
        "name": SCHEMA_NAME, "schema": summary_schema(), "strict": False}}
    assert response_format("json_object") == {"type": "json_object", "schema": summary_schema()}


@pytest.mark.parametrize("reply", [json.dumps(SUMMARY), "\n  " + json.dumps(SUMMARY, indent=2) + "\n"])
def test_a_bare_json_object_parses(reply: str) -> None:
    """A schema-constrained reply is plain JSON, no <analysis> and no fence: the object at the very start."""
    parsed = StructuredSummary.parse(reply)
    assert parsed is not None and parsed.user_intent == ("fix the crash in app.py",)
    assert parsed.files[0].path == "app.py" and parsed.current_work == "patching app.py"
    assert summary_text(reply).startswith("# Conversation Summary")


@pytest.mark.parametrize(("status", "body", "accepted_before", "refused"), [
    (500, b"Internal Server Error", False, True),  # any 5xx to a format's first use
    (503, b"", False, True),
    (503, b"", True, False),  # once a format worked, a 5xx is just an error
    (500, b'{"error": "grammar failed to compile"}', True, True),
    (400, b'{"error": {"message": "Unknown response_format type"}}', True, True),
    (422, b'{"detail": "json_schema not supported"}', False, True),
    (400, b'{"error": {"message": "invalid temperature"}}', False, False),
    (401, b'{"error": {"message": "bad key for response_format"}}', False, False),
    (200, b'{"choices": []}', False, False),
])
def test_what_counts_as_a_refusal(status: int, body: bytes, accepted_before: bool, refused: bool) -> None:
    assert refuses(status, body, accepted_before=accepted_before) is refused


def test_the_config_key_defaults_to_auto_and_rejects_other_values() -> None:
    assert SummarizerConfig().structured_output == "auto"
    settings = settings_from_mapping({"compaction": {"summarizer": {"structured_output": "json_object"}}}, env={})
    assert settings.compaction.summarizer.structured_output == "json_object"
    with pytest.raises(ConfigError, match=r"compaction\.summarizer\.structured_output"):
        settings_from_mapping({"compaction": {"summarizer": {"structured_output": "always"}}}, env={})


def test_the_memory_is_bounded() -> None:
    memory = FormatMemory(unparsed_before_constraining=1, max_remembered=2)
    for model in ("a", "b", "c"):
        memory.note_plain_reply(("u", model), parsed=False)
    assert not memory.is_constrained(("u", "a")) and memory.is_constrained(("u", "c"))


# --- ModelClient and summarize over a real socket ----------------------------------------------------------


async def test_off_never_sends_response_format(summariser: Summariser, client: ClientFactory) -> None:
    for index in range(4):
        assert await summarise(client("off"), index) == UNPARSABLE  # the raw reply: the lossless fallback
    assert summariser.formats() == [None] * 4


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
async def test_a_named_format_is_always_sent(summariser: Summariser, client: ClientFactory, mode: str) -> None:
    summariser.plain_parses = True
    for index in range(3):
        assert (await summarise(client(mode), index)).startswith("# Conversation Summary\n\n## User Intent")
    assert summariser.formats() == [mode] * 3
    assert all(body["response_format"] == response_format(mode, body["max_tokens"])  # type: ignore[arg-type]
               for body in summariser.seen)
    assert all("tools" not in body for body in summariser.seen)


async def test_auto_starts_plain_and_constrains_after_two_unparsable_replies(
        summariser: Summariser, client: ClientFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="proxy.model_client")
    await summarise(client(), 0)
    assert summariser.formats() == [None]
    await summarise(client(), 1)
    assert "keep failing to parse" in caplog.text
    assert (await summarise(client(), 2)).startswith("# Conversation Summary")  # bare JSON, rendered
    await summarise(client(), 3)
    assert summariser.formats() == [None, None, "json_schema", "json_schema"]


async def test_auto_stays_plain_while_replies_parse(summariser: Summariser, client: ClientFactory) -> None:
    """Only failures in a row count: one parsable reply in between means the prompt works for this model."""
    for index, parses in enumerate([False, True, False, True, False, True]):
        summariser.plain_parses = parses
        await summarise(client(), index)
    assert summariser.formats() == [None] * 6


async def test_auto_against_llama_cpp_python_falls_back_to_json_object_once(
        summariser: Summariser, client: ClientFactory) -> None:
    summariser.refusals = LLAMA_CPP_PYTHON
    for index in range(2):
        await summarise(client(), index)
    assert (await summarise(client(), 2)).startswith("# Conversation Summary")  # the refusal failed nothing
    for index in range(3, 5):
        await summarise(client(), index)
    # json_schema's 500 cost exactly one extra request, once; it is never sent again.
    assert summariser.formats() == [None, None, "json_schema", "json_object", "json_object", "json_object"]


async def test_auto_against_a_server_that_refuses_both_formats(summariser: Summariser, client: ClientFactory) -> None:
    summariser.refusals = REFUSES_BOTH
    for index in range(4):
        assert await summarise(client(), index) == UNPARSABLE
    assert summariser.formats() == [None, None, "json_schema", "json_object", None, None]


async def test_a_limited_client_asks_for_less_and_shares_what_it_learns(summariser: Summariser,
                                                                       client: ClientFactory) -> None:
    """The client of one part of a history in parts: its ask is capped, and the refusal it meets is known to the
    client of the merge, which keeps its own ask."""
    summariser.refusals = LLAMA_CPP_PYTHON
    whole = client()
    part = whole.limited(200)
    for index in range(3):
        await summarise(part, index)
    await summarise(whole, 3)
    assert summariser.formats() == [None, None, "json_schema", "json_object", "json_object"]
    assert [body["max_tokens"] for body in summariser.seen] == [200, 200, 200, 200, 512]
    assert (whole.max_output_tokens, part.max_output_tokens, whole.limited(4096).max_output_tokens) == (512, 200, 512)


async def test_refusals_are_remembered_per_model(summariser: Summariser, client: ClientFactory) -> None:
    summariser.refusals = LLAMA_CPP_PYTHON
    for index in range(3):
        await summarise(client(model="small"), index)
    await summarise(client(model="other"), 0)
    assert summariser.formats("other") == [None]  # a second model on the same upstream starts plain
    await summarise(client(model="other"), 1)
    await summarise(client(model="other"), 2)
    # ... and learns on its own: the first model's refusal is not assumed for it.
    assert summariser.formats("other") == [None, None, "json_schema", "json_object"]
    await summarise(client(model="small"), 3)
    assert summariser.formats("small") == [None, None, "json_schema", "json_object", "json_object"]


async def test_refusals_are_remembered_per_upstream(summariser: Summariser, client: ClientFactory,
                                                    upstream: Upstream) -> None:
    summariser.refusals = LLAMA_CPP_PYTHON
    for index in range(3):
        await summarise(client("json_schema"), index)
    async with create_session(upstream.config) as session:
        other = Upstream(session, upstream.config)  # another app's upstream: a memory of its own
        await summarise(client("json_schema", on=other), 3)
    assert summariser.formats() == ["json_schema", None, None, None, "json_schema", None]


async def test_a_named_format_that_is_refused_is_dropped_after_one_retry(
        summariser: Summariser, client: ClientFactory) -> None:
    summariser.refusals = LLAMA_CPP_PYTHON
    summariser.plain_parses = True
    for index in range(3):
        assert (await summarise(client("json_schema"), index)).startswith("# Conversation Summary")
    assert summariser.formats() == ["json_schema", None, None, None]


async def test_a_server_that_is_down_is_not_taken_for_a_refusal(summariser: Summariser,
                                                                client: ClientFactory) -> None:
    summariser.down = True
    with pytest.raises(SummarizerError, match="status 503"):
        await summarise(client("json_object"), 0)
    summariser.down = False
    await summarise(client("json_object"), 1)
    # The plain retry failed the same way, so json_object was not to blame and is sent again.
    assert summariser.formats() == ["json_object", None, "json_object"]


async def test_a_format_that_worked_is_not_dropped_for_a_later_5xx(summariser: Summariser,
                                                                   client: ClientFactory) -> None:
    await summarise(client("json_schema"), 0)
    summariser.down = True
    with pytest.raises(SummarizerError, match="status 503"):
        await summarise(client("json_schema"), 1)
    summariser.down = False
    await summarise(client("json_schema"), 2)
    assert summariser.formats() == ["json_schema", "json_schema", "json_schema"]


async def test_an_overflow_under_a_format_is_not_a_refusal(summariser: Summariser, client: ClientFactory,
                                                           fake: FakeUpstream) -> None:
    """The tool-result ladder retries an overflowing prompt; the format stays, even after a 5xx overflow."""
    overflowed: list[bool] = []

    async def overflow_once(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        if not overflowed:
            overflowed.append(True)
            summariser.seen.append(body)
            return web.json_response({"error": {"message": "This model's maximum context length is 100 tokens",
                                                "code": "context_length_exceeded"}}, status=500)
        answer = await summariser(request, body, state)
        assert answer is not None
        return answer

    fake.chat_hook = overflow_once
    messages = [{"role": "user", "content": "run the tests"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "shell", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "huge output " * 50}]
    summary = await summarize(client("json_schema"), messages)
    assert summary.strategy == "removed_tool_results_10"
    assert summariser.formats() == ["json_schema", "json_schema"]


# --- through the proxy --------------------------------------------------------------------------------------


def conversation(index: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(3):
        turns += [{"role": "user", "content": f"conversation {index}: step {turn}, change module_{turn}.py"},
                  {"role": "assistant", "content": f"Changed module_{turn}.py."}]
    return [*turns, {"role": "user", "content": f"conversation {index}: what next?"}]


async def compact_through(proxy_url: str, count: int, model: str = "small") -> None:
    client = async_client(proxy_url)
    for index in range(count):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=conversation(index),  # type: ignore[arg-type]
            extra_headers={"x-compaction-mode": "force"})
        assert raw.headers["x-compaction"] == "forced"
        assert raw.parse().choices[0].message.content == f"echo: conversation {index}: what next?"


async def test_the_proxy_by_default_learns_llama_cpp_pythons_format(summariser: Summariser,
                                                                     make_proxy: ProxyFactory) -> None:
    summariser.refusals = LLAMA_CPP_PYTHON
    proxy = await make_proxy({"compaction": {"background": False}})
    await compact_through(proxy.url, 4)
    assert summariser.formats() == [None, None, "json_schema", "json_object", "json_object"]
    await compact_through(proxy.url, 1, model="other")
    assert summariser.formats("other") == [None]


async def test_the_proxys_summaries_under_a_schema_are_rendered(summariser: Summariser,
                                                                make_proxy: ProxyFactory, fake: FakeUpstream) -> None:
    proxy = await make_proxy({"compaction": {"background": False}})
    await compact_through(proxy.url, 3)
    forwarded = [body for body in fake.chat_requests()
                 if body["messages"][0]["content"] == "You are terse." and not is_summarizer_request(body["messages"])]
    assert UNPARSABLE in json.dumps(forwarded[0]["messages"])  # raw fallback while plain
    assert "# Conversation Summary" in forwarded[2]["messages"][1]["content"]
    assert summariser.formats() == [None, None, "json_schema"]


@pytest.mark.parametrize(("mode", "expected"), [("off", [None] * 3), ("json_object", ["json_object"] * 3)])
async def test_the_proxy_honours_the_configured_mode(summariser: Summariser, make_proxy: ProxyFactory,
                                                     mode: str, expected: list[str | None]) -> None:
    proxy = await make_proxy({"compaction": {"background": False, "summarizer": {"structured_output": mode}}})
    await compact_through(proxy.url, 3)
    assert summariser.formats() == expected


async def test_a_plain_client_session_sees_no_difference(summariser: Summariser, make_proxy: ProxyFactory) -> None:
    """Refusals stay between the proxy and the summariser: the client's answer is the ordinary one."""
    summariser.refusals = REFUSES_BOTH
    proxy = await make_proxy({"compaction": {"background": False}})
    async with aiohttp.ClientSession() as session:
        for index in range(3):
            async with session.post(f"{proxy.url}/v1/chat/completions",
                                    json={"model": "small", "messages": conversation(index)},
                                    headers={"x-compaction-mode": "force"}) as response:
                assert response.status == 200 and response.headers["x-compaction"] == "forced"
    assert summariser.formats() == [None, None, "json_schema", "json_object", None]


@pytest.mark.parametrize("limit", [128, 256, 1024, 4096, 16384])
def test_a_bounded_schema_filled_to_every_bound_still_fits_its_limit(limit: int) -> None:
    """The worst reply the grammar allows: every list at its most items, every string at its most characters."""
    schema = summary_schema(limit)
    counter = TokenCounter()
    rng = random.Random(limit)
    # A summary's kind of text: the prompt's words, exact paths, numbers and error codes, shuffled.
    words = re.findall(r"[\w/.-]+", Templates().compaction_prompt("")) + \
        [f"src/billing/ledger_{n:04x}.py" for n in range(50)] + [f"E{n}:" for n in range(1000, 1100)] + \
        [str(rng.randint(0, 99999)) for _ in range(50)]

    def fill(node: dict[str, Any]) -> Any:
        if node["type"] == "string":
            return " ".join(rng.choice(words) for _ in range(node["maxLength"]))[:node["maxLength"]]
        if node["type"] == "array":
            return [fill(node["items"]) for _ in range(node["maxItems"])]
        return {name: fill(child) for name, child in node["properties"].items()}

    worst = json.dumps(fill(schema))
    assert counter.count_text(worst) <= limit, (counter.count_text(worst), len(worst) / CHARS_PER_TOKEN)
    assert summary_schema(None) == summary_schema() and "maxLength" not in json.dumps(summary_schema())


async def test_a_plain_reply_cut_off_is_retried_once_under_the_bounded_schema(summariser: Summariser,
                                                                             client: ClientFactory) -> None:
    summariser.plain_cut_off = True
    assert (await summarise(client(), 0)).startswith("# Conversation Summary")
    assert summariser.formats() == [None, "json_schema"]
    assert summariser.seen[1]["response_format"] == response_format("json_schema", 512)
    # That retry was for one request: the next summary starts plain; two cut-off replies in a row then move the
    # model to constrained output, like two that did not parse.
    await summarise(client(), 1)
    await summarise(client(), 2)
    assert summariser.formats() == [None, "json_schema", None, "json_schema", "json_schema"]


@pytest.mark.parametrize("mode", ["off", "json_schema"])
async def test_a_cut_off_reply_is_not_retried_outside_auto(mode: str, summariser: Summariser,
                                                          client: ClientFactory) -> None:
    summariser.plain_cut_off = True
    if mode == "json_schema":
        summariser.refusals = {"json_schema": (400, {"error": {"message": "json_schema is not supported"}})}
    with pytest.raises(SummaryTruncated):
        await summarise(client(mode), 0)
    assert summariser.formats() == ([None] if mode == "off" else ["json_schema", None])


async def test_a_cut_off_reply_is_not_retried_when_every_format_was_refused(summariser: Summariser,
                                                                           client: ClientFactory) -> None:
    summariser.refusals = REFUSES_BOTH
    for index in range(3):  # two unparsable replies, then both formats tried and refused
        await summarise(client(), index)
    assert summariser.formats() == [None, None, "json_schema", "json_object", None]
    summariser.plain_cut_off = True
    with pytest.raises(SummaryTruncated):
        await summarise(client(), 3)
    assert summariser.formats()[5:] == [None]
