"""A fake Responses API model (`POST /v1/responses`) with a context window it enforces, as OpenAI's servers do:
every turn it thinks (an encrypted reasoning item) and calls tools in parallel, in JSON or in Responses SSE."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.core.tokens import TokenCounter

# OpenAI's words for an input past the window (the Agents SDK surfaced exactly this one).
OVERFLOW = {"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and "
                                 "try again.", "type": "invalid_request_error", "param": "input",
                      "code": "context_length_exceeded"}}
TOKENIZER_RATIO = 1.1  # the fake counts its own way, as a real server's tokenizer does


@dataclass
class ResponsesModel:
    window: int = 4000
    parallel_calls: int = 2
    tool: str = "read_file"
    # The JSON arguments of call `n` of turn `turn`.
    arguments: Callable[[int, int], str] = lambda turn, n: json.dumps({"path": f"src/file_{turn}_{n}.py"})
    finish_after: int | None = None  # answer in words, calling no tool, from this many responses on
    answer_results: bool = False  # answer in words whenever the input ends with a tool's output: one call a turn
    # How a prompt past the window is refused: "json" (400), "failed_response" (200, a failed response; streams get
    # "failed_event"), "failed_event" (a stream's preamble, then response.failed), "error_event" (then `error`).
    overflow: str = "json"
    refusal: tuple[int, str, str] | None = None  # (status, body, content type) served instead, as a provider sent it
    received: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)
    reasoning: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> the item as the model wrote it
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("cl100k_base"))
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        parts = [body.get("instructions"), body.get("input"), body.get("tools")]
        text = "".join(part if isinstance(part, str) else json.dumps(part) for part in parts if part is not None)
        return math.ceil(self.counter.count_text(text) * TOKENIZER_RATIO)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        prompt = self.prompt_tokens(body)
        self.prompts.append(prompt)
        if prompt + int(body.get("max_output_tokens") or 0) > self.window:
            return await self._refuse(request, body)
        response = self._response(body, prompt)
        if body.get("stream"):
            return await _stream(request, response)
        return web.json_response(response)

    async def _refuse(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.refusal is not None:
            status, text, content_type = self.refusal
            return web.Response(status=status, body=text.encode(), content_type=content_type)
        style = self.overflow
        if style == "json" or (not body.get("stream") and style != "failed_response"):
            return web.json_response(OVERFLOW, status=400)
        failed = {"id": "resp_failed", "object": "response", "created_at": 0, "status": "failed", "output": [],
                  "error": {"code": "context_length_exceeded", "message": OVERFLOW["error"]["message"]},
                  "usage": None}
        if not body.get("stream"):
            return web.json_response(failed)
        pending = {**failed, "status": "in_progress", "error": None}
        events = [{"type": "response.created", "response": pending},
                  {"type": "response.in_progress", "response": pending}]
        if style == "error_event":
            events.append({"type": "error", "error": {**OVERFLOW["error"]}})
        events.append({"type": "response.failed", "response": failed})
        return await _write_events(request, events)

    def _response(self, body: dict[str, Any], prompt: int) -> dict[str, Any]:
        turn = next(self._ids)
        reasoning = {"type": "reasoning", "id": f"rs_{turn}", "summary": [],
                     "encrypted_content": f"gAAAAB-opaque-{turn}-" + "x" * 40}
        self.reasoning[reasoning["id"]] = reasoning
        calls = [{"type": "function_call", "id": f"fc_{turn}_{n}", "call_id": f"call_{turn}_{n}", "name": self.tool,
                  "arguments": self.arguments(turn, n), "status": "completed"}
                 for n in range(self.parallel_calls)]
        last = body.get("input")[-1] if isinstance(body.get("input"), list) and body.get("input") else None
        answered = self.answer_results and isinstance(last, dict) and last.get("type") == "function_call_output"
        if answered or (self.finish_after is not None and turn >= self.finish_after):
            calls = [{"type": "message", "id": f"msg_{turn}", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": f"Done after {turn} rounds.", "annotations": []}]}]
        output = [reasoning, *calls]
        return {"id": f"resp_{turn}", "object": "response", "created_at": 1_700_000_000 + turn, "status": "completed",
                "model": body.get("model"), "output": output, "error": None, "incomplete_details": None,
                "usage": {"input_tokens": prompt, "output_tokens": 40, "total_tokens": prompt + 40,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 20}},
                "parallel_tool_calls": True, "tools": body.get("tools") or [], "tool_choice": "auto"}


async def _stream(request: web.Request, response: dict[str, Any]) -> web.StreamResponse:
    """Responses SSE: the lifecycle preamble, each output item added and done, then response.completed."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": pending},
                                    {"type": "response.in_progress", "response": pending}]
    for index, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        if item["type"] == "function_call":
            events.append({"type": "response.function_call_arguments.delta", "output_index": index,
                           "item_id": item["id"], "delta": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return await _write_events(request, events)


async def _write_events(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await stream.prepare(request)
    for number, event in enumerate(events):
        await stream.write(f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number})}\n\n"
                           .encode())
    await stream.write_eof()
    return stream
