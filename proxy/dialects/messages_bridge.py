"""Anthropic Messages requests as chat completions, and chat answers and errors back as Messages: the sans-io bridge
of `dialects.messages.upstream_api: chat` (the stream's translator is in messages_bridge_stream).

What a request becomes:
- `system` (a string or text blocks) → one system message; `messages` → chat messages through the neutral view:
  tool_use → assistant tool_calls, tool_result → `tool` messages (an `is_error` one's text opened with "Error: ",
  chat having no such flag), images → image_url parts, a plain-text document → a text part;
- `max_tokens`, `temperature`, `top_p` as they are; `top_k` too (llama.cpp and vLLM read it, OpenAI refuses it
  itself); `stop_sequences` → `stop`; `metadata.user_id` → `user`; `output_config.format` (or the older
  `output_format`) → `response_format`; custom tools → function tools (`input_schema` → `parameters`, `strict`
  kept); `tool_choice` auto/any/tool/none → auto/required/{function}/none, `disable_parallel_tool_use` →
  `parallel_tool_calls: false`; `stream: true` → a stream that reports its usage.

Left out, since none of it changes what the model is asked:
- thinking and redacted_thinking blocks (a chat server can neither check nor carry their signatures), the
  `thinking` setting and `output_config.effort` / `task_budget` (how hard to think: a chat model reasons, or not,
  as it was built to);
- `cache_control` anywhere, `citations` settings, a tool's `defer_loading`, `allowed_callers`,
  `eager_input_streaming` and `input_examples`, `service_tier`, `speed`, `inference_geo`, `diagnostics`,
  `user_profile_id`, `workspace_id` and the rest of `metadata`: how Anthropic serves, caches or bills a request.

Refused with a 400, as a chat upstream cannot do what they ask and leaving them out would change the answer:
- server and Anthropic-defined tools (web search and fetch, code execution, bash, text editor, computer use,
  memory, tool search, MCP toolsets), `mcp_servers`, `container`;
- a last message from the assistant (a prefill: chat starts a new turn where Anthropic continues that one);
- images from the Files API, documents other than text, images or documents inside a tool_result (chat's tool
  messages are text), and any block the neutral view cannot read (server tool results, search results, ...);
- `max_tokens: 0` (a cache warm-up, with nothing to answer), a `tool_choice` or a field the bridge does not know
  (Anthropic's context management is the proxy's and never reaches the bridge: see messages.read_call).
"""

from __future__ import annotations

import json
import time
from typing import Any

from proxy.core.messages import Message
from proxy.dialects.body import encode_json
from proxy.dialects.call import is_positive
from proxy.dialects.messages import MESSAGES
from proxy.dialects.messages_blocks import render, view_of_messages
from proxy.dialects.responses_bridge import chat_message
from proxy.errors import BadRequest, ProxyError
from proxy.upstream.overflow import detect_context_overflow

Block = dict[str, Any]
# Request fields the bridge reads (translated, or left out knowingly: see above).
_READ = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
                   "stream", "tools", "tool_choice", "metadata", "output_config", "output_format", "thinking"})
# Request fields about how Anthropic serves, caches or bills a request: left out.
_SERVING = frozenset({"service_tier", "speed", "inference_geo", "cache_control", "diagnostics", "user_profile_id",
                      "workspace_id"})
_SAME_FIELDS = ("model", "temperature", "top_p", "top_k")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_OUTPUT_CONFIG = frozenset({"format", "effort", "task_budget"})
# Block types the neutral view reads; a tool_result's content may hold text only, for chat.
_BLOCKS = frozenset({"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"})
_FILE_ID = "file_id:"  # how the neutral view spells an image from the Files API (messages_blocks)
_STOPS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
          "content_filter": "refusal"}


def chat_request(payload: dict[str, Any], history: list[Message] | None = None) -> dict[str, Any]:
    """The chat completion asking what the Messages request asks; its conversation is `history` (neutral messages)
    when given, else the request's own `messages`. BadRequest for what chat cannot ask (see above)."""
    _refuse_unknown(payload)
    body: dict[str, Any] = {key: payload[key] for key in _SAME_FIELDS if key in payload}
    messages = history if history is not None else _history(payload.get("messages"))
    body["messages"] = [*_system(payload.get("system")), *(_chat_message(message) for message in messages)]
    limit = payload.get("max_tokens")
    if is_positive(limit):
        body["max_tokens"] = limit
    elif limit is not None:
        raise BadRequest("max_tokens must be at least 1: a chat-completions upstream has no cache to warm",
                         param="max_tokens")
    if isinstance(stops := payload.get("stop_sequences"), list) and stops:
        body["stop"] = stops
    if isinstance(metadata := payload.get("metadata"), dict) and isinstance(metadata.get("user_id"), str):
        body["user"] = metadata["user_id"]
    if (response_format := _response_format(payload)) is not None:
        body["response_format"] = response_format
    body.update(_tools(payload.get("tools"), payload.get("tool_choice")))
    if payload.get("stream") is True:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # message_delta carries the usage
    return body


def _refuse_unknown(payload: dict[str, Any]) -> None:
    for key in payload:
        if key in ("mcp_servers", "container"):
            raise BadRequest(f"{key} asks Anthropic to run tools; a chat-completions upstream cannot", param=key)
        if key not in _READ and key not in _SERVING:
            raise BadRequest(f"{key} has no counterpart in chat completions, which this proxy's upstream speaks",
                             param=key)


def _system(system: Any) -> list[Message]:
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if system is None:
        return []
    if not isinstance(system, list) or not all(isinstance(block, dict) and block.get("type") == "text"
                                               and isinstance(block.get("text"), str) for block in system):
        raise BadRequest("system must be a string or a list of text blocks", param="system")
    text = "\n\n".join(block["text"] for block in system if block["text"])
    return [{"role": "system", "content": text}] if text else []


def _history(messages: Any) -> list[Message]:
    """The request's messages, neutral, once nothing in them is beyond chat."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must hold at least one message", param="messages")
    for index, message in enumerate(messages):
        speaker = message.get("role") if isinstance(message, dict) else None
        if speaker not in ("user", "assistant"):  # a tuple: an unhashable role compares unequal instead of raising
            raise BadRequest(f"messages.{index}.role: Input should be 'user' or 'assistant'",
                             param=f"messages.{index}.role")
        if (problem := _beyond_chat(message.get("content"))) is not None:
            raise BadRequest(f"messages.{index}: {problem}", param=f"messages.{index}.content")
    if messages[-1].get("role") == "assistant":
        raise BadRequest("a chat-completions upstream cannot continue a last assistant message (prefill): end the "
                         "messages with the user's", param="messages")
    view = view_of_messages(messages)
    if view is None:
        raise BadRequest("messages hold blocks a chat-completions upstream cannot take", param="messages")
    return view.messages


def _beyond_chat(content: Any) -> str | None:
    """Why a message's blocks cannot go as chat, or None."""
    for block in content if isinstance(content, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str) or kind not in _BLOCKS:  # a hostile kind may be a list: no set takes it
            return f"{json.dumps(kind)[:80]} blocks have no counterpart in chat completions"
        if kind == "tool_result" and isinstance(inner := block.get("content"), list) and any(
                not isinstance(part, dict) or part.get("type") != "text" for part in inner):
            return "a tool_result may hold only text for a chat-completions upstream"
        if kind == "document" and not _text_document(block.get("source")):
            return "only text documents can go to a chat-completions upstream"
    return None


def _text_document(source: Any) -> bool:
    """A document whose source is text: plain text, or content blocks that are all text."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind != "content":
        return kind == "text"
    inner = source.get("content")
    return isinstance(inner, str) or (isinstance(inner, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in inner))


def _chat_message(message: Message) -> Message:
    """A neutral message as chat takes it: a text document as a text part, a failed tool's result said so."""
    if message.get("role") == "tool" and message.get("is_error") is True:
        message = {**message, "content": f"Error: {message.get('content') or ''}"}
    content = message.get("content")
    if isinstance(content, list) and any(isinstance(part, dict) and part.get("type") in ("file", "image_url")
                                         for part in content):
        message = {**message, "content": [_chat_part(part) for part in content]}
    return chat_message(message)


def _chat_part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    if part.get("type") == "file" and isinstance(document := part.get("document"), dict):
        return {"type": "text", "text": _document_text(document)}
    image = part.get("image_url") if part.get("type") == "image_url" else None
    url = image.get("url") if isinstance(image, dict) else None
    if isinstance(url, str) and url.startswith(_FILE_ID):
        raise BadRequest("an image from Anthropic's Files API cannot go to a chat-completions upstream",
                         param="messages")
    return part


def _document_text(document: Block) -> str:
    source = document["source"]
    data = source.get("data") if source.get("type") == "text" else source.get("content")
    if isinstance(data, list):  # a `content` source: text blocks only (_text_document)
        data = "\n".join(str(block.get("text", "")) for block in data if isinstance(block, dict))
    parts = (document.get("title"), document.get("context"), data)
    return "\n\n".join(part for part in parts if isinstance(part, str) and part)


def _response_format(payload: dict[str, Any]) -> dict[str, Any] | None:
    config = payload.get("output_config")
    if config is not None and (not isinstance(config, dict) or set(config) - _OUTPUT_CONFIG):
        raise BadRequest("output_config holds settings chat completions cannot express", param="output_config")
    chosen = config.get("format") if isinstance(config, dict) else None
    chosen = chosen if chosen is not None else payload.get("output_format")  # the structured-outputs beta's
    if chosen is None:
        return None
    schema = chosen.get("schema") if isinstance(chosen, dict) and chosen.get("type") == "json_schema" else None
    if not isinstance(schema, dict):
        raise BadRequest("only a json_schema output format can go to a chat-completions upstream",
                         param="output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    """`tools`, `tool_choice` and `parallel_tool_calls` as chat asks them; nothing without tools to choose from."""
    if tools is None or tools == []:
        return {}
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    functions = [_function(tool) for tool in tools]
    if choice is None:
        return {"tools": functions}
    kind = choice.get("type") if isinstance(choice, dict) else None
    asked: dict[str, Any] = {"tools": functions}
    if isinstance(kind, str) and kind in _TOOL_CHOICES:
        asked["tool_choice"] = _TOOL_CHOICES[kind]
    elif kind == "tool" and isinstance(choice.get("name"), str):
        asked["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise BadRequest("tool_choice must be auto, any, tool or none", param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        asked["parallel_tool_calls"] = False
    return asked


def _function(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise BadRequest(f"the {json.dumps(kind)[:80]} tool is Anthropic's to run; a chat-completions upstream "
                         "takes custom tools (name, input_schema) only", param="tools")
    if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
        raise BadRequest("a custom tool needs a name and an input_schema", param="tools")
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    function.update({key: tool[key] for key in ("description", "strict") if tool.get(key) is not None})
    return {"type": "function", "function": function}


def message_from_chat(chat: Any, request: dict[str, Any]) -> dict[str, Any] | None:
    """A chat completion as the Messages API's message; None when it is not one."""
    choices = chat.get("choices") if isinstance(chat, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    reply = dict_of(choice.get("message"))
    ident = message_id(chat.get("id"))
    calls = list_of(reply.get("tool_calls"))
    blocks = [*_text_blocks(reply.get("content")), *_text_blocks(reply.get("refusal")),
              *(tool_use_block(call, ident, index) for index, call in enumerate(calls) if isinstance(call, dict))]
    reason, sequence = stop_of(choice, request, calls=bool(calls))
    model = chat.get("model")
    return {"id": ident, "type": "message", "role": "assistant",
            "model": model if isinstance(model, str) else request.get("model"), "content": blocks,
            "stop_reason": reason, "stop_sequence": sequence, "usage": anthropic_usage(chat.get("usage"))}


def message_id(chat_id: Any) -> str:
    """Anthropic's `msg_` id for a chat completion's own (a made-up one when it has none)."""
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_chat{time.time_ns()}"


def dict_of(value: Any) -> dict[str, Any]:
    """`value` when it is an object, else an empty one: what an upstream sends may be anything."""
    return value if isinstance(value, dict) else {}


def list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text_blocks(text: Any) -> list[Block]:
    return [{"type": "text", "text": text}] if isinstance(text, str) and text else []


def tool_use_block(call: dict[str, Any], ident: str, index: int) -> Block:
    """A chat tool call as a tool_use block, through messages_blocks.render: arguments that are no JSON object
    become `{"raw": text}`, the model's words kept where `{}` would lose them (its next turn sees what it wrote,
    and the tool may say what is wrong) and no call is lost for a slip of syntax."""
    function = dict_of(call.get("function"))
    name, call_id = function.get("name"), call.get("id")
    made = {"id": call_id if isinstance(call_id, str) and call_id else f"toolu_{ident}_{index}", "type": "function",
            "function": {"name": name if isinstance(name, str) else "", "arguments": function.get("arguments")}}
    block: Block = render([{"role": "assistant", "content": None, "tool_calls": [made]}])[0]["content"][0]
    return block


def stop_of(choice: dict[str, Any], request: dict[str, Any], *, calls: bool) -> tuple[str, str | None]:
    """A chat finish as Anthropic's `stop_reason` and `stop_sequence`. Tool calls mean tool_use whatever the server
    said (some say "stop"); vLLM names the stop string it met in `stop_reason`, the only server that tells."""
    finish = choice.get("finish_reason")
    if calls and finish != "length":
        return "tool_use", None
    matched = choice.get("stop_reason")
    stops = request.get("stop_sequences")
    if finish == "stop" and isinstance(matched, str) and isinstance(stops, list) and matched in stops:
        return "stop_sequence", matched
    return _STOPS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn", None


def anthropic_usage(usage: Any) -> dict[str, int]:
    """Chat usage as Anthropic counts it: cache reads apart from the rest of the input; 0 for what is unknown."""
    usage = usage if isinstance(usage, dict) else {}
    prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = prompt if is_positive(prompt) else 0
    counted: dict[str, int] = {"input_tokens": prompt, "output_tokens": output if is_positive(output) else 0}
    if is_positive(cached) and cached <= prompt:
        counted.update(input_tokens=prompt - cached, cache_read_input_tokens=cached)
    return counted


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """An upstream's error in Anthropic's shape, its type the one the Messages dialect gives its own errors of that
    status (the error is not the proxy's: it only borrows that mapping)."""
    said = ProxyError(message)
    said.status = status
    return MESSAGES.error_body(said)


def error_from_chat(status: int, body: bytes) -> bytes:
    """A chat server's error body (OpenAI's `{"error": {...}}`, FastAPI's `{"detail": ...}`, plain text) in
    Anthropic's shape, with the upstream's words. An overflow keeps reading as one (proxy.upstream.overflow): typed
    invalid_request_error as Anthropic's own "prompt is too long" is, whatever status said it, and told in the whole
    body's words where its message alone does not say it (a provider's error nested in another's)."""
    if not body.strip():
        return body  # nothing to shape: the status says it all
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        payload = None
    if isinstance(payload, dict) and payload.get("type") == "error" and isinstance(payload.get("error"), dict):
        return body  # Anthropic's already (a gateway that speaks both)
    overflow = detect_context_overflow(status, body)
    kind = 400 if overflow else status
    record = payload.get("error", payload.get("detail", payload)) if isinstance(payload, dict) else payload
    shaped = encode_json(anthropic_error(kind, error_text(record, body) if payload is not None else _text(body)))
    if overflow and not detect_context_overflow(status, shaped):
        shaped = encode_json(anthropic_error(kind, _text(body)))
    return shaped


def _text(body: bytes) -> str:
    return body.decode("utf-8", "replace").strip()


def error_text(record: Any, fallback: bytes = b"") -> str:
    """The words of an error record: its message, with its code when the message does not already say it."""
    if isinstance(record, str):
        return record
    message = record.get("message") if isinstance(record, dict) else None
    if not isinstance(message, str):
        return _text(fallback) or json.dumps(record)[:2000]
    code = record.get("code")
    return f"{message} ({code})" if isinstance(code, str) and code and code not in message else message
