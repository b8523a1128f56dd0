"""A summariser that is broken or hostile: chat turns go to a WindowedModel, summary requests get `reply`."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from aiohttp import web

from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.summariser_requests import is_summarizer_request
from tests.fakes.windowed import Received, WindowedModel

Reply = Callable[[web.Request, dict[str, Any], "HostileSummariser"], Awaitable[web.StreamResponse]]
# Where an endless answer stops when nobody hangs up: far past any bound the proxy may set, far below the
# gigabytes an unbounded read would take (a failing test must not take the machine down with it).
ENDLESS_CAP = 96 * 1024 * 1024
PIECE = 64 * 1024


@dataclass
class HostileSummariser:
    """Answers the proxy's summariser requests with `reply`; everything else is the windowed model's."""

    model: WindowedModel
    reply: Reply
    sent_bytes: list[int] = field(default_factory=list)  # per summariser answer: bytes written before it ended

    async def __call__(self, request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        if not is_summarizer_request(body.get("messages") or []):
            return await self.model(request, body, state)
        self.model.received.append(Received(time.monotonic(), body, self.model.prompt_tokens(body), True))
        return await self.reply(request, body, self)


SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}


def user_turn(index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Remember FACT-{index}. " + " ".join(f"word{index}x{n}" for n in range(60))}


def history(turns: int) -> list[dict[str, Any]]:
    """A conversation of `turns` exchanges and a new question: 30 of them overflow an 8,192-token window."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for index in range(turns):
        messages += [user_turn(index), {"role": "assistant", "content": f"Noted FACT-{index}. " + "ok " * 60}]
    return [*messages, user_turn(turns)]


def completion_body(content: str, *, finish_reason: str = "stop") -> bytes:
    """A whole chat completion whose message is `content` (any text, lone surrogates escaped as JSON allows)."""
    return json.dumps({"id": "chatcmpl-hostile", "object": "chat.completion", "created": 1700000000,
                       "model": "fake", "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
                       "choices": [{"index": 0, "finish_reason": finish_reason,
                                    "message": {"role": "assistant", "content": content}}]}).encode()


def answering(content: str, content_type: str = "application/json") -> Reply:
    """A reply of one fixed chat completion."""
    async def reply(request: web.Request, body: dict[str, Any], fake: HostileSummariser) -> web.StreamResponse:
        payload = completion_body(content)
        fake.sent_bytes.append(len(payload))
        return web.Response(body=payload, content_type=content_type)
    return reply


def endless(content_type: str, opening: bytes, piece: bytes) -> Reply:
    """An answer that never ends: `opening`, then `piece` over and over until the proxy hangs up (or the cap)."""
    async def reply(request: web.Request, body: dict[str, Any], fake: HostileSummariser) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        sent = len(opening)
        fake.sent_bytes.append(sent)
        try:
            await response.write(opening)
            while sent < ENDLESS_CAP:
                await response.write(piece)
                sent += len(piece)
                fake.sent_bytes[-1] = sent
        except (ConnectionError, RuntimeError):
            return response  # the proxy hung up: what it had read is all it will ever read
        await response.write_eof()
        return response
    return reply


def endless_json() -> Reply:
    """`stream: false` answered with a body that never closes its string."""
    opening = b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", ' \
              b'"content": "'
    return endless("application/json", opening, b"a" * PIECE)


def sse_flood() -> Reply:
    """`stream: false` answered with an endless event stream."""
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"b" * 1000 + b'"}}]}\n\n'
    return endless("text/event-stream", b"", event * (PIECE // len(event)))


def words(count: int, seed: int = 7) -> list[str]:
    """`count` made-up words: text that compresses like prose, so no check takes it for a loop."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    state = seed
    made = []
    for _ in range(count):
        state = (state * 1103515245 + 12345) % 2**31
        made.append("".join(letters[(state >> shift) % 26] for shift in range(0, 3 + state % 7 * 3, 3)))
    return made


@lru_cache(maxsize=16)
def filler(kind: str, size: int) -> str:
    """About `size` characters of a reply that passes for a summary and costs the most to read: prose, a JSON summary
    with thousands of entries, thousands of analysis terminators and fences, thousands of unknown keys."""
    vocabulary = words(5000)
    pick = (vocabulary[(index * 7919) % len(vocabulary)] for index in range(size))
    if kind == "prose":
        return " ".join(next(pick) for _ in range(size // 6))[:size]
    if kind == "json-list":
        entries = [f"item {index} {next(pick)}" for index in range(size // 16)]
        return "```json\n" + json.dumps({"user_intent": entries}) + "\n```"
    if kind == "fences":
        return "".join(f'</analysis>\n```json\n{{"k{index}": "{next(pick)}' for index in range(size // 32))[:size]
    if kind == "extra-keys":
        return "```json\n" + json.dumps({f"key{index}": next(pick) for index in range(size // 20)}) + "\n```"
    raise ValueError(kind)


@lru_cache(maxsize=16)
def filled_body(kind: str, size: int) -> bytes:
    """A whole answer of at most `size` bytes, its content `filler(kind, ...)` as long as fits, made once: a fake
    sharing the proxy's process must not hold the interpreter for long while the proxy is being measured."""
    content = size
    while len(body := completion_body(filler(kind, content))) > size:
        content = content * size // len(body) - 64  # JSON escapes and the envelope take their share
    return body


def filling(kind: str, size: Callable[[int], int]) -> Reply:
    """A reply of at most `size(max_tokens)` bytes of `filler(kind, ...)`, sized by the output the request asked
    for."""
    async def reply(request: web.Request, body: dict[str, Any], fake: HostileSummariser) -> web.StreamResponse:
        asked = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        payload = filled_body(kind, size(int(asked)))
        fake.sent_bytes.append(len(payload))
        return web.Response(body=payload, content_type="application/json")
    return reply
