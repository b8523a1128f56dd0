"""A fake chat model with a context window it enforces by counting tokens, like vLLM or llama.cpp do."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.core.tokens import TokenCounter
from tests.fakes.openai_upstream import FakeUpstream, chunk, sse
from tests.fakes.summariser_requests import is_pairs_request, is_summarizer_request, round_texts, summarised_text

FACT = re.compile(r"FACT-\d+")
RESULT_MARK = re.compile(r"RESULT-\d+-\d+")  # tests.fakes.agent's tool-result markers
# The fake's tokenizer counts differently from the proxy's estimate, as real servers do.
TOKENIZER_RATIO = 1.15
OPENAI_OVERFLOW = {"error": {"message": "This model's maximum context length is {window} tokens. However, your "
                             "messages resulted in {prompt} tokens. Please reduce the length of the messages.",
                             "type": "invalid_request_error", "param": "messages",
                             "code": "context_length_exceeded"}}


@dataclass
class Overflow:
    """How the fake reports a prompt over its window: a status and body, SSE after a 200, or an empty stream."""

    status: int = 400
    body: Any = None            # None: OpenAI's shape with the real numbers
    content_type: str = "application/json"


@dataclass
class Received:
    at: float
    body: dict[str, Any]
    prompt_tokens: int
    summarizer: bool
    pairs: bool = False  # a batch of tool-round summaries (stage 2), counted apart from whole-history ones


@dataclass
class WindowedModel:
    window: int = 4096
    overflow: Overflow = field(default_factory=Overflow)
    summary_delay: float = 0.0
    summarizer_down: bool = False
    # Summaries longer than this many output tokens are cut off (`finish_reason: length`), as a rambling small
    # model's are; None: never.
    summary_cut_above: int | None = None
    always_answer: Overflow | None = None      # serve this whatever the prompt (look-alike negatives)
    received: list[Received] = field(default_factory=list)
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("cl100k_base"))

    @property
    def summarizer_calls(self) -> list[Received]:
        return [r for r in self.received if r.summarizer]

    @property
    def chat_calls(self) -> list[Received]:
        return [r for r in self.received if not r.summarizer and not r.pairs]

    @property
    def pair_calls(self) -> list[Received]:
        return [r for r in self.received if r.pairs]

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return math.ceil(self.counter.count_request(body) * TOKENIZER_RATIO)

    async def __call__(self, request: web.Request, body: dict[str, Any],
                       state: FakeUpstream) -> web.StreamResponse:
        messages = body.get("messages") or []
        summarizer, pairs = is_summarizer_request(messages), is_pairs_request(messages)
        prompt = self.prompt_tokens(body)
        self.received.append(Received(time.monotonic(), body, prompt, summarizer, pairs))
        if self.always_answer is not None and not summarizer:
            return self._overflow(self.always_answer, prompt, body)
        reserved = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        if prompt + reserved > self.window:
            return self._overflow(self.overflow, prompt, body)
        if summarizer or pairs:
            if self.summarizer_down:
                return web.json_response({"error": {"message": "summariser unavailable", "type": "server_error",
                                                    "param": None, "code": None}}, status=503)
            await asyncio.sleep(self.summary_delay)
            answer = _completion(body, _summary_reply(messages), prompt)
            limit = body.get("max_tokens") or body.get("max_completion_tokens") or 0
            if self.summary_cut_above is not None and limit > self.summary_cut_above:
                answer["choices"][0]["finish_reason"] = "length"
            return web.json_response(answer)
        return await self._answer(request, body, prompt)

    def _overflow(self, overflow: Overflow, prompt: int, body: dict[str, Any]) -> web.StreamResponse:
        if overflow.content_type == "text/event-stream" and not body.get("stream"):
            overflow = Overflow()  # stream-only failure shapes: a plain request gets the JSON error, as on vLLM
        payload = overflow.body
        if payload is None:
            text = json.dumps(OPENAI_OVERFLOW).replace("{window}", str(self.window)).replace("{prompt}", str(prompt))
        else:
            text = payload if isinstance(payload, str) else json.dumps(payload)
        return web.Response(status=overflow.status, body=text.encode(), content_type=overflow.content_type)

    async def _answer(self, request: web.Request, body: dict[str, Any], prompt: int) -> web.StreamResponse:
        message = _reply_message(body)
        completion_tokens = self.counter.count_text(message.get("content") or "") + 5
        usage = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                 "total_tokens": prompt + completion_tokens}
        if not body.get("stream"):
            return web.json_response(_completion(body, message, prompt, usage))
        return await _stream(request, body, message, usage)


def _reply_message(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    last = messages[-1]
    if last.get("role") == "user" and body.get("tools") and "weather" in str(last.get("content")):
        turn = sum(1 for m in messages if m.get("role") == "user")
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{turn}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": f"city-{turn}"})}}]}
    source = next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), {})
    return {"role": "assistant", "content": f"Noted: {str(source.get('content'))[:300]}"}


def _summary_reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Summarises mechanically: every FACT marker of the transcript survives, in order; a batch of tool rounds
    gets one short summary each (its first words and every RESULT and FACT marker), as a JSON list."""
    if rounds := round_texts(messages):
        summaries = [f"round {text.split(chr(10), 1)[0].strip()}: " + " ".join(
            dict.fromkeys(RESULT_MARK.findall(text) + FACT.findall(text))) for text in rounds]
        return {"role": "assistant", "content": json.dumps(summaries)}
    transcript = summarised_text(messages)
    facts = list(dict.fromkeys(FACT.findall(transcript)))
    summary = {"user_intent": ["keep a running list of facts"], "user_messages": [", ".join(facts)],
               "current_work": "recording facts"}
    text = f"<analysis>{len(facts)} facts so far.</analysis>\n```json\n{json.dumps(summary)}\n```"
    return {"role": "assistant", "content": text}


def _completion(body: dict[str, Any], message: dict[str, Any], prompt: int,
                usage: dict[str, int] | None = None) -> dict[str, Any]:
    reason = "tool_calls" if message.get("tool_calls") else "stop"
    return {"id": "chatcmpl-windowed", "object": "chat.completion", "created": 1700000000,
            "model": body.get("model"), "choices": [{"index": 0, "message": message, "finish_reason": reason}],
            "usage": usage or {"prompt_tokens": prompt, "completion_tokens": 50, "total_tokens": prompt + 50}}


async def _stream(request: web.Request, body: dict[str, Any], message: dict[str, Any],
                  usage: dict[str, int]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(sse(chunk(body, {"role": "assistant", "content": ""})))
    if message.get("tool_calls"):
        await response.write(sse(chunk(body, {"tool_calls": [{"index": 0, **message["tool_calls"][0]}]})))
        reason = "tool_calls"
    else:
        for word in str(message["content"]).split(" "):
            await response.write(sse(chunk(body, {"content": word + " "})))
        reason = "stop"
    await response.write(sse(chunk(body, {}, reason)))
    if (body.get("stream_options") or {}).get("include_usage"):
        await response.write(sse({**chunk(body, {}), "choices": [], "usage": usage}))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
