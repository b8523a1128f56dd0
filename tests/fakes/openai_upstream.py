"""A fake OpenAI-compatible upstream served over a real socket, with knobs for every behaviour tests need."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

ChatHook = Callable[[web.Request, dict[str, Any], "FakeUpstream"], Awaitable[web.StreamResponse | None]]
RawChatHook = Callable[[web.Request, "FakeUpstream"], Awaitable[web.StreamResponse | None]]
ResponsesHook = Callable[[web.Request], Awaitable[web.StreamResponse]]
MessagesHook = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    received_at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeUpstream:
    """State and behaviour of the fake; tests flip the public attributes."""

    requests: list[RecordedRequest] = field(default_factory=list)
    stream_chunk_delay: float = 0.0
    stream_gate: asyncio.Event | None = None          # the stream waits here before its last chunk
    last_chunk_sent_at: float | None = None
    stream_closed_at: float | None = None             # when an endless stream noticed its client left
    silent_seconds: float = 0.0                       # sleep before answering (idle-timeout tests)
    gzip: bool = False
    chat_hook: ChatHook | None = None                 # takes over chat completions when it returns a response
    raw_chat_hook: RawChatHook | None = None          # like chat_hook, but before the body is parsed as JSON
    responses_hook: ResponsesHook | None = None       # serves POST /v1/responses (404 without one)
    messages_hook: MessagesHook | None = None         # serves POST /v1/messages, Anthropic's (404 without one)
    # POST /v1/messages/count_tokens is answered (by the hook's `count_tokens`) only when on, as not every server
    # speaking Messages has it.
    count_tokens: bool = False
    url: str = ""

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.path.endswith("/chat/completions")]


def _headers(request_id: str) -> dict[str, str]:
    return {"x-request-id": request_id, "x-ratelimit-remaining-requests": "99",
            "x-ratelimit-limit-tokens": "150000", "openai-processing-ms": "7"}


def reply_text(body: dict[str, Any]) -> str:
    """A deterministic answer: echoes the last user message's text."""
    last_user = next((m for m in reversed(body.get("messages", [])) if m.get("role") == "user"), {})
    content = last_user.get("content")
    if isinstance(content, list):
        content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return f"echo: {content}"


def completion(body: dict[str, Any], content: str, *, usage: dict[str, int] | None = None,
               finish_reason: str = "stop") -> dict[str, Any]:
    choices = []
    for index in range(int(body.get("n") or 1)):
        message: dict[str, Any] = {"role": "assistant", "content": f"{content} #{index}" if index else content}
        reason = finish_reason
        if body.get("tools") and "weather" in content:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{index}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}
            reason = "tool_calls"
        choices.append({"index": index, "message": message, "finish_reason": reason, "logprobs": None})
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1700000000,
            "model": body.get("model", "fake"), "choices": choices,
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def chunk(body: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None,
          index: int = 0) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000,
            "model": body.get("model", "fake"),
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}


def sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def error(status: int, message: str, code: str | None = None,
          error_type: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=_headers("req_error"))


class FakeUpstreamApp:
    """Routes of the fake; every request is recorded before it is answered."""

    def __init__(self, state: FakeUpstream) -> None:
        self.state = state

    def build(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._record])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.messages_count_tokens)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_route("*", "/v1/echo/{tail:.*}", self.echo)
        app.router.add_get("/v1/endless", self.endless)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        raw_path, _, raw_query = request.raw_path.partition("?")
        self.state.requests.append(RecordedRequest(request.method, raw_path, raw_query,
                                                   dict(request.headers), body, time.monotonic()))
        if self.state.silent_seconds:
            await asyncio.sleep(self.state.silent_seconds)
        return await handler(request)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.state.raw_chat_hook is not None:
            raw = await self.state.raw_chat_hook(request, self.state)
            if raw is not None:
                return raw
        body = await request.json()
        if self.state.chat_hook is not None:
            hooked = await self.state.chat_hook(request, body, self.state)
            if hooked is not None:
                return hooked
        if body.get("model") == "missing-model":
            return error(404, "The model `missing-model` does not exist", "model_not_found")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return error(400, "'messages' must be a non-empty array", "invalid_value")
        if body.get("stream"):
            return await self.stream(request, body)
        response = web.json_response(completion(body, reply_text(body)), headers=_headers("req_123"))
        if self.state.gzip:
            response.enable_compression()
        return response

    async def responses(self, request: web.Request) -> web.StreamResponse:
        if self.state.responses_hook is None:
            return error(404, "Unknown request URL: POST /v1/responses", "unknown_url")
        return await self.state.responses_hook(request)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        if self.state.messages_hook is None:
            return error(404, "Unknown request URL: POST /v1/messages", "unknown_url")
        return await self.state.messages_hook(request)

    async def messages_count_tokens(self, request: web.Request) -> web.StreamResponse:
        counter = getattr(self.state.messages_hook, "count_tokens", None)
        if not self.state.count_tokens or counter is None:
            # Anthropic's own envelope: the server speaks Messages, it only lacks this route.
            return web.json_response({"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}},
                                     status=404)
        answer: web.StreamResponse = await counter(request)
        return answer

    async def stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={**_headers("req_stream"), "Content-Type": "text/event-stream"})
        if self.state.gzip:
            response.enable_compression()
        await response.prepare(request)
        words = reply_text(body).split(" ")
        await response.write(sse(chunk(body, {"role": "assistant", "content": ""})))
        for word in words:
            await response.write(sse(chunk(body, {"content": word + " "})))
            await asyncio.sleep(self.state.stream_chunk_delay)
        if self.state.stream_gate is not None:
            await asyncio.wait_for(self.state.stream_gate.wait(), 10)
        await response.write(sse(chunk(body, {}, "stop")))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 10, "completion_tokens": len(words), "total_tokens": 10 + len(words)}
            await response.write(sse({**chunk(body, {}), "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        self.state.last_chunk_sent_at = time.monotonic()
        await response.write_eof()
        return response

    async def endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index in range(10_000):
                await response.write(sse({"tick": index}))
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            self.state.stream_closed_at = time.monotonic()
            raise
        return response

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model", "created": 1700000000, "owned_by": "fake"}
                for name in ("fake-small", "fake-large")]
        response = web.json_response({"object": "list", "data": data}, headers=_headers("req_models"))
        if self.state.gzip:
            response.enable_compression()
        return response

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [float(len(text)), 0.5, -0.25]}
                for i, text in enumerate(inputs)]
        return web.json_response({"object": "list", "data": data, "model": body.get("model"),
                                  "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async def echo(self, request: web.Request) -> web.Response:
        """Reflects what arrived, so tests can check bodies, headers and query strings byte for byte."""
        recorded = self.state.requests[-1]
        return web.json_response({"method": recorded.method, "path": recorded.path, "query": recorded.query,
                                  "headers": recorded.headers, "body_length": len(recorded.body)},
                                 headers={"X-Custom-Upstream": "kept", "Keep-Alive": "timeout=5",
                                          "Connection": "keep-alive, X-Custom-Upstream"})
