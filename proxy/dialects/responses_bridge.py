"""The Responses API over an upstream that speaks only chat completions: requests into chat, answers back."""

from __future__ import annotations

import json
import time
from typing import Any

from proxy.core.messages import Message
from proxy.core.usage import Usage
from proxy.dialects.responses_items import view_of_input
from proxy.upstream.streaming import SseDecoder, SseEvent, sse_event

# Request fields that mean the same in both APIs.
_SAME_FIELDS = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed")
_REASONING_PARTS = frozenset({"reasoning", "thinking", "redacted_thinking"})


def chat_request(payload: dict[str, Any], history: list[Message]) -> dict[str, Any]:
    """A chat-completion request asking what the Responses request asks, with `history` as its conversation."""
    body: dict[str, Any] = {key: payload[key] for key in _SAME_FIELDS if key in payload}
    body["messages"] = [*_instructions(payload.get("instructions")), *(chat_message(m) for m in history)]
    if (tools := chat_tools(payload.get("tools"))) is not None:
        body["tools"] = tools
        if (choice := _tool_choice(payload.get("tool_choice"))) is not None:
            body["tool_choice"] = choice
    limit = payload.get("max_output_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        body["max_tokens"] = limit
    if payload.get("stream") is True:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # the closing response.completed carries the usage
    return body


def chat_tools(tools: Any, fields: tuple[str, ...] = ("name", "description", "parameters", "strict")) \
        -> list[dict[str, Any]] | None:
    """Function tools in chat's shape (`fields` of each); the Responses API's hosted tools have no chat counterpart
    and are left out."""
    functions = [{"type": "function", "function": {key: tool[key] for key in fields if key in tool}}
                 for tool in (tools if isinstance(tools, list) else [])
                 if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str)]
    return functions or None


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None


def _instructions(instructions: Any) -> list[Message]:
    if isinstance(instructions, str):
        return [{"role": "system", "content": instructions}] if instructions else []
    view = view_of_input(instructions) if isinstance(instructions, list) else None
    return [chat_message(message) for message in view.messages] if view is not None else []


def chat_message(message: Message) -> Message:
    """A neutral message as chat servers take it: `developer` as `system` (many know no other), reasoning parts and
    the view's own keys left out, custom tool calls as function calls."""
    role = message.get("role")
    chat: Message = {"role": "system" if role == "developer" else role}
    content = message.get("content")
    if isinstance(content, list):
        content = [part for part in content if not (isinstance(part, dict) and part.get("type") in _REASONING_PARTS)]
        if all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            content = "".join(str(part.get("text", "")) for part in content)
    chat["content"] = content
    if role == "tool":
        chat["tool_call_id"] = message.get("tool_call_id")
    if isinstance(calls := message.get("tool_calls"), list):
        chat["tool_calls"] = [_function_call(call) for call in calls if isinstance(call, dict)]
    return chat


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    if call.get("type") == "custom":
        custom = _dict(call.get("custom"))
        return {"id": call.get("id"), "type": "function",
                "function": {"name": custom.get("name"), "arguments": json.dumps({"input": custom.get("input")})}}
    return call


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def response_from_chat(chat: Any, request: dict[str, Any]) -> dict[str, Any] | None:
    """A chat completion as the Responses API's response object; None when it is not one."""
    choices = chat.get("choices") if isinstance(chat, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = _dict(choices[0].get("message"))
    ident = str(chat.get("id") or f"chat{int(time.time() * 1000)}")
    output = _output(ident, message.get("content"), message.get("tool_calls"))
    usage = _usage(chat.get("usage"))
    return _response(ident, request, output, usage, choices[0].get("finish_reason"), chat.get("created"))


def _output(ident: str, text: Any, calls: Any) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if isinstance(text, str) and text:
        output.append(_message_item(ident, text))
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            output.append(_call_item(str(call.get("id") or f"call_{ident}_{index}"), function.get("name"),
                                     function.get("arguments")))
    return output


def _message_item(ident: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{ident}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call_id: str, name: Any, arguments: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": str(name or ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
            "status": "completed"}


def _usage(usage: Any) -> dict[str, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


def _response(ident: str, request: dict[str, Any], output: list[dict[str, Any]], usage: dict[str, int] | None,
              finish: Any, created: Any) -> dict[str, Any]:
    cut = finish == "length"
    return {"id": f"resp_{ident}", "object": "response",
            "created_at": created if isinstance(created, int) else int(time.time()),
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "model": request.get("model"), "output": output, "usage": usage,
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools") or []}


class ResponsesFromChatStream:
    """Chat-completion chunks in, Responses events out, as the chunks arrive: the preamble at the first chunk, text
    and argument deltas as they come, each item done and `response.completed` (with usage) at the end."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._decoder = SseDecoder()
        self._ident = f"chat{int(time.time() * 1000)}"
        # One creation time for every event of the response (the first chunk's, or now): the closing event
        # repeated the clock, so a response crossing a second boundary said two different times.
        self._created = int(time.time())
        self._started = False
        self._text: str | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, int] | None = None
        self._finish: Any = None
        self._sequence = 0
        self._closed = False

    @property
    def usage(self) -> Usage | None:
        return Usage(self._usage["input_tokens"], self._usage["output_tokens"]) if self._usage else None

    @property
    def finish_reasons(self) -> list[str]:
        return [str(self._finish)] if self._finish is not None else []

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._events(event) for event in self._decoder.feed(chunk))

    def finish(self) -> bytes:
        out = b"".join(self._events(event) for event in self._decoder.flush())
        return out + (self._close() if self._started and not self._closed else b"")

    def _events(self, event: SseEvent) -> bytes:
        if (event.data or "").strip() == "[DONE]":
            return self._close() if self._started and not self._closed else b""
        payload = event.json()
        if not isinstance(payload, dict) or self._closed:
            return b""
        out = self._start(payload)
        if isinstance(payload.get("error"), dict):
            self._closed = True
            return out + self._emit({"type": "error", "error": payload["error"]})
        self._usage = _usage(payload.get("usage")) or self._usage
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict):
                out += self._delta(_dict(choice.get("delta")))
                self._finish = choice.get("finish_reason") or self._finish
        return out

    def _start(self, payload: dict[str, Any]) -> bytes:
        if self._started:
            return b""
        self._started = True
        self._ident = str(payload.get("id") or self._ident)
        created = payload.get("created")
        self._created = created if isinstance(created, int) and not isinstance(created, bool) else self._created
        pending = {**_response(self._ident, self._request, [], None, None, self._created),
                   "status": "in_progress"}
        return self._emit({"type": "response.created", "response": pending}) + \
            self._emit({"type": "response.in_progress", "response": pending})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        out = b""
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._text is None:
                self._text = ""
                item = {**_message_item(self._ident, ""), "status": "in_progress", "content": []}
                out += self._emit({"type": "response.output_item.added", "output_index": 0, "item": item})
                out += self._emit({"type": "response.content_part.added", "item_id": f"msg_{self._ident}",
                                   "output_index": 0, "content_index": 0,
                                   "part": {"type": "output_text", "text": "", "annotations": []}})
            self._text += text
            out += self._emit({"type": "response.output_text.delta", "item_id": f"msg_{self._ident}",
                               "output_index": 0, "content_index": 0, "delta": text})
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                out += self._call_delta(call)
        return out

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        given = call.get("index")
        index = given if isinstance(given, int) else len(self._calls)
        function = _dict(call.get("function"))
        out = b""
        if index not in self._calls:
            call_id = str(call.get("id") or f"call_{self._ident}_{index}")
            self._calls[index] = {**_call_item(call_id, function.get("name"), ""), "status": "in_progress"}
            out += self._emit({"type": "response.output_item.added", "output_index": self._index(index),
                               "item": self._calls[index]})
        item = self._calls[index]
        if isinstance(function.get("name"), str) and not item["name"]:
            item["name"] = function["name"]
        if isinstance(piece := function.get("arguments"), str) and piece:
            item["arguments"] += piece
            out += self._emit({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": self._index(index), "delta": piece})
        return out

    def _index(self, call_index: int) -> int:
        return (1 if self._text is not None else 0) + sorted(self._calls).index(call_index) \
            if call_index in self._calls else (1 if self._text is not None else 0) + len(self._calls)

    def _close(self) -> bytes:
        self._closed = True
        out = b""
        output: list[dict[str, Any]] = []
        if self._text is not None:
            item = _message_item(self._ident, self._text)
            out += self._emit({"type": "response.output_text.done", "item_id": item["id"], "output_index": 0,
                               "content_index": 0, "text": self._text})
            out += self._emit({"type": "response.output_item.done", "output_index": 0, "item": item})
            output.append(item)
        for index in sorted(self._calls):
            item = {**self._calls[index], "status": "completed"}
            out += self._emit({"type": "response.function_call_arguments.done", "item_id": item["id"],
                               "output_index": len(output), "arguments": item["arguments"]})
            out += self._emit({"type": "response.output_item.done", "output_index": len(output), "item": item})
            output.append(item)
        done = _response(self._ident, self._request, output, self._usage, self._finish, self._created)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return out + self._emit({"type": kind, "response": done})

    def _emit(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        return sse_event(event)
