"""The Responses API's `input` (POST /v1/responses) as the neutral view, and compaction's messages as input items."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.core.messages import Message, role
from proxy.core.view import Group, View
from proxy.dialects.kept_reads import Reads, read_before, read_on

Item = dict[str, Any]

MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
# Each kind of tool call the model makes, and the kind of item that answers it.
CALL_TYPES = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
ANSWERED_TYPES = {output: call for call, output in CALL_TYPES.items()}
# The field holding what a call passes its tool: JSON arguments for a function, free text for a custom tool.
CALL_BODIES = {"function_call": "arguments", "custom_tool_call": "input"}
# Marks a tool result that answers a custom tool call: a placeholder copy of it must render as the same kind of item.
RESULT_TYPE_KEY = "item_type"
# A neutral image URL standing for an uploaded file, so the image can be rendered back as that file.
FILE_ID_PREFIX = "file_id:"
# The fields of an `input_file` part, kept on the neutral `file` part; any of the last three locates the document.
FILE_KEYS = ("filename", "file_id", "file_data", "file_url")
FILE_LOCATORS = ("file_id", "file_data", "file_url")


def view_of_input(value: Any, reads: Reads | None = None) -> View | None:
    """The request's `input` as groups of neutral messages, or None when it holds anything not understood here.
    With `reads` (the body memo), a list that grew from one read before is read from where that read stopped."""
    if isinstance(value, str):
        return View.of([Group((value,), ({"role": "user", "content": value},))])
    # An empty list has nothing to compact, and a view without groups would map back as neutral messages.
    if not isinstance(value, list) or not value:
        return None
    reader = read_on(value, reads, _Reader)
    return View.of(reader.finish(), value, reader.messages) if reader is not None else None


def as_input_items(items: list[Any]) -> list[Any]:
    """A back()ed list as a valid `input` list: a string input's lone item becomes a user message."""
    return [{"type": "message", "role": "user", "content": item} if isinstance(item, str) else item
            for item in items]


def render(messages: list[Message]) -> list[Item]:
    """Neutral messages compaction made (a summary, an acknowledgement, placeholders) as Responses input items."""
    items: list[Item] = []
    for message in messages:
        items.extend(_rendered(message))
    return items


@dataclass
class _Turn:
    """An assistant turn being read: reasoning, then at most one message, then the calls it makes."""

    items: list[Any] = field(default_factory=list)
    reasoning: list[Message] = field(default_factory=list)
    content: str | list[Message] | None = None
    said: bool = False
    calls: list[Message] = field(default_factory=list)

    def takes(self, kind: str) -> bool:
        """Whether an item of `kind` continues this turn: calls always do (parallel calls are one turn); a message
        or reasoning only before any text or call, since after them it starts the model's next turn."""
        return kind in CALL_TYPES or not (self.said or self.calls)

    def copy(self) -> _Turn:
        return _Turn(list(self.items), list(self.reasoning), self.content, self.said, list(self.calls))

    def message(self) -> Message:
        content = self.content
        if self.reasoning:
            spoken = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            content = [*self.reasoning, *spoken]
        message: Message = {"role": "assistant", "content": content}
        if self.calls:
            message["tool_calls"] = self.calls
        return message


def read_plainly(items: object, reads: Reads | None) -> int:
    """How many of the first `items` a kept view read has read (dialects.kept_reads) when it met no compaction item
    among them: the request's parse need not look there for the proxy's own to open."""
    kept = read_before(items, reads, _Reader)
    return kept[1] if kept is not None and kept[0].compactions == 0 else 0


class _Reader:
    """Reads items in order into groups, checking that each result answers a call made before it, once.

    A copy reads on independently: one is kept with the history in the body memo (what it made is shared with
    the next requests of the conversation, so nothing may change it in place) and the next request's read goes on
    from a copy of it."""

    def __init__(self) -> None:
        self.groups: list[Group] = []
        self.messages: list[Message] = []  # the groups' messages, in order
        self.turn: _Turn | None = None
        self.calls: dict[str, str] = {}  # call_id -> the kind of call
        self.answered: set[str] = set()
        self.compactions = 0  # compaction items read (the proxy's own would have been opened before the view)

    def copy(self) -> _Reader:
        twin = _Reader()
        twin.groups, twin.messages = list(self.groups), list(self.messages)
        twin.turn = self.turn.copy() if self.turn is not None else None
        twin.calls, twin.answered = dict(self.calls), set(self.answered)
        twin.compactions = self.compactions
        return twin

    def intact(self) -> bool:
        """Whether reading the same items afresh makes the same groups (KeptRead)."""
        twin = self.copy()
        made = twin.finish()
        fresh = _Reader()
        return all(map(fresh.read, (item for group in made for item in group.items))) and fresh.finish() == made \
            and fresh.messages == twin.messages

    def read(self, item: Any) -> bool:
        """Takes one item; False when it is one this module does not know (the whole input is then left alone)."""
        kind = _kind(item)
        if kind == "message":
            return self._message(item)
        if kind == "reasoning":
            turn = self._turn_for(kind)
            turn.items.append(item)
            turn.reasoning.append(_opaque_part(item))
            return True
        if kind in CALL_TYPES:
            return self._call(item, kind)
        if kind in ANSWERED_TYPES:
            return self._result(item, kind)
        if kind == "compaction":
            # The provider's own compacted history: kept like an instruction, never summarised.
            self.compactions += 1
            self._add(item, {"role": "developer", "content": [_opaque_part(item)]})
            return True
        return False

    def finish(self) -> list[Group]:
        self._close()
        return self.groups

    def _message(self, item: Item) -> bool:
        speaker = role(item)
        content = _neutral_content(item.get("content"))
        if speaker not in MESSAGE_ROLES or content is None:
            return False
        if speaker == "assistant":
            turn = self._turn_for("message")
            turn.items.append(item)
            turn.content, turn.said = content, True
            return True
        self._add(item, {"role": speaker, "content": content})
        return True

    def _call(self, item: Item, kind: str) -> bool:
        call_id, name, body = item.get("call_id"), item.get("name"), item.get(CALL_BODIES[kind])
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(body, str)) or call_id in self.calls:
            return False
        self.calls[call_id] = kind
        turn = self._turn_for(kind)
        turn.items.append(item)
        turn.calls.append(_neutral_call(kind, call_id, name, body))
        return True

    def _result(self, item: Item, kind: str) -> bool:
        call_id = item.get("call_id")
        content = _neutral_content(item.get("output"))
        if not isinstance(call_id, str) or self.calls.get(call_id) != ANSWERED_TYPES[kind] \
                or call_id in self.answered or content is None:
            return False
        self.answered.add(call_id)
        message: Message = {"role": "tool", "tool_call_id": call_id, "content": content}
        if kind == "custom_tool_call_output":
            message[RESULT_TYPE_KEY] = kind
        self._add(item, message)
        return True

    def _turn_for(self, kind: str) -> _Turn:
        if self.turn is None or not self.turn.takes(kind):
            self._close()
            self.turn = _Turn()
        return self.turn

    def _add(self, item: Any, message: Message) -> None:
        self._close()
        self.groups.append(Group((item,), (message,)))
        self.messages.append(message)

    def _close(self) -> None:
        if self.turn is not None:
            message = self.turn.message()
            self.groups.append(Group(tuple(self.turn.items), (message,)))
            self.messages.append(message)
            self.turn = None


def _kind(item: Any) -> str | None:
    """An item's type; a dict with a role and no type is a message (the API's short form)."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else None


def _opaque_part(item: Item) -> Message:
    """A reasoning part carrying an item the model alone can read: counted as nothing, never summarised, and with
    no `text` of its own (the token counter would count one)."""
    return {"type": "reasoning", "item": item}


def _neutral_call(kind: str, call_id: str, name: str, body: str) -> Message:
    if kind == "custom_tool_call":
        return {"id": call_id, "type": "custom", "custom": {"name": name, "input": body}}
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": body}}


def _neutral_content(content: Any) -> str | list[Message] | None:
    """A message's content or a result's output as neutral content; None when a part is not understood."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts: list[Message] = []
    for part in content:
        made = _neutral_part(part)
        if made is None:
            return None
        parts.append(made)
    return parts


def _neutral_part(part: Any) -> Message | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind in ("input_text", "output_text", "refusal"):
        text = part.get("refusal" if kind == "refusal" else "text")
        return {"type": "text", "text": text} if isinstance(text, str) else None
    if kind == "input_image":
        url, file_id = part.get("image_url"), part.get("file_id")
        locator = url if isinstance(url, str) else FILE_ID_PREFIX + file_id if isinstance(file_id, str) else None
        if locator is None:
            return None
        image = {"url": locator}
        detail = part.get("detail")
        if isinstance(detail, str):
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        return {"type": "file", "file": {key: part[key] for key in FILE_KEYS if isinstance(part.get(key), str)}}
    return None


def _rendered(message: Any) -> list[Item]:
    speaker = role(message)
    if speaker == "tool":
        return _rendered_result(message)
    if speaker == "assistant":
        return _rendered_turn(message)
    if speaker in ("user", "system", "developer"):
        parts = _input_parts(message.get("content"))
        return [{"type": "message", "role": speaker, "content": parts}] if parts else []
    return []  # the legacy `function` role and unknown roles have no Responses item


def _rendered_turn(message: Message) -> list[Item]:
    """An assistant message as its text (reasoning dropped), then one item per call it makes."""
    items: list[Item] = []
    texts = [{"type": "output_text", "text": text, "annotations": []} for text in _texts(message.get("content"))]
    if texts:
        items.append({"type": "message", "role": "assistant", "content": texts})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        item = _rendered_call(call)
        if item is not None:
            items.append(item)
    return items


def _rendered_call(call: Any) -> Item | None:
    call_id = call.get("id") if isinstance(call, dict) else None
    if not isinstance(call_id, str):
        return None
    kind, spec = ("custom_tool_call", call.get("custom")) if call.get("type") == "custom" \
        else ("function_call", call.get("function"))
    name = spec.get("name") if isinstance(spec, dict) else None
    body = spec.get(CALL_BODIES[kind]) if isinstance(spec, dict) else None
    if not (isinstance(name, str) and isinstance(body, str)):
        return None
    return {"type": kind, "call_id": call_id, "name": name, CALL_BODIES[kind]: body}


def _rendered_result(message: Message) -> list[Item]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        return []
    kind = "custom_tool_call_output" if message.get(RESULT_TYPE_KEY) == "custom_tool_call_output" \
        else "function_call_output"
    content = message.get("content")
    output: str | list[Item] = content if isinstance(content, str) else _input_parts(content) or ""
    return [{"type": kind, "call_id": call_id, "output": output}]


def _texts(content: Any) -> list[str]:
    """The text of an assistant's content, part by part: what an `output_text` part can say."""
    if isinstance(content, str):
        return [content]
    parts = content if isinstance(content, list) else []
    return [part["text"] for part in parts if isinstance(part, dict) and part.get("type") == "text"
            and isinstance(part.get("text"), str)]


def _input_parts(content: Any) -> list[Item]:
    """Neutral content as `input_*` parts: text, images and documents; reasoning and unknown parts dropped."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts: list[Item] = []
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "input_text", "text": part["text"]})
        elif kind == "image_url":
            image = _rendered_image(part.get("image_url"))
            parts.extend([image] if image is not None else [])
        elif kind == "file":
            parts.append(_rendered_file(part.get("file")))
    return parts


def _rendered_image(image: Any) -> Item | None:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        return None
    detail = image.get("detail") if isinstance(image, dict) else None
    part: Item = {"type": "input_image", "detail": detail if isinstance(detail, str) else "auto"}
    if url.startswith(FILE_ID_PREFIX):
        part["file_id"] = url[len(FILE_ID_PREFIX):]
    else:
        part["image_url"] = url
    return part


def _rendered_file(file: Any) -> Item:
    details = file if isinstance(file, dict) else {}
    part: Item = {"type": "input_file", **{key: details[key] for key in FILE_KEYS if isinstance(details.get(key), str)}}
    if any(key in part for key in FILE_LOCATORS):
        return part
    # Nothing left to fetch the document by: say which one it was instead.
    return {"type": "input_text", "text": f"[document: {part.get('filename') or 'unnamed'}]"}
