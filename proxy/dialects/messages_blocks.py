"""Anthropic Messages (`POST /v1/messages`) `messages` as the neutral view, and compaction's messages as blocks."""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Iterable
from typing import Any

from proxy.core.fingerprint import dumps_iteratively
from proxy.core.messages import Message, content_text, role
from proxy.core.view import Group, View
from proxy.dialects.kept_reads import Reads, read_before, read_on

Block = dict[str, Any]
_ROLE = operator.methodcaller("get", "role")
# Where a document's bytes live; with no title, the kind names the document for the summariser.
_DOCUMENT_SOURCES = ("base64", "text", "url", "content", "file")
# Image sources have no neutral field of their own, so the neutral url spells a file id with this prefix.
_FILE_ID = "file_id:"


class _Unreadable(Exception):
    """A construct the view cannot stand for: the whole request is forwarded untouched."""


def view_of_messages(value: Any, reads: Reads | None = None) -> View | None:
    """The request's `messages` as a view, one group per message; None when any of it is not understood. With
    `reads` (the body memo), a list that grew from one read before is read from where that read stopped."""
    if not isinstance(value, list) or not value:
        return None
    reader = read_on(value, reads, _Reader)
    return View.of(reader.groups, value, reader.messages) if reader is not None else None


def read_plainly(messages: object, reads: Reads | None) -> int:
    """How many of the first `messages` a kept view read has read (dialects.kept_reads): none of them holds a
    compaction block, which this reader refuses (so the request's parse need not look for one there)."""
    kept = read_before(messages, reads, _Reader)
    return kept[1] if kept is not None else 0


class _Reader:
    """Reads messages in order into groups. A copy reads on independently: one is kept with the history in the
    body memo (its groups are shared with the conversation's next requests, so nothing may change them in place),
    and the next request's read goes on from a copy of it."""

    def __init__(self) -> None:
        self.groups: list[Group] = []
        self.messages: list[Message] = []  # the groups' messages, in order
        self.calls: frozenset[str] = frozenset()  # the tool_use ids the message before made: what results may answer
        # Where a message has the role of the one before it (its place), in order: see alternating.
        self.repeats: list[int] = []

    def read(self, message: Any) -> bool:
        """Takes one message; False when it is not understood (the whole request is then forwarded untouched)."""
        try:
            messages, self.calls = _read(message, self.calls)
        except _Unreadable:
            return False
        if self.groups and _ROLE(self.groups[-1].items[0]) == _ROLE(message):
            self.repeats.append(len(self.groups))
        self.groups.append(Group((message,), tuple(messages)))
        self.messages += messages
        return True

    def copy(self) -> _Reader:
        twin = _Reader()
        twin.groups, twin.messages, twin.calls = list(self.groups), list(self.messages), self.calls
        twin.repeats = list(self.repeats)
        return twin

    def intact(self) -> bool:
        """Whether reading the same messages afresh makes the same groups (KeptRead)."""
        fresh = _Reader()
        return all(fresh.read(group.items[0]) for group in self.groups) and fresh.groups == self.groups and \
            fresh.messages == self.messages and fresh.repeats == self.repeats


def _read(message: Any, answerable: frozenset[str]) -> tuple[list[Message], frozenset[str]]:
    """A message's neutral messages and the ids of the tool calls it makes."""
    if not isinstance(message, dict):
        raise _Unreadable
    speaker, content = message.get("role"), message.get("content")
    if speaker not in ("user", "assistant"):  # a tuple: `in` on a set would hash an unhashable role and raise
        raise _Unreadable
    if isinstance(content, str):
        return [{"role": speaker, "content": content}], frozenset()
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        raise _Unreadable
    if speaker == "user":
        return _read_user(content, answerable), frozenset()
    return _read_assistant(content)


def _read_user(content: list[Block], answerable: frozenset[str]) -> list[Message]:
    """Tool results first (they answer the call before), then one user message with every other block."""
    results: list[Message] = []
    parts: list[Block] = []
    answered: set[str] = set()
    for block in content:
        if block.get("type") == "tool_result":
            results.append(_tool_message(block, answerable, answered))
        else:
            parts.append(_user_part(block))
    if parts or not results:
        results.append({"role": "user", "content": parts})
    return results


def _tool_message(block: Block, answerable: frozenset[str], answered: set[str]) -> Message:
    call_id = block.get("tool_use_id")
    # The API takes a result only right after its call, once: anything else would be refused upstream anyway.
    if not isinstance(call_id, str) or call_id not in answerable or call_id in answered:
        raise _Unreadable
    answered.add(call_id)
    message: Message = {"role": "tool", "tool_call_id": call_id, "content": _result_text(block.get("content"))}
    if block.get("is_error") is True:
        message["is_error"] = True  # kept by placeholder copies, so a rendered result still says it failed
    return message


def _result_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _Unreadable
    return "\n".join(_result_piece(block) for block in content)


def _result_piece(block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    if kind == "image":
        _image_url(block)  # checked like a user's image, shown as a mark
        return "[image]"
    if kind == "document":
        return f"[document: {_document_name(block)}]"
    raise _Unreadable


def _user_part(block: Block) -> Block:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": _image_url(block)}}
    if kind == "document":
        # The block rides along: a document has no neutral form it could be rendered back from.
        return {"type": "file", "file": {"filename": _document_name(block)}, "document": block}
    raise _Unreadable


def _image_url(block: Block) -> str:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _Unreadable
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("media_type"), str) and isinstance(source.get("data"), str):
        return f"data:{source['media_type']};base64,{source['data']}"
    if kind == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    if kind == "file" and isinstance(source.get("file_id"), str):
        return _FILE_ID + str(source["file_id"])
    raise _Unreadable


def _document_name(block: Block) -> str:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind not in _DOCUMENT_SOURCES:  # a tuple: an unhashable type compares unequal instead of raising
        raise _Unreadable
    title = block.get("title")
    return title if isinstance(title, str) and title else str(kind)


def _read_assistant(content: list[Block]) -> tuple[list[Message], frozenset[str]]:
    parts: list[Block] = []
    calls: list[Block] = []
    for block in content:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind in ("thinking", "redacted_thinking"):
            parts.append(_reasoning_part(block))
        else:
            raise _Unreadable
    message: Message = {"role": "assistant", "content": parts or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return [message], frozenset(call["id"] for call in calls)


def _tool_call(block: Block) -> Block:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise _Unreadable
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _compact_json(arguments)}}


def _compact_json(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:  # deeper than json's recursion goes; the request reader lets 128 levels through
        return dumps_iteratively(value, ensure_ascii=False)


def _reasoning_part(block: Block) -> Block:
    """A thinking block's neutral part: the same fields, so it could be rendered back; it counts as nothing."""
    if block.get("type") == "thinking":
        thinking, signature = block.get("thinking"), block.get("signature")
        if isinstance(thinking, str) and isinstance(signature, str):
            return {"type": "thinking", "thinking": thinking, "signature": signature}
    elif isinstance(block.get("data"), str):
        return {"type": "redacted_thinking", "data": block["data"]}
    raise _Unreadable


def render(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages compaction made as Anthropic messages: tool results as user blocks (first), instructions as user
    text, and neighbours of one role merged, so the run alternates."""
    rendered: list[dict[str, Any]] = []
    for message in messages:
        speaker, blocks = _blocks_of(message)
        if not blocks:
            continue  # the API refuses empty content; an empty message says nothing anyway
        if rendered and rendered[-1]["role"] == speaker:
            rendered[-1]["content"].extend(blocks)
        else:
            rendered.append({"role": speaker, "content": blocks})
    for message in rendered:
        if message["role"] == "user":  # the API wants a message's tool results before its other blocks
            blocks = message["content"]
            message["content"] = [b for b in blocks if b["type"] == "tool_result"] + \
                                 [b for b in blocks if b["type"] != "tool_result"]
    return rendered


def _blocks_of(message: Any) -> tuple[str, list[Block]]:
    if not isinstance(message, dict):
        return "user", []
    speaker = role(message)
    if speaker == "assistant":
        return "assistant", _assistant_blocks(message)
    if speaker == "tool" and isinstance(message.get("tool_call_id"), str):
        result: Block = {"type": "tool_result", "tool_use_id": message["tool_call_id"],
                         "content": content_text(message.get("content"))}
        if message.get("is_error") is True:
            result["is_error"] = True
        return "user", [result]
    if speaker == "user":
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        return "user", [block for part in parts if (block := _user_block(part)) is not None]
    # Instructions (and any other role): the Messages API has no such role inside `messages`.
    return "user", _text_blocks(content_text(message.get("content")))


def _text_blocks(text: str) -> list[Block]:
    return [{"type": "text", "text": text}] if text else []


def _user_block(part: Any) -> Block | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str) and part["text"]:
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        image = part.get("image_url")
        return _image_block(image.get("url") if isinstance(image, dict) else image)
    if kind == "file":
        document = part.get("document")
        if isinstance(document, dict) and document.get("type") == "document":
            return document
        file = part.get("file")
        name = file.get("filename") if isinstance(file, dict) else None
        return {"type": "text", "text": f"[document: {name if isinstance(name, str) and name else 'unnamed'}]"}
    return None  # reasoning and unknown parts have no place in a user message


def _image_block(url: Any) -> Block | None:
    if not isinstance(url, str) or not url:
        return None
    if url.startswith(_FILE_ID):
        return {"type": "image", "source": {"type": "file", "file_id": url[len(_FILE_ID):]}}
    if url.startswith("data:"):
        header, _, data = url[5:].partition(",")
        if header.endswith(";base64") and data:
            return {"type": "image", "source": {"type": "base64", "media_type": header[:-7], "data": data}}
        return {"type": "text", "text": "[image]"}  # a data url the API cannot take
    return {"type": "image", "source": {"type": "url", "url": url}}


def _assistant_blocks(message: Message) -> list[Block]:
    content = message.get("content")
    parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
    blocks = [block for part in parts if (block := _assistant_block(part)) is not None]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(call, dict) and isinstance(call.get("id"), str) and isinstance(name, str) \
                and isinstance(function, dict):
            blocks.append({"type": "tool_use", "id": call["id"], "name": name,
                           "input": _input(function.get("arguments"))})
    return blocks


def _assistant_block(part: Any) -> Block | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str) and part["text"]:
        return {"type": "text", "text": part["text"]}
    if kind == "thinking" and isinstance(part.get("thinking"), str) and isinstance(part.get("signature"), str):
        return {"type": "thinking", "thinking": part["thinking"], "signature": part["signature"]}
    if kind == "redacted_thinking" and isinstance(part.get("data"), str):
        return {"type": "redacted_thinking", "data": part["data"]}
    return None  # another API's reasoning (no signature) would be refused


def _input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the object `input` must be; text that is no object is kept under "raw"."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return {"raw": arguments}
    return parsed if isinstance(parsed, dict) else {"raw": arguments}


def alternate(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with each run of one role merged into one message (blocks in order); lone messages kept as they
    are, the same objects. Needed where a rendered run meets a client's message of the same role."""
    merged: list[dict[str, Any]] = []
    start = 0
    while start < len(messages):
        end = start + 1
        while end < len(messages) and _same_role(messages[start], messages[end]):
            end += 1
        run = messages[start:end]
        merged.append(run[0] if len(run) == 1 else
                      {**run[0], "content": [block for message in run for block in _as_blocks(message.get("content"))]})
        start = end
    return merged


def alternating(front: list[dict[str, Any]], messages: list[Any], kept_from: int, reads: Reads | None = None) -> bool:
    """Whether no two neighbours in `front` (a run render made, whose neighbours it merged) then
    `messages[kept_from:]` share a role, so alternate() leaves them as they are (it merges only neighbours of one
    role). With `reads` (the body memo) keeping a read of the messages' first ones, those are not looked at again:
    the read noted where two of them share a role (looking at the role of every message kept and of the summary's
    cost a Messages reuse hit some 140,000 instructions of its 5 million)."""
    if front and kept_from < len(messages) and _ROLE(front[-1]) == _ROLE(messages[kept_from]):
        return False
    kept = read_before(messages, reads, _Reader)
    if kept is None or kept[1] <= kept_from:
        return _alternate_already(messages[kept_from:])
    reader, count = kept
    return (not reader.repeats or reader.repeats[-1] <= kept_from) and _alternate_already(messages[count - 1:])


def _alternate_already(items: Iterable[Any]) -> bool:
    """Whether no two neighbours share a role; looked at at C speed."""
    roles = list(map(_ROLE, items))
    return not any(map(operator.eq, roles, itertools.islice(roles, 1, None)))


def _same_role(first: Any, second: Any) -> bool:
    return (role(first) in ("user", "assistant") and role(first) == role(second)
            and _mergeable(first.get("content")) and _mergeable(second.get("content")))


def _mergeable(content: Any) -> bool:
    return isinstance(content, str | list)


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, list):
        return content
    return _text_blocks(content) if isinstance(content, str) else []
