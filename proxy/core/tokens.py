"""Token counting: cached per-message chat counts, with the chat framing OpenAI documents."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.encodings import DEFAULT_ENCODING, SLICE_CHARS, load_encoding, text_slices
from proxy.core.fingerprint import dumps_iteratively

# Chat framing, as OpenAI documents it: every message is wrapped in a few tokens, a name costs one
# more, and the reply is primed with three.
MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
REPLY_PRIMER = 3
# Attachments are never tokenised as text (their payload is base64); these are flat estimates.
IMAGE_HIGH_DETAIL_TOKENS = 765  # a 1024x1024 image at high detail: 85 base + 4 tiles x 170
IMAGE_LOW_DETAIL_TOKENS = 85
AUDIO_PART_TOKENS = 400  # roughly 40 s of speech at ~10 tokens/s
FILE_PART_TOKENS = 1000  # a few pages of extracted text
# Texts longer than one slice of the encoding (a tool's output, a file) whose counts are kept by the text itself: one
# counted a slice at a time (counting_in_slices) is not counted again, nor when it comes back in another message.
LONG_TEXTS = 4096


# Structure markers of a flattened value: a dict's and a list's opening, and anything that is not JSON.
_DICT_MARK = object()
_LIST_MARK = object()
_OTHER_MARK = object()
_PLAIN_TYPES = frozenset({int, float, bool, type(None)})


def _flat(value: Any) -> tuple[Any, ...]:
    """A hashable, flat twin of a JSON value: markers with lengths, then keys and leaves in order.

    Flat, so neither building nor hashing it recurses, however deep the value; strings (the bulk of the bytes)
    are kept as they are, not copied. Scalars other than strings carry their type, so 1, 1.0 and true differ.
    """
    out: list[Any] = []
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is str:
            out.append(item)
        elif kind is dict:
            out += (_DICT_MARK, len(item), *item.keys())
            pending += reversed(item.values())
        elif kind is list:
            out += (_LIST_MARK, len(item))
            pending += reversed(item)
        elif kind in _PLAIN_TYPES:
            out += (kind, item)
        else:
            out += (_OTHER_MARK, repr(item))
    return tuple(out)


def message_key(message: Any) -> int:
    """A cheap, in-process cache key for a message: Python's hash of its flattened structure.

    Strings hash with SipHash under a per-process random key, so distinct messages collide with
    probability ~2**-64 per pair and a client cannot aim for a collision; the worst outcome of one is
    a wrong estimate, which the upstream's real usage corrects. It is stable for identical input within
    the process, which is all an in-memory cache needs, and it reads each string once with no
    serialisation: canonical JSON plus a digest costs about ten times more on a 400-message history.
    """
    if type(message) is dict and "tool_calls" not in message:
        try:  # most messages hold only strings at the top level: one C-level tuple, no recursion
            return hash(tuple(message.items()))
        except TypeError:  # content parts (lists) need flattening
            pass
    return hash(_flat(message))


@dataclass(frozen=True, slots=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int


class TokenCounter:
    """Chat token counts with per-message caching, so a long history is tokenised once, not per request."""

    def __init__(self, encoding_name: str = DEFAULT_ENCODING, cache_size: int = 100_000) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self.requested_encoding = encoding_name
        self.encoding = load_encoding(encoding_name)
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._cache_size = cache_size
        self._long: OrderedDict[int, int] = OrderedDict()  # hash of a text longer than SLICE_CHARS -> its count
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    @property
    def encoding_name(self) -> str:
        return self.encoding.name

    def cache_info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, len(self._cache), self._cache_size)

    def count_text(self, text: object) -> int:
        """Tokens of a text; anything that is not a string counts as nothing."""
        if not isinstance(text, str):
            return 0
        if len(text) <= SLICE_CHARS:
            return self.encoding.count(text)
        key = hash(text)  # a string's hash is computed once and kept with it
        with self._lock:
            known = self._long.get(key)
            if known is not None:
                self._long.move_to_end(key)
                return known
        count = self.encoding.count(text)
        self._keep_long(key, count)
        return count

    def counting_in_slices(self, messages: Iterable[Any]) -> Iterator[None]:
        """Counts the texts of `messages` longer than a slice, one slice per step, keeping each text's count for
        count_text: whoever drives it may let other work run between the steps (a turn's large tool result holds
        the event loop a slice at a time, under a millisecond, instead of whole). The counts are count_text's own:
        an encoding counts a long text as the sum of its slices (encodings.text_slices)."""
        for message in messages:
            for text in _long_texts(message):
                key = hash(text)
                with self._lock:
                    if key in self._long:
                        continue
                total = 0
                for piece in text_slices(text):
                    total += self.encoding.count(piece)
                    yield
                self._keep_long(key, total)

    def _keep_long(self, key: int, count: int) -> None:
        with self._lock:
            self._long[key] = count
            self._long.move_to_end(key)
            while len(self._long) > LONG_TEXTS:
                self._long.popitem(last=False)

    def count_value(self, value: Any) -> int:
        """Tokens of a text, or of any other JSON value as its JSON (a tool's input, a block cleared)."""
        return self.count_text(_value_text(value))

    def count_message(self, message: Any) -> int:
        return self._cached_counts([message])[0]

    def count_each(self, messages: Sequence[Any]) -> list[int]:
        """count_message of each message, in one pass over the cache."""
        return self._cached_counts(messages)

    def count_messages(self, messages: Sequence[Any], tools: Any = None) -> int:
        return sum(self._cached_counts(messages)) + REPLY_PRIMER + self.count_tools(tools)

    def count_request(self, body: dict[str, Any]) -> int:
        """The prompt tokens of a chat-completion body: messages, tools and legacy functions."""
        messages = body.get("messages")
        total = self.count_messages(messages if isinstance(messages, list) else [], body.get("tools"))
        return total + self.count_tools(body.get("functions"))

    def count_aside(self, instructions: Any, tools: Any) -> int:
        """What a request costs besides its messages, in the APIs that keep instructions apart from them (Responses'
        `instructions`, Messages' `system`): the instructions (text, or blocks counted as their JSON), the tool
        definitions and the reply primer. The instructions are cached like messages: an agent resends the same
        ones on every turn, and counting Codex's or Claude Code's system prompt anew cost such a request 0.2 ms."""
        kept = self._kept("aside", _value_text(instructions)) if instructions else 0
        return kept + self.count_tools(tools) + REPLY_PRIMER

    def count_tools(self, tools: Any) -> int:
        """Tool definitions counted as their compact JSON schema, cached like messages."""
        if not tools:
            return 0
        return self._kept("tools", _json_text(tools, separators=(",", ":"), ensure_ascii=False))

    def _kept(self, kind: str, text: str) -> int:
        """count_text of a text sent beside the messages, through the messages' cache."""
        key = hash((kind, text))
        cached = self._lookup([key])[0]
        if cached is not None:
            return cached
        count = self.count_text(text)
        self._store([(key, count)])
        return count

    def _cached_counts(self, messages: Iterable[Any]) -> list[int]:
        messages = list(messages)
        keys = [message_key(message) for message in messages]
        counts = self._lookup(keys)
        if None not in counts:
            return counts  # type: ignore[return-value]  # all hits: the warm path
        fresh: list[tuple[int, int]] = []
        for index, count in enumerate(counts):
            if count is None:
                count = counts[index] = self._message_tokens(messages[index])
                fresh.append((keys[index], count))
        if fresh:
            self._store(fresh)
        return counts  # type: ignore[return-value]  # every None was filled above

    def _lookup(self, keys: list[int]) -> list[int | None]:
        found: list[int | None] = []
        cache = self._cache
        with self._lock:
            for key in keys:
                count = cache.get(key)
                if count is not None:
                    cache.move_to_end(key)
                found.append(count)
            misses = found.count(None)
            self._misses += misses
            self._hits += len(keys) - misses
        return found

    def _store(self, entries: list[tuple[int, int]]) -> None:
        if self._cache_size == 0:
            return
        cache = self._cache
        with self._lock:
            for key, count in entries:
                cache[key] = count
                cache.move_to_end(key)
            while len(cache) > self._cache_size:
                cache.popitem(last=False)

    def _message_tokens(self, message: Any) -> int:
        if not isinstance(message, dict):
            return MESSAGE_OVERHEAD + self._content_tokens(message)
        total = MESSAGE_OVERHEAD
        for field, value in message.items():
            if field == "content":
                total += self._content_tokens(value)
            elif field == "tool_calls" and isinstance(value, list):
                total += sum(self._tool_call_tokens(call) for call in value)
            elif field == "function_call" and isinstance(value, dict):
                total += self._text_fields(value, "name", "arguments")
            elif field == "name" and isinstance(value, str) and value:
                total += self.count_text(value) + NAME_OVERHEAD
            elif field in ("role", "tool_call_id", "refusal"):
                total += self.count_text(value)
            # Reasoning fields and unknown keys are not part of the prompt the upstream sees.
        return total

    def _content_tokens(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        parts = content if isinstance(content, list) else [content]
        return sum(self._part_tokens(part) for part in parts)

    def _part_tokens(self, part: Any) -> int:
        if part is None:
            return 0
        if isinstance(part, str):
            return self.count_text(part)
        if not isinstance(part, dict):
            return self.count_text(_json_text(part))
        kind = part.get("type")
        text = part.get("text")
        if isinstance(text, str):
            return self.count_text(text)
        if kind == "image_url":
            return _image_tokens(part.get("image_url"))
        if kind == "input_audio":
            return AUDIO_PART_TOKENS
        if kind == "file":
            file = part.get("file")
            return FILE_PART_TOKENS + self.count_text(file.get("filename") if isinstance(file, dict) else None)
        return self.count_text(part.get("refusal")) if kind == "refusal" else 0

    def _tool_call_tokens(self, call: Any) -> int:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            return self._text_fields(function, "name", "arguments")
        custom = call.get("custom") if isinstance(call, dict) else None
        return self._text_fields(custom, "name", "input") if isinstance(custom, dict) else 0

    def _text_fields(self, source: dict[str, Any], *fields: str) -> int:
        total = 0
        for field in fields:
            value = source.get(field)
            if isinstance(value, str):
                total += self.count_text(value)
            elif value is not None:
                total += self.count_text(_json_text(value, separators=(",", ":")))
        return total


def _long_texts(message: Any) -> list[str]:
    """The strings of a message (at any depth) longer than a slice of the encoding."""
    return [item for item in _flat(message) if type(item) is str and len(item) > SLICE_CHARS]


def _value_text(value: Any) -> str:
    """A text as it is; any other JSON value as its JSON (what count_value counts)."""
    return value if isinstance(value, str) else _json_text(value, ensure_ascii=False)


def _json_text(value: Any, *, separators: tuple[str, str] = (", ", ": "), ensure_ascii: bool = True) -> str:
    """JSON text to count for a structured value: unknown objects as their str, at any depth."""
    try:
        return json.dumps(value, separators=separators, ensure_ascii=ensure_ascii, default=str)
    except RecursionError:
        return dumps_iteratively(value, separators=separators, ensure_ascii=ensure_ascii, default=str)


def _image_tokens(image: Any) -> int:
    detail = image.get("detail") if isinstance(image, dict) else None
    return IMAGE_LOW_DETAIL_TOKENS if detail == "low" else IMAGE_HIGH_DETAIL_TOKENS
