"""The fake upstream of the benchmark: an OpenAI-like chat server in its own process, as cheap as aiohttp allows.

Usage: python -m bench.fast_upstream --port 0 --ready-file FILE   (writes the port it listens on into FILE)

POST /v1/chat/completions answers a small canned chat.completion, or with `"stream": true` a paced SSE stream:
`x-bench-chunks: N` content chunks, `x-bench-interval-ms: M` apart (or a model named `fake-stream-NxM`), then
`data: [DONE]`. The proxy's own summariser requests get a valid summary. POST /v1/responses and POST /v1/messages
answer a small canned Responses object and Anthropic message (not streamed). Usage reports prompt tokens as the body's
length over `x-bench-bytes-per-token` (default 4), so the proxy's calibration sees sensible counts, and every
answer says in `x-bench-received-bytes` how large the body it was sent was.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from bench.processes import serve_child
from tests.fakes.summariser_requests import is_summarizer_request

SUMMARY = '```json\n{"user_intent": ["bench"], "current_work": "bench"}\n```'
ANSWER_TEXT = "Sure: the answer is 42."
MODEL_PACING = re.compile(r"fake-stream-(\d+)x(\d+)")
MODELS = {"object": "list", "data": [{"id": "bench-small", "object": "model", "owned_by": "bench",
                                      "max_model_len": 131072, "context_window": 131072}]}


def pacing(request: web.Request, model: str) -> tuple[int, float]:
    """(chunks, seconds between chunks): from the x-bench-* headers, else the model name, else (1, 0)."""
    chunks, interval = request.headers.get("x-bench-chunks"), request.headers.get("x-bench-interval-ms")
    if chunks is not None:
        return max(1, int(chunks)), float(interval or 0) / 1000
    match = MODEL_PACING.fullmatch(model)
    return (int(match[1]), int(match[2]) / 1000) if match else (1, 0.0)


def usage(request: web.Request, body: bytes, completion_tokens: int) -> dict[str, int]:
    per_token = float(request.headers.get("x-bench-bytes-per-token") or 4)
    prompt = max(1, math.ceil(len(body) / per_token))
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def completion(model: str, content: str, usage_: dict[str, int]) -> bytes:
    return orjson.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": usage_})


def chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    event = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": model,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    payload = orjson.loads(body)
    model = str(payload.get("model") or "fake")
    headers = {"x-bench-received-bytes": str(len(body))}
    if is_summarizer_request(payload.get("messages") or []):
        return web.Response(body=completion(model, SUMMARY, usage(request, body, 30)), headers=headers,
                            content_type="application/json")
    if not payload.get("stream"):
        return web.Response(body=completion(model, ANSWER_TEXT, usage(request, body, 7)), headers=headers,
                            content_type="application/json")
    return await stream(request, body, payload, headers)


async def stream(request: web.Request, body: bytes, payload: dict[str, Any],
                 headers: dict[str, str]) -> web.StreamResponse:
    model = str(payload.get("model") or "fake")
    chunks, interval = pacing(request, model)
    response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    options = payload.get("stream_options")
    try:
        for index in range(chunks):
            if index:
                await asyncio.sleep(interval)
            delta = {"role": "assistant", "content": "tok "} if index == 0 else {"content": "tok "}
            await response.write(chunk(model, delta, "stop" if index == chunks - 1 else None))
        if isinstance(options, dict) and options.get("include_usage"):
            event = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
                     "model": model, "choices": [], "usage": usage(request, body, chunks)}
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass  # the client left (the held-open streams of the RSS scenario end this way)
    return response


async def responses(request: web.Request) -> web.Response:
    body = await request.read()
    payload = orjson.loads(body)
    tokens = usage(request, body, 7)
    return web.Response(body=orjson.dumps({
        "id": "resp_bench", "object": "response", "created_at": 1700000000, "status": "completed",
        "model": str(payload.get("model") or "fake"),
        "output": [{"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": ANSWER_TEXT, "annotations": []}]}],
        "usage": {"input_tokens": tokens["prompt_tokens"], "output_tokens": 7, "total_tokens": tokens["total_tokens"]},
    }), headers={"x-bench-received-bytes": str(len(body))}, content_type="application/json")


async def messages(request: web.Request) -> web.Response:
    body = await request.read()
    payload = orjson.loads(body)
    tokens = usage(request, body, 7)
    return web.Response(body=orjson.dumps({
        "id": "msg_bench", "type": "message", "role": "assistant", "model": str(payload.get("model") or "fake"),
        "content": [{"type": "text", "text": ANSWER_TEXT}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": tokens["prompt_tokens"], "output_tokens": 7},
    }), headers={"x-bench-received-bytes": str(len(body))}, content_type="application/json")


async def models(request: web.Request) -> web.Response:
    return web.json_response(MODELS)


def build_app() -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/messages", messages)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args()
    serve_child(build_app(), args.port, args.ready_file)


if __name__ == "__main__":
    main()
