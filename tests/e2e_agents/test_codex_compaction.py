"""`codex exec` (the pinned npm build) on its built-in OpenAI provider, pointed at the proxy: Codex compacts by
itself (remote compaction v2: a request whose last input item is `compaction_trigger`), the proxy answers that
request with its own compaction item, and opens the item into its summary on every later request.

What codex 0.171.0 needs to get there (found by running it against a fake on 127.0.0.1):
- the built-in provider, moved by `openai_base_url` in config.toml (OPENAI_BASE_URL is not read for it), and
  CODEX_API_KEY as its key (OPENAI_API_KEY alone sends no Authorization from `codex exec`);
- no endpoint besides /v1/responses: no GET /v1/models with an API key;
- every request first tries a WebSocket upgrade (GET /v1/responses, `openai-beta: responses_websockets=...`).
  A 426 makes it fall back to HTTP POST at once (~0.1 s); a 404 costs 6 more tries and ~6 s before the first POST.
- every request says `x-codex-beta-features: remote_compaction_v2`; the trigger comes mid-turn (after a tool
  output), streamed, `x-codex-turn-metadata` saying `"request_kind":"compaction"`; Codex's next request is its
  developer and user messages, then the compaction item as it was answered (`id`, `encrypted_content`).

Between Codex and the proxy sits a tap that records what Codex sent and what the proxy answered, byte for byte."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.core.envelope import opened
from tests.conftest import ProxyFactory
from tests.e2e_agents.codex_cli import codex_binary, codex_exec, openai_codex_home
from tests.e2e_agents.test_codex_cli import outputs_answer_their_calls
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel

pytestmark = pytest.mark.agent_cli

ROUNDS = 8
WINDOW = 30_000  # the upstream's window, and the proxy's; Codex's own instructions and tools are ~11,000 tokens
# Codex compacts when a response's total_tokens reaches min(this, 0.9 * model_context_window): ~3 rounds in.
CODEX_CONFIG = f"model_context_window = {WINDOW}\nmodel_auto_compact_token_limit = 18000\n"
TASK = "Count to a few thousand with seq, several times, and tell me when you are done."
SUMMARY = "recording facts"  # what the fake summariser (WindowedModel) writes into every summary
TRIGGER_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                  "response.output_item.done", "response.completed"]
ENVELOPE = re.compile(r"cpx\d+\.")  # the proxy's envelopes, of any version (proxy.core.envelope)
FIRST_REQUEST_WITHIN = 5.0  # seconds; retrying a WebSocket that is not refused outright costs 5-10 s


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    answer: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Tap:
    """A pass-through in front of the proxy that keeps every request and answer."""

    target: str
    exchanges: list[Exchange] = field(default_factory=list)

    async def relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        exchange = Exchange(request.method, request.raw_path, dict(request.headers), body)
        self.exchanges.append(exchange)
        skip = {"host", "content-length", "accept-encoding", "transfer-encoding"}
        headers = {name: value for name, value in request.headers.items() if name.lower() not in skip}
        async with aiohttp.ClientSession(auto_decompress=False) as session, session.request(
                request.method, self.target + request.raw_path, headers=headers, data=body,
                allow_redirects=False) as upstream:
            exchange.status = upstream.status
            kept = {name: value for name, value in upstream.headers.items()
                    if name.lower() not in ("content-length", "transfer-encoding", "connection")}
            reply = web.StreamResponse(status=upstream.status, headers=kept)
            await reply.prepare(request)
            async for chunk in upstream.content.iter_any():
                exchange.answer += chunk
                await reply.write(chunk)
            await reply.write_eof()
            return reply

    def posts(self) -> list[Exchange]:
        return [x for x in self.exchanges if x.method == "POST" and x.path.startswith("/v1/responses")]


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[len("data:"):]) for line in raw.decode().splitlines() if line.startswith("data:")]


def item_types(body: dict[str, Any]) -> list[str]:
    return [str(item.get("type", "message")) for item in body["input"] if isinstance(item, dict)]


@pytest.fixture
def model(fake: FakeUpstream) -> ResponsesModel:
    responses = ResponsesModel(window=WINDOW, parallel_calls=1, tool="exec_command", finish_after=ROUNDS,
                               arguments=lambda turn, n: json.dumps({"cmd": f"seq {turn} {turn + 1500}"}))
    fake.responses_hook = responses
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return responses


async def test_codex_compacts_remotely_through_the_proxy(model: ResponsesModel, fake: FakeUpstream,
                                                         make_proxy: ProxyFactory, tmp_path: Path) -> None:
    binary = codex_binary()
    # The proxy's own threshold above Codex's: here Codex decides when to compact, the proxy only answers.
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "compaction": {"enabled": True, "threshold": 0.95}})
    tap = Tap(proxy.url)
    runner, tap_url = await serve_app(_tap_app(tap))
    try:
        workdir = tmp_path / "work"
        workdir.mkdir()
        env = openai_codex_home(tmp_path / "codex-home", tap_url, CODEX_CONFIG)
        started = time.monotonic()
        run = await codex_exec(binary, env, workdir, TASK, timeout=110)
    finally:
        await runner.cleanup()
    turns = [request.received_at for request in fake.requests if request.path == "/v1/responses"]
    first_request = turns[0] - started if turns else float("inf")
    print(f"codex ran {run.seconds:.1f} s; its first request reached the upstream {first_request:.2f} s after start; "
          f"Codex sent {sorted({(x.method, x.path) for x in tap.exchanges})}; {len(tap.posts())} POSTs from Codex, "
          f"{len(model.received)} at the upstream; the upstream saw {[r.path for r in fake.requests]}")

    # The task finished.
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"Done after {ROUNDS} rounds." in run.stdout, run.stdout[-2000:]

    # Codex asked for compactions itself, and each was answered by the proxy with exactly one compaction item.
    triggers = [x for x in tap.posts() if item_types(x.json())[-1:] == ["compaction_trigger"]]
    assert triggers, [item_types(x.json()) for x in tap.posts()]
    issued: list[str] = []
    for trigger in triggers:
        assert trigger.status == 200, trigger.answer[:2000]
        events = sse_events(trigger.answer)
        assert [event["type"] for event in events] == TRIGGER_EVENTS, trigger.answer[:3000]
        done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
        assert len(done) == 1 and done[0]["type"] == "compaction", done
        assert done[0]["id"].startswith("cmp_") and opened(done[0]["encrypted_content"]) is not None, done
        assert events[-1]["response"]["output"] == done, events[-1]
        issued.append(done[0]["encrypted_content"])
    # Codex carried the proxy's items on (its history after a compaction) ...
    carried = [item["encrypted_content"] for x in tap.posts() for item in x.json()["input"]
               if isinstance(item, dict) and item.get("type") == "compaction"]
    assert carried and set(carried) <= set(issued), (carried, issued)

    # ... and the upstream never saw an item of either kind, nor the envelope: it saw the summary instead.
    assert all(not {"compaction", "compaction_trigger"} & set(item_types(body)) for body in model.received), \
        [item_types(body) for body in model.received]
    assert not [body for body in model.received if ENVELOPE.search(json.dumps(body))]
    # Codex's requests went on one for one (a trigger is answered here); exactly those carrying a compaction item
    # reached the upstream with the summary in its place (and before Codex's first compaction, no summary at all).
    forwarded = [x.json() for x in tap.posts() if item_types(x.json())[-1:] != ["compaction_trigger"]]
    assert len(forwarded) == len(model.received), ([item_types(b) for b in forwarded],
                                                   [item_types(b) for b in model.received])
    summarised = [SUMMARY in json.dumps(body["input"]) for body in model.received]
    assert summarised == ["compaction" in item_types(body) for body in forwarded], summarised
    assert any(summarised)
    assert max(model.prompts) <= WINDOW

    # Every forwarded history is coherent: each tool output after its call.
    assert all(outputs_answer_their_calls(body) for body in model.received)

    # The 426 to Codex's WebSocket attempt sends it to HTTP at once.
    upgrades = [x for x in tap.exchanges if x.headers.get("Upgrade", "").lower() == "websocket"]
    assert upgrades and all(x.status == 426 for x in upgrades), [(x.path, x.status) for x in upgrades]
    assert first_request < FIRST_REQUEST_WITHIN, first_request


def _tap_app(tap: Tap) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", tap.relay)
    return app
