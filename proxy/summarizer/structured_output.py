"""Structured summariser output: which `response_format` to send, learned per upstream and model by trying."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal
from weakref import WeakKeyDictionary

from proxy.summarizer.summary_schema import SCHEMA_NAME, summary_schema

log = logging.getLogger("proxy.structured_output")

Mode = Literal["auto", "json_schema", "json_object", "off"]
Format = Literal["json_schema", "json_object"]
Key = tuple[str, str]  # (upstream base URL, model)

FORMATS: tuple[Format, ...] = ("json_schema", "json_object")  # the standard first, then llama.cpp's extension
# Constrained output kept fewer facts than plain output in the benchmark (18 against 24 of 32 with
# Qwen2.5-Coder-1.5B), so `auto` constrains only a model whose plain replies keep failing to parse.
UNPARSED_BEFORE_CONSTRAINING = 2
MAX_REMEMBERED = 1024  # (upstream, model) pairs; model names come from clients, so the memory is bounded
_REFUSAL_STATUSES = frozenset({400, 422, 500})
_REFUSAL_WORDS = ("response_format", "json_schema", "json_object", "grammar")
_REFUSAL_SCAN_BYTES = 64 * 1024


def response_format(kind: Format, limit: int | None = None) -> dict[str, Any]:
    """The request field for `kind`: OpenAI's `json_schema`, or llama.cpp's `json_object` with a `schema`.

    With `limit` (the reply's output cap) the schema bounds its lists and strings so that a reply filling all of
    them still ends within the cap: the grammar then ends a weak model's loop instead of the output limit.
    """
    schema = summary_schema(limit)
    if kind == "json_schema":
        # strict=False: strict mode would also demand that every property be required.
        return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": False}}
    return {"type": "json_object", "schema": schema}


def refuses(status: int, body: bytes, *, accepted_before: bool) -> bool:
    """Whether the answer to a constrained request says the server does not take that format.

    Any 5xx to a format never accepted before counts (llama-cpp-python's server answers 500 to `json_schema`);
    otherwise only a 400, 422 or 500 whose body names the feature.
    """
    if not accepted_before and 500 <= status < 600:
        return True
    if status not in _REFUSAL_STATUSES:
        return False
    text = body[:_REFUSAL_SCAN_BYTES].decode("utf-8", errors="replace").lower()
    return any(word in text for word in _REFUSAL_WORDS)


@dataclass
class _Seen:
    unparsed: int = 0  # plain replies in a row that did not parse
    constrained: bool = False  # `auto` moved this model to constrained output
    refused: set[Format] = field(default_factory=set)
    accepted: set[Format] = field(default_factory=set)


class FormatMemory:
    """What each (upstream, model) was seen to do: formats it refused or took, and how its plain replies parse."""

    def __init__(self, *, unparsed_before_constraining: int = UNPARSED_BEFORE_CONSTRAINING,
                 max_remembered: int = MAX_REMEMBERED) -> None:
        self._limit = unparsed_before_constraining
        self._max = max_remembered
        self._seen: OrderedDict[Key, _Seen] = OrderedDict()

    def formats(self, mode: Mode, key: Key) -> tuple[Format, ...]:
        """The formats to try for one request, in order; empty means a plain request."""
        if mode == "off":
            return ()
        seen = self._seen.get(key) or _Seen()
        wanted = (FORMATS if seen.constrained else ()) if mode == "auto" else (mode,)
        return tuple(kind for kind in wanted if kind not in seen.refused)

    def accepted_before(self, key: Key, kind: Format) -> bool:
        seen = self._seen.get(key)
        return seen is not None and kind in seen.accepted

    def accept(self, key: Key, kind: Format) -> None:
        self._entry(key).accepted.add(kind)

    def refuse(self, key: Key, kind: Format) -> None:
        self._entry(key).refused.add(kind)

    def forgive(self, key: Key, kind: Format) -> None:
        """Take back a refusal: the server failed the same way without the format, so the format was not why."""
        self._entry(key).refused.discard(kind)

    def is_constrained(self, key: Key) -> bool:
        seen = self._seen.get(key)
        return seen is not None and seen.constrained

    def note_plain_reply(self, key: Key, parsed: bool) -> bool:
        """Count a plain reply; True when this one switches the model to constrained output."""
        seen = self._entry(key)
        seen.unparsed = 0 if parsed else seen.unparsed + 1
        if seen.constrained or seen.unparsed < self._limit:
            return False
        seen.constrained = True
        return True

    def _entry(self, key: Key) -> _Seen:
        seen = self._seen.pop(key, None) or _Seen()
        self._seen[key] = seen  # most recently used last
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return seen


_SHARED: WeakKeyDictionary[object, FormatMemory] = WeakKeyDictionary()


def memory_for(owner: object) -> FormatMemory:
    """The memory that lives as long as `owner` (the summariser's Upstream), shared by every client of it."""
    memory = _SHARED.get(owner)
    if memory is None:
        memory = _SHARED[owner] = FormatMemory()
    return memory
