"""OpenAI's compaction contract, served by the proxy for any upstream: its `compaction` items made and opened, and
the answers that carry one (POST /responses/compact, a turn that ends with a `compaction_trigger`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from typing import Any

from proxy.core.envelope import Sealed, opened, seal
from proxy.core.messages import Message, content_text, role
from proxy.core.usage import Usage
from proxy.core.view import View
from proxy.dialects.responses_items import as_input_items, render
from proxy.dialects.responses_request import ResponsesCall
from proxy.upstream.answer import RewritingTap, StreamTap
from proxy.upstream.streaming import PREAMBLE_TYPES, SseEvent, sse_event

Item = dict[str, Any]
# Items a client may keep beside a compaction item (Codex keeps its user messages and resends its instructions):
# where the client holds a copy, the envelope's copy is not added again.
_KEPT_BY_CLIENTS = frozenset({"user", "developer", "system"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# The events that end a stream without an answer; and those that close a response stream, each carrying the whole
# response with its usage, status and output.
_FAILURES = frozenset({"error", "response.failed"})
CLOSING_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def with_envelopes_opened(items: Any, plain: int = 0) -> list[Any] | None:
    """`items` with each of the proxy's own `compaction` items (core.envelope) opened into the conversation it
    stands for; None when there is none (another issuer's compaction items stay as they are). The first `plain`
    items are known to hold no compaction item (responses_items.read_plainly)."""
    if not isinstance(items, list) or not any(map(_is_compaction, itertools.islice(items, plain, None))):
        return None
    sealed = [opened(item.get("encrypted_content")) if _is_compaction(item) else None for item in items]
    if all(envelope is None for envelope in sealed):
        return None
    present = {_canonical(item) for item, envelope in zip(items, sealed, strict=True)
               if envelope is None and _kept_by_clients(item)}
    out: list[Any] = []
    for item, envelope in zip(items, sealed, strict=True):
        if envelope is None:
            out.append(item)
            continue
        out.extend(kept for kept in envelope.before if not (_kept_by_clients(kept) and _canonical(kept) in present))
        if envelope.summary is not None:
            out.append({"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                         "text": envelope.summary}]})
        out.extend(kept for kept in envelope.after if not (_kept_by_clients(kept) and _canonical(kept) in present))
    return out


def compaction_item(view: View, messages: list[Message], synthetic: frozenset[int]) -> Item:
    """A compacted history as the one `compaction` item a client resends in its place: the summary and everything
    kept verbatim (the client's own items), sealed together; the summary's acknowledgements are left out."""
    runs: list[list[Any]] = [[]]
    summary: str | None = None
    for index, message in enumerate(messages):
        if index not in synthetic:
            runs[-1].append(message)
        elif role(message) == "user" and summary is None:
            summary = content_text(message.get("content"))
            runs.append([])
    parts = [as_input_items(view.back(run, render)) if run else [] for run in runs]
    before, after = parts[0], [item for part in parts[1:] for item in part]
    envelope = seal(Sealed(tuple(before), summary, tuple(after)))
    return {"type": "compaction", "id": f"cmp_{_digest(envelope)}", "encrypted_content": envelope}


def compaction_response(item: Item, usage: Usage) -> dict[str, Any]:
    """The answer to POST /responses/compact: the item that stands in for the conversation from now on."""
    return {"id": f"resp_cmp_{_digest(item['id'])}", "object": "response.compaction", "created_at": int(time.time()),
            "output": [item], "usage": _usage(usage)}


def compaction_turn(call: ResponsesCall, item: Item, usage: Usage) -> dict[str, Any]:
    """The response to a request that ends with a `compaction_trigger`: exactly one output item, the compaction."""
    return {"id": f"resp_cmp_{_digest(item['id'])}", "object": "response", "created_at": int(time.time()),
            "status": "completed", "error": None, "incomplete_details": None, "model": call.model,
            "instructions": call.payload.get("instructions"), "output": [item], "usage": _usage(usage),
            "parallel_tool_calls": call.payload.get("parallel_tool_calls", True),
            "tool_choice": call.payload.get("tool_choice", "auto"), "tools": call.payload.get("tools") or [],
            "store": call.payload.get("store", False)}


def turn_events(response: dict[str, Any]) -> bytes:
    """`compaction_turn`'s response as the stream the Responses API sends: preamble, the item added and done (with
    its content in both: a client may read either), then `response.completed` with the usage."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    item = response["output"][0]
    events = [{"type": "response.created", "response": pending},
              {"type": "response.in_progress", "response": pending},
              {"type": "response.output_item.added", "output_index": 0, "item": item},
              {"type": "response.output_item.done", "output_index": 0, "item": item},
              {"type": "response.completed", "response": response}]
    return b"".join(sse_event({**event, "sequence_number": number}) for number, event in enumerate(events))


def announced_body(body: bytes, item: Item) -> bytes:
    """A whole response with the compaction item first in its output (for a request whose `context_management`
    entry the proxy applied); anything that is not a response object is left as it came."""
    try:
        response = json.loads(body)
    except ValueError:
        return body
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return body
    return json.dumps({**response, "output": [item, *response["output"]]}, ensure_ascii=False).encode()


class AnnouncingTap(RewritingTap):
    """A response stream with the compaction item added as its first output item: announced right after the
    preamble (`response.created`, `response.in_progress`), every later `output_index` and `sequence_number` moved
    on to make room, the item first in the closing response's output. A stream that fails or errs before any
    output announces nothing (the client keeps its whole history); its bytes pass unchanged."""

    def __init__(self, inner: StreamTap, item: Item) -> None:
        super().__init__(inner)
        self._item = item
        self._state = "preamble"  # then "announced" or "declined"

    def _event(self, event: SseEvent) -> bytes:
        payload = event.json()
        if not isinstance(payload, dict):
            return event.raw  # a comment or keep-alive: nothing to number
        if self._state == "preamble" and payload.get("type") not in PREAMBLE_TYPES:
            if payload.get("type") in _FAILURES:
                self._state = "declined"
            else:
                self._state = "announced"
                return self._announcement(payload) + self._moved(payload)
        return self._moved(payload) if self._state == "announced" else event.raw

    def _announcement(self, first: dict[str, Any]) -> bytes:
        number = first.get("sequence_number")
        events = [{"type": "response.output_item.added", "output_index": 0, "item": self._item},
                  {"type": "response.output_item.done", "output_index": 0, "item": self._item}]
        if isinstance(number, int):
            for offset, event in enumerate(events):
                event["sequence_number"] = number + offset
        return b"".join(sse_event(event) for event in events)

    def _moved(self, payload: dict[str, Any]) -> bytes:
        moved = dict(payload)
        if isinstance(moved.get("sequence_number"), int):
            moved["sequence_number"] += 2
        if isinstance(moved.get("output_index"), int):
            moved["output_index"] += 1
        response = moved.get("response")
        closing = moved.get("type") in CLOSING_EVENTS
        if closing and isinstance(response, dict) and isinstance(response.get("output"), list):
            moved["response"] = {**response, "output": [self._item, *response["output"]]}
        return sse_event(moved)


def _usage(usage: Usage) -> dict[str, int]:
    before, after = usage.input_tokens or 0, usage.output_tokens or 0
    return {"input_tokens": before, "output_tokens": after, "total_tokens": before + after}


def _is_compaction(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "compaction"


def _kept_by_clients(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") in _KEPT_BY_CLIENTS


def _canonical(item: Any) -> str:
    """A message as its role and words, whatever the form it is written in (a string or text parts, with or
    without `type: message`): the proxy may have written its copy in the long form, the client in the short."""
    content = item.get("content")
    parts = [content] if isinstance(content, str) else content if isinstance(content, list) else [content]
    words = [part.get("text") if isinstance(part, dict) and part.get("type") in _TEXT_PARTS else part
             for part in parts]
    return json.dumps([item.get("role"), words], sort_keys=True, ensure_ascii=False)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]
