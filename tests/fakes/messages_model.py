"""A fake Anthropic Messages API model (`POST /v1/messages`) with a context window it enforces, as Anthropic's servers
do: every turn it thinks (a signed thinking block) and calls tools in parallel, in JSON or in Messages SSE, and it
refuses the histories a real server refuses (roles out of turn, tool results unpaired, thinking blocks changed)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.core.tokens import TokenCounter
from tests.fakes.responses_model import TOKENIZER_RATIO

Body = dict[str, Any]


def error_body(message: str, kind: str = "invalid_request_error") -> Body:
    """Anthropic's error envelope, the same in a 4xx body and in a stream's `error` event."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def invalid(message: str) -> web.Response:
    return web.json_response(error_body(message), status=400)


def blocks(message: Any) -> list[Any]:
    """A message's content as blocks: a plain string is one text block, as the API reads it."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def ids_of(message: Any, kind: str, key: str) -> list[Any]:
    return [block.get(key) for block in blocks(message) if isinstance(block, dict) and block.get("type") == kind]


@dataclass
class MessagesModel:
    window: int = 4000
    parallel_calls: int = 2
    tool: str = "read_file"
    # The input of tool_use `n` of turn `turn`.
    input: Callable[[int, int], Body] = lambda turn, n: {"path": f"src/file_{turn}_{n}.py"}
    finish_after: int | None = None  # answer in words, calling no tool, from this many answers on
    thinks: bool = True  # every answer opens with a signed thinking block (kept in `thinking`)
    # How a prompt past the window is refused: "json" (400), or for streams "error_event" (200, message_start, then
    # an `error` event; a JSON request still gets the 400).
    overflow: str = "json"
    # Anthropic words a prompt that fits but leaves no room for max_tokens differently ("input length and
    # `max_tokens` exceed context limit: P + T > W, ..."); off, every refusal says "prompt is too long".
    sum_wording: bool = False
    refusal: tuple[int, str, str] | None = None  # (status, body, content type) served instead, as a provider sent it
    # Whether the server runs Anthropic's context management (Anthropic's API does; most Messages servers do not, and
    # refuse its fields and blocks as unknown input, as a strict server refuses any field it does not know).
    manages_context: bool = False
    received: list[Body] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)  # the fake's count of each received body, as `received`
    counted: list[int] = field(default_factory=list)  # what POST /v1/messages/count_tokens answered
    thinking: dict[str, Body] = field(default_factory=dict)  # signature -> the thinking block as the model wrote it
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("cl100k_base"))
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def prompt_tokens(self, body: Body) -> int:
        parts = [body.get("system"), body.get("messages"), body.get("tools")]
        text = "".join(part if isinstance(part, str) else json.dumps(part) for part in parts if part is not None)
        return math.ceil(self.counter.count_text(text) * TOKENIZER_RATIO)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return invalid("There was an error parsing the body of your request as JSON")
        if not isinstance(body, dict):
            return invalid("body: Input should be an object")
        self.received.append(body)
        prompt = self.prompt_tokens(body)
        self.prompts.append(prompt)
        problem = self.problem(body)
        if problem is not None:
            return invalid(problem)
        if prompt + body["max_tokens"] > self.window:
            return await self._refuse(request, body, prompt)
        message = self._message(body, prompt)
        if body.get("stream"):
            return await _stream(request, message)
        return web.json_response(message, headers={"request-id": f"req_{message['id']}"})

    async def count_tokens(self, request: web.Request) -> web.Response:
        """POST /v1/messages/count_tokens: the same count the window is enforced with, the same validation."""
        body = await request.json()
        problem = self.problem({"max_tokens": 1, **body}, thinking=False)
        if problem is not None:
            return invalid(problem)
        self.counted.append(self.prompt_tokens(body))
        return web.json_response({"input_tokens": self.counted[-1]})

    def problem(self, body: Body, *, thinking: bool = True) -> str | None:
        """What a real server says of a request it refuses, or None. `thinking`: check the signed blocks too."""
        if not isinstance(body.get("model"), str):
            return "model: Field required"
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            return "max_tokens: Field required"
        if not self.manages_context:
            unknown = [key for key in ("context_management", "compaction") if key in body]
            if unknown:
                return f"{unknown[0]}: Extra inputs are not permitted"
            if '"type": "compaction"' in json.dumps(body.get("messages")):
                return "messages: Input tag 'compaction' found using 'type' does not match any of the expected tags"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                return f"messages.{index}.role: Input should be 'user' or 'assistant'"
            if index == 0 and message["role"] != "user":
                return 'messages: first message must use the "user" role'
            if index and message["role"] == messages[index - 1]["role"]:
                return (f'messages: roles must alternate between "user" and "assistant", but found multiple '
                        f'"{message["role"]}" roles in a row')
            if not blocks(message) and index < len(messages) - 1:
                return (f"messages.{index}: all messages must have non-empty content except for the optional final "
                        "assistant message")
            if not all(isinstance(block, dict) and isinstance(block.get("type"), str) for block in blocks(message)):
                return f"messages.{index}.content: every block must be an object with a type"
        return self._pairing(messages) or (self._thoughts(messages) if thinking else None)

    def _pairing(self, messages: list[Body]) -> str | None:
        """Every tool_use answered in the very next message, every tool_result answering the message before."""
        for index, message in enumerate(messages):
            if message["role"] == "assistant":
                following = messages[index + 1] if index + 1 < len(messages) else {}
                answered = set(ids_of(following, "tool_result", "tool_use_id"))
                missing = [use for use in ids_of(message, "tool_use", "id") if use not in answered]
                if missing:
                    return (f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately "
                            f"after: {', '.join(map(str, missing))}. Each `tool_use` block must have a corresponding "
                            "`tool_result` block in the next message.")
                continue
            asked = set(ids_of(messages[index - 1], "tool_use", "id")) if index else set()
            for position, block in enumerate(blocks(message)):
                if block["type"] == "tool_result" and block.get("tool_use_id") not in asked:
                    return (f"messages.{index}.content.{position}: unexpected `tool_use_id` found in `tool_result` "
                            f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                            "`tool_use` block in the previous message.")
        return None

    def _thoughts(self, messages: list[Body]) -> str | None:
        """The latest assistant turn's thinking blocks come back exactly as signed; mid tool loop, it opens with one."""
        latest = max((index for index, message in enumerate(messages) if message["role"] == "assistant"), default=None)
        if latest is None:
            return None
        content = blocks(messages[latest])
        for position, block in enumerate(content):
            if block["type"] == "thinking" and self.thinking.get(str(block.get("signature"))) != block:
                return f"messages.{latest}.content.{position}: Invalid `signature` in `thinking` block"
        in_tool_loop = latest == len(messages) - 2 and ids_of(messages[latest], "tool_use", "id")
        if self.thinks and in_tool_loop and content[0]["type"] not in ("thinking", "redacted_thinking"):
            return (f"messages.{latest}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                    f"`{content[0]['type']}`. When `thinking` is enabled, a final `assistant` message must start with "
                    "a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
                    "recommend you include thinking blocks from previous turns. To avoid this requirement, disable "
                    "`thinking`.")
        return None

    def overflow_message(self, prompt: int, max_tokens: int) -> str:
        if self.sum_wording and prompt <= self.window:
            return (f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {self.window}, "
                    "decrease input length or `max_tokens` and try again")
        maximum = self.window if self.sum_wording else self.window - max_tokens
        return f"prompt is too long: {prompt} tokens > {maximum} maximum"

    async def _refuse(self, request: web.Request, body: Body, prompt: int) -> web.StreamResponse:
        if self.refusal is not None:
            status, text, content_type = self.refusal
            return web.Response(status=status, body=text.encode(), content_type=content_type)
        refusal = error_body(self.overflow_message(prompt, body["max_tokens"]))
        if self.overflow == "json" or not body.get("stream"):
            return web.json_response(refusal, status=400)
        start = {"type": "message_start", "message": _pending(body.get("model"), "msg_refused", prompt)}
        return await _write_events(request, [start, {"type": "ping"}, refusal])

    def _message(self, body: Body, prompt: int) -> Body:
        turn = next(self._ids)
        content: list[Body] = []
        if self.thinks:
            digest = hashlib.sha256(f"fake-thinking-{turn}".encode()).hexdigest()
            block = {"type": "thinking", "thinking": f"Turn {turn}: the files read so far define helpers; read on.",
                     "signature": f"sig-{turn}-{digest}"}
            self.thinking[block["signature"]] = block
            content.append(dict(block))  # a copy: whatever the server does to its answer, the record stays
        finished = self.finish_after is not None and turn >= self.finish_after
        if finished:
            content.append({"type": "text", "text": f"Done after {turn} rounds."})
        else:
            content += [{"type": "tool_use", "id": f"toolu_{turn}_{n}", "name": self.tool, "input": self.input(turn, n)}
                        for n in range(self.parallel_calls)]
        return {**_pending(body.get("model"), f"msg_{turn}", prompt), "content": content,
                "stop_reason": "end_turn" if finished else "tool_use",
                "usage": {**_usage(prompt), "output_tokens": 40}}


def _usage(prompt: int) -> Body:
    return {"input_tokens": prompt, "output_tokens": 1, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def _pending(model: Any, message_id: str, prompt: int) -> Body:
    """The message as message_start announces it: no content, no stop reason, the input tokens known."""
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": _usage(prompt)}


def _block_events(index: int, block: Body) -> list[Body]:
    """One content block as Anthropic streams it: started empty, filled by deltas, stopped."""
    kind = block["type"]
    start: Body
    if kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    elif kind == "tool_use":
        start = {**block, "input": {}}
        arguments = json.dumps(block["input"])
        # Split, so a client must join partial JSON as it does with a real server's.
        deltas = [{"type": "input_json_delta", "partial_json": part}
                  for part in ("", arguments[: len(arguments) // 2], arguments[len(arguments) // 2:])]
    else:
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}]
    return [{"type": "content_block_start", "index": index, "content_block": start},
            *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
            {"type": "content_block_stop", "index": index}]


async def _stream(request: web.Request, message: Body) -> web.StreamResponse:
    """Messages SSE: message_start, each block (a ping after the first one opens), message_delta, message_stop."""
    events: list[Body] = [{"type": "message_start",
                           "message": _pending(message["model"], message["id"], message["usage"]["input_tokens"])}]
    for index, block in enumerate(message["content"]):
        block_events = _block_events(index, block)
        events += block_events[:1] + ([{"type": "ping"}] if index == 0 else []) + block_events[1:]
    events += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]}},
               {"type": "message_stop"}]
    return await _write_events(request, events, {"request-id": f"req_{message['id']}"})


async def _write_events(request: web.Request, events: list[Body],
                        headers: dict[str, str] | None = None) -> web.StreamResponse:
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                         **(headers or {})})
    await stream.prepare(request)
    for event in events:
        await stream.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    await stream.write_eof()
    return stream
