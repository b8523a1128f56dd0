"""A scripted stateless client: many turns, tool loops included, resending the full history every time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import openai

SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
TOOL_TURN_EVERY = 6


def user_message(turn: int) -> dict[str, Any]:
    words = " ".join(f"note{turn}w{n}" for n in range(25))
    ask = "Also, what is the weather?" if turn % TOOL_TURN_EVERY == TOOL_TURN_EVERY - 1 else ""
    return {"role": "user", "content": f"Turn {turn}: remember FACT-{turn}. {words} {ask}".strip()}


@dataclass
class ScriptResult:
    headers: list[str] = field(default_factory=list)       # x-compaction of every request
    history: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0


async def _ask(client: openai.AsyncOpenAI, history: list[dict[str, Any]], stream: bool,
               result: ScriptResult, **options: Any) -> dict[str, Any]:
    result.requests += 1
    if not stream:
        raw = await client.chat.completions.with_raw_response.create(
            model="fake-small", messages=history, tools=TOOLS, **options)
        result.headers.append(raw.headers["x-compaction"])
        return raw.parse().choices[0].message.model_dump(exclude_none=True)
    async with client.chat.completions.with_streaming_response.create(
            model="fake-small", messages=history, tools=TOOLS, stream=True, **options) as response:
        result.headers.append(response.headers["x-compaction"])
        stream = await response.parse()
        return _assemble([chunk async for chunk in stream])


def _assemble(chunks: list[Any]) -> dict[str, Any]:
    """The assistant message a streaming client rebuilds from its deltas."""
    content, calls = "", {}
    for piece in chunks:
        assert piece.choices, "a usage-only chunk reached a client that did not ask for one"
        delta = piece.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            calls.setdefault(call.index, {"id": call.id, "type": "function",
                                          "function": {"name": call.function.name, "arguments": ""}})
            calls[call.index]["function"]["arguments"] += call.function.arguments or ""
    if calls:
        return {"role": "assistant", "content": None, "tool_calls": [calls[i] for i in sorted(calls)]}
    return {"role": "assistant", "content": content}


async def run_script(client: openai.AsyncOpenAI, turns: int, *, stream: bool = False,
                     **options: Any) -> ScriptResult:
    """Drive `turns` user turns; a tool call is answered and sent back, as an agent loop would.

    `options` go into every request as they are (`max_tokens=...`)."""
    result = ScriptResult(history=[SYSTEM])
    for turn in range(turns):
        result.history.append(user_message(turn))
        reply = await _ask(client, result.history, stream, result, **options)
        result.history.append(reply)
        while reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                city = json.loads(call["function"]["arguments"])["city"]
                result.history.append({"role": "tool", "tool_call_id": call["id"],
                                       "content": f"Sunny in {city}, 21 C, FACT-w{turn}"})
            reply = await _ask(client, result.history, stream, result, **options)
            result.history.append(reply)
    return result
