"""A fake coding agent and the model it talks to: one instruction, then round after round of parallel tool calls."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import openai
from aiohttp import web

from tests.fakes.openai_upstream import FakeUpstream, chunk, sse
from tests.fakes.windowed import Received, WindowedModel, _completion

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to finish the user's task."}
INSTRUCTION = {"role": "user", "content": "Fix the failing tests in src/ without touching vendor/. "
                                          "Run the suite after every change and report when it is green."}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} a path",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}
         for name in ("read_file", "run_tests")]
RESULT = re.compile(r"RESULT-\d+-\d+")


def tool_result(round_index: int, call_index: int, words: int) -> str:
    """A tool result with a unique marker, about `words` tokens long."""
    body = " ".join(f"line{round_index}x{call_index}x{n}" for n in range(words))
    return f"RESULT-{round_index}-{call_index}: {body}"


@dataclass
class AgentModel(WindowedModel):
    """Answers every chat request with parallel tool calls (two per round), in JSON or as an SSE stream."""

    calls_per_round: int = 2

    async def _answer(self, request: web.Request, body: dict[str, Any], prompt: int) -> web.StreamResponse:
        round_index = sum(1 for m in body["messages"] if m.get("role") == "assistant" and m.get("tool_calls"))
        calls = [{"id": f"call_{round_index}_{i}_{len(self.received)}", "type": "function",
                  "function": {"name": TOOLS[i % 2]["function"]["name"],
                               "arguments": json.dumps({"path": f"src/mod_{round_index}_{i}.py"})}}
                 for i in range(self.calls_per_round)]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        usage = {"prompt_tokens": prompt, "completion_tokens": 30, "total_tokens": prompt + 30}
        if not body.get("stream"):
            return web.json_response(_completion(body, message, prompt, usage))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk(body, {"role": "assistant", "content": None})))
        for index, call in enumerate(calls):
            await response.write(sse(chunk(body, {"tool_calls": [{"index": index, **call}]})))
        await response.write(sse(chunk(body, {}, "tool_calls")))
        if (body.get("stream_options") or {}).get("include_usage"):
            await response.write(sse({**chunk(body, {}), "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@dataclass
class AgentRun:
    history: list[dict[str, Any]] = field(default_factory=lambda: [SYSTEM, INSTRUCTION])
    headers: list[dict[str, str]] = field(default_factory=list)
    results: set[str] = field(default_factory=set)   # every tool-result marker the agent produced


async def _ask(client: openai.AsyncOpenAI, history: list[dict[str, Any]], stream: bool,
               run: AgentRun) -> dict[str, Any]:
    if not stream:
        raw = await client.chat.completions.with_raw_response.create(model="agent", messages=history, tools=TOOLS)
        run.headers.append(dict(raw.headers))
        return raw.parse().choices[0].message.model_dump(exclude_none=True)
    async with client.chat.completions.with_streaming_response.create(
            model="agent", messages=history, tools=TOOLS, stream=True) as response:
        run.headers.append(dict(response.headers))
        calls: dict[int, dict[str, Any]] = {}
        async for piece in await response.parse():
            for call in piece.choices[0].delta.tool_calls or ():
                calls.setdefault(call.index, {"id": call.id, "type": "function",
                                              "function": {"name": call.function.name, "arguments": ""}})
                calls[call.index]["function"]["arguments"] += call.function.arguments or ""
        return {"role": "assistant", "content": None, "tool_calls": [calls[i] for i in sorted(calls)]}


async def run_agent(client: openai.AsyncOpenAI, rounds: int, *, stream: bool = False, words: int = 17,
                    huge_round: int | None = None, huge_words: int = 0) -> AgentRun:
    """Drive `rounds` tool rounds, resending the whole history each time, as a stateless agent does."""
    run = AgentRun()
    for round_index in range(rounds):
        reply = await _ask(client, run.history, stream, run)
        assert reply.get("tool_calls"), "the agent's model stopped calling tools"
        run.history.append(reply)
        for call_index, call in enumerate(reply["tool_calls"]):
            size = huge_words if round_index == huge_round and call_index == 0 else words
            text = tool_result(round_index, call_index, size)
            run.results.add(text.split(":", 1)[0])
            run.history.append({"role": "tool", "tool_call_id": call["id"], "content": text})
    reply = await _ask(client, run.history, stream, run)
    run.history.append(reply)
    return run


def markers_seen(received: list[Received]) -> set[str]:
    return {marker for r in received for marker in RESULT.findall(json.dumps(r.body["messages"]))}


def fake_with(model: AgentModel, fake: FakeUpstream) -> AgentModel:
    fake.chat_hook = model
    return model
