"""Anthropic's compaction contract, served by the proxy for any upstream: `compaction` blocks made and opened, and
the answers that carry them (a compacted turn, a paused one, an on-demand `compaction` request).

A block the proxy makes holds the summary's text in `content` (what a person or a client reads) and, in
`encrypted_content`, the whole compacted conversation sealed (core.envelope: the messages kept before the summary,
the summary, the messages kept after it), so a client that drops everything before the block, as Anthropic's rules
let it, loses nothing. On a later request the latest block stands for everything before it: the proxy's own is
opened into that conversation; another issuer's is read as its summary text; a null one (a failed compaction) is
a no-op. Reports of clearing edits travel as Anthropic's `context_management.applied_edits`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from proxy.core.envelope import Sealed, opened, seal
from proxy.core.messages import Message, content_text, role
from proxy.core.usage import Usage
from proxy.core.view import View
from proxy.dialects.messages_blocks import alternate, render
from proxy.upstream.answer import RewritingTap, StreamTap
from proxy.upstream.streaming import PREAMBLE_TYPES, SseEvent, sse_event

Block = dict[str, Any]


def with_compactions_opened(messages: Any, plain: int = 0) -> list[Any] | None:
    """`messages` from the latest `compaction` block on, that block replaced by what it stands for, and no-op blocks
    (null content: a failed compaction) taken out; None when no message holds a compaction block. The first
    `plain` messages are known to hold none (messages_blocks.read_plainly)."""
    if not isinstance(messages, list) or not any(map(_blocks_in, itertools.islice(messages, plain, None))):
        return None
    found = _latest_block(messages)
    start, opened_messages = 0, []
    if found is not None:
        index, position = found
        holder = messages[index]
        rest = holder["content"][position + 1:]
        opened_messages = [*_stands_for(holder["content"][position]), *([{**holder, "content": rest}] if rest else [])]
        start = index + 1
    kept = [_without_blocks(message) for message in [*opened_messages, *messages[start:]]]
    return alternate([message for message in kept if message is not None])


def compaction_block(view: View, messages: list[Message], synthetic: frozenset[int]) -> Block:
    """A compacted history as the one block a client resends in its place: the summary readable, and everything
    kept verbatim (the client's own messages) sealed with it; the summary's acknowledgement left out."""
    runs: list[list[Message]] = [[]]
    summary: str | None = None
    for index, message in enumerate(messages):
        if index not in synthetic:
            runs[-1].append(message)
        elif role(message) == "user" and summary is None:
            summary = content_text(message.get("content"))
            runs.append([])
    parts = [alternate(view.back(run, render)) if run else [] for run in runs]
    before, after = parts[0], [message for part in parts[1:] for message in part]
    return {"type": "compaction", "content": summary or None,
            "encrypted_content": seal(Sealed(tuple(before), summary, tuple(after)))}


FAILED_BLOCK: Block = {"type": "compaction", "content": None}  # Anthropic's sign of a compaction that failed


def announced_body(body: bytes, block: Block | None, applied: list[dict[str, Any]] | None) -> bytes:
    """A whole message with the compaction block first in its content and the edits applied reported; anything that
    is not a message object is left as it came."""
    try:
        message = json.loads(body)
    except ValueError:
        return body
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return body
    if block is not None:
        message["content"] = [block, *message["content"]]
    if applied is not None:
        message["context_management"] = {"applied_edits": applied}
    return json.dumps(message, ensure_ascii=False).encode()


def compaction_message(model: str, block: Block, usage: Usage) -> dict[str, Any]:
    """The answer that is only a compaction (on-demand, or paused after one): nothing sampled after the block."""
    return {"id": f"msg_cmp_{_digest(json.dumps(block, sort_keys=True))}", "type": "message", "role": "assistant",
            "model": model, "content": [block], "stop_reason": "compaction", "stop_sequence": None,
            "usage": {"input_tokens": usage.input_tokens or 0, "output_tokens": usage.output_tokens or 0}}


def message_events(message: dict[str, Any], applied: list[dict[str, Any]] | None = None) -> bytes:
    """`compaction_message` as the Messages API streams it: the block started, its one `compaction_delta`, then
    the stop reason and usage."""
    block = message["content"][0]
    closing: dict[str, Any] = {"type": "message_delta", "delta": {"stop_reason": "compaction", "stop_sequence": None},
                               "usage": {"output_tokens": message["usage"]["output_tokens"]}}
    if applied is not None:
        closing["context_management"] = {"applied_edits": applied}
    events = [{"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                    "usage": {**message["usage"], "output_tokens": 0}}},
              *_block_events(block, 0), closing, {"type": "message_stop"}]
    return b"".join(sse_event(event) for event in events)


class AnnouncingTap(RewritingTap):
    """A Messages stream with the compaction block added as content block 0 right after `message_start` (every
    later block's `index` moved on by one) and the applied edits in `message_delta`. A stream that errs before any
    content announces nothing (the client keeps its whole history); its bytes pass unchanged."""

    def __init__(self, inner: StreamTap, block: Block | None, applied: list[dict[str, Any]] | None) -> None:
        super().__init__(inner)
        self._block = block
        self._applied = applied
        self._state = "preamble"  # then "announced" or "declined"

    def _event(self, event: SseEvent) -> bytes:
        payload = event.json()
        if not isinstance(payload, dict) or self._state == "declined":
            return event.raw
        if self._state == "preamble" and payload.get("type") not in PREAMBLE_TYPES:
            if payload.get("type") == "error":
                self._state = "declined"
                return event.raw
            self._state = "announced"
            opening = b"".join(sse_event(made) for made in _block_events(self._block, 0)) if self._block else b""
            return opening + self._moved(payload, event)
        return self._moved(payload, event) if self._state == "announced" else event.raw

    def _moved(self, payload: dict[str, Any], event: SseEvent) -> bytes:
        moved = payload
        if self._block is not None and isinstance(payload.get("index"), int):
            moved = {**payload, "index": payload["index"] + 1}
        if self._applied is not None and payload.get("type") == "message_delta":
            moved = {**moved, "context_management": {"applied_edits": self._applied}}
        return event.raw if moved is payload else sse_event(moved)


def _block_events(block: Block, index: int) -> list[dict[str, Any]]:
    """One compaction block as the Messages API streams it: started empty, its content in one delta, stopped."""
    delta = {"type": "compaction_delta", "content": block.get("content"),
             "encrypted_content": block.get("encrypted_content")}
    return [{"type": "content_block_start", "index": index, "content_block": {"type": "compaction", "content": None}},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index}]


def _latest_block(messages: list[Any]) -> tuple[int, int] | None:
    """Where the latest block that stands for something is (a null one is a no-op, as Anthropic treats it)."""
    for index in range(len(messages) - 1, -1, -1):
        content = messages[index].get("content") if isinstance(messages[index], dict) else None
        if isinstance(content, list):
            for position in range(len(content) - 1, -1, -1):
                if _is_block(content[position]) and _stands_for(content[position]):
                    return index, position
    return None


def _blocks_in(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(_is_block(block) for block in content)


def _without_blocks(message: Any) -> Any:
    """The message with any compaction block left in it taken out (no-ops); None when nothing else is left."""
    if not _blocks_in(message):
        return message
    rest = [block for block in message["content"] if not _is_block(block)]
    return {**message, "content": rest} if rest else None


def _is_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "compaction"


def _stands_for(block: Block) -> list[Any]:
    """What a compaction block replaces everything before it with."""
    sealed = opened(block.get("encrypted_content"))
    if sealed is not None:
        summary = [_summary_message(sealed.summary)] if sealed.summary else []
        return [*sealed.before, *summary, *sealed.after]
    text = block.get("content")
    return [_summary_message(text)] if isinstance(text, str) and text.strip() else []


def _summary_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]
