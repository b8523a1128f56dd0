"""proxy.tokens: chat overheads, tools and attachments, the per-message cache, and hostile values."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import pytest
import tiktoken
import tiktoken.load
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.encodings import ESTIMATE_ENCODING, SLICE_CHARS, TextEncoding, estimate_tokens
from proxy.core.fingerprint import dumps_iteratively
from proxy.core.tokens import (
    IMAGE_HIGH_DETAIL_TOKENS,
    IMAGE_LOW_DETAIL_TOKENS,
    MESSAGE_OVERHEAD,
    REPLY_PRIMER,
    TokenCounter,
    message_key,
)

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


pytestmark = pytest.mark.usefixtures("offline")


@pytest.fixture()
def counter() -> TokenCounter:
    return TokenCounter()


def n(encoding: tiktoken.Encoding, text: str) -> int:
    return len(encoding.encode_ordinary(text))


def counting_encoder(counter: TokenCounter) -> list[str]:
    """Route the counter's encoder through a recorder; returns the list of texts it was asked to encode."""
    seen: list[str] = []
    inner = counter.encoding.count

    def record(text: str) -> int:
        seen.append(text)
        return inner(text)

    counter.encoding = TextEncoding(counter.encoding.name, counter.encoding.source, record)
    return seen


# --- counting -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("hello world", 2), ("Hello, world!", 4), ("tiktoken is great!", 6)],
)
def test_known_counts(counter: TokenCounter, text: str, expected: int) -> None:
    assert counter.count_text(text) == expected


@pytest.mark.parametrize(
    "text",
    ["<|endoftext|> is just text here", "多语言文本 mixed with English", "def f(x):\n    return x  # ok\n", " " * 50],
)
def test_counts_match_encoder(counter: TokenCounter, bundled: tiktoken.Encoding, text: str) -> None:
    assert counter.count_text(text) == n(bundled, text)


def test_message_overhead_and_name(counter: TokenCounter, bundled: tiktoken.Encoding) -> None:
    plain = {"role": "user", "content": "hello world"}
    named = {"role": "user", "name": "bob", "content": "hello world"}
    assert counter.count_message(plain) == 3 + n(bundled, "user") + n(bundled, "hello world")
    assert counter.count_message(named) == counter.count_message(plain) + n(bundled, "bob") + 1


def test_messages_prime_the_reply(counter: TokenCounter) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert counter.count_messages(messages) == sum(map(counter.count_message, messages)) + 3
    assert counter.count_messages([]) == 3


PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
READ_FILE = {"name": "read_file", "description": "Read a file", "parameters": PATH_SCHEMA}
TOOLS = [{"type": "function", "function": READ_FILE}]


def test_tools_counted_from_schema(counter: TokenCounter, bundled: tiktoken.Encoding) -> None:
    messages = [{"role": "user", "content": "hi"}]
    schema_tokens = n(bundled, json.dumps(TOOLS, separators=(",", ":")))
    assert counter.count_messages(messages, TOOLS) == counter.count_messages(messages) + schema_tokens
    body = {"model": "m", "messages": messages, "tools": TOOLS, "functions": [TOOLS[0]["function"]]}
    functions_tokens = n(bundled, json.dumps(body["functions"], separators=(",", ":")))
    assert counter.count_request(body) == counter.count_messages(messages) + schema_tokens + functions_tokens


@pytest.mark.parametrize(
    ("body", "expected"),
    [({}, 3), ({"messages": "nope"}, 3), ({"messages": [{"role": "user", "content": ""}]}, 3 + 3 + 1)],
)
def test_count_request_bad_bodies(counter: TokenCounter, body: dict[str, Any], expected: int) -> None:
    assert counter.count_request(body) == expected


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({"url": "data:image/png;base64,AAAA", "detail": "low"}, IMAGE_LOW_DETAIL_TOKENS),
        ({"url": "data:image/png;base64,AAAA", "detail": "high"}, IMAGE_HIGH_DETAIL_TOKENS),
        ({"url": "https://x.test/a.png", "detail": "auto"}, IMAGE_HIGH_DETAIL_TOKENS),
        ({"url": "https://x.test/a.png"}, IMAGE_HIGH_DETAIL_TOKENS),
        ("https://x.test/a.png", IMAGE_HIGH_DETAIL_TOKENS),
    ],
)
def test_images_are_flat_estimates(counter: TokenCounter, image: Any, expected: int) -> None:
    message = {"role": "user", "content": [{"type": "image_url", "image_url": image}]}
    assert counter.count_message(message) == 3 + 1 + expected


def test_tool_calls_and_results(counter: TokenCounter, bundled: tiktoken.Encoding) -> None:
    arguments = '{"path": "src/app.py"}'
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file",
                                                                             "arguments": arguments}}]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"}
    assert counter.count_message(call) == 3 + n(bundled, "assistant") + n(bundled, "read_file") + n(bundled, arguments)
    assert counter.count_message(result) == 3 + n(bundled, "tool") + n(bundled, "call_1") + n(bundled, "print(1)")


@pytest.mark.parametrize(
    "extra",
    [{"reasoning_content": "long hidden thoughts " * 20}, {"reasoning": "x " * 50}, {"thinking": "y " * 50}],
)
def test_reasoning_fields_not_counted(counter: TokenCounter, extra: dict[str, str]) -> None:
    plain = {"role": "assistant", "content": "answer"}
    assert counter.count_message({**plain, **extra}) == counter.count_message(plain)


@pytest.mark.parametrize(
    "message",
    [None, "bare string", 42, [], {}, {"role": 7, "content": 3.5}, {"role": "user", "content": [None, 1, "s", {}]},
     {"role": "assistant", "tool_calls": ["x", {"function": "no"}], "function_call": "bad"},
     {"role": "user", "content": {"type": "text", "text": "lone part"}}],
)
def test_bad_messages_are_counted_not_raised(counter: TokenCounter, message: Any) -> None:
    count = counter.count_message(message)
    assert isinstance(count, int) and count >= 3
    assert counter.count_message(copy.deepcopy(message)) == count


# --- the per-message cache ------------------------------------------------------------------------


def history(size: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"message number {i} " * 5} for i in range(size)]


def test_warm_count_hits_cache_and_does_not_encode(counter: TokenCounter) -> None:
    encoded = counting_encoder(counter)
    first = counter.count_messages(history(20))
    calls_after_cold = len(encoded)
    assert calls_after_cold > 0
    again = counter.count_messages(copy.deepcopy(history(20)))
    assert again == first
    assert len(encoded) == calls_after_cold
    info = counter.cache_info()
    assert (info.hits, info.misses, info.size) == (20, 20, 20)


def test_appending_one_message_encodes_only_it(counter: TokenCounter) -> None:
    counter.count_messages(history(30))
    encoded = counting_encoder(counter)
    counter.count_messages([*history(30), {"role": "user", "content": "brand new"}])
    assert encoded == ["user", "brand new"]


def test_lru_bound_and_recency() -> None:
    counter = TokenCounter(cache_size=3)
    messages = history(5)
    for message in messages[:3]:
        counter.count_message(message)
    counter.count_message(messages[0])  # now most recent: survives the next two inserts
    counter.count_message(messages[3])
    counter.count_message(messages[4])
    assert counter.cache_info().size == 3
    encoded = counting_encoder(counter)
    counter.count_message(messages[0])
    assert encoded == []
    counter.count_message(messages[1])
    assert encoded != []


def test_zero_cache_size_never_caches() -> None:
    counter = TokenCounter(cache_size=0)
    encoded = counting_encoder(counter)
    counter.count_messages(history(3))
    counter.count_messages(history(3))
    assert counter.cache_info().size == 0
    assert len(encoded) == 12


def test_negative_cache_size_rejected() -> None:
    with pytest.raises(ValueError):
        TokenCounter(cache_size=-1)


def test_tools_count_cached(counter: TokenCounter) -> None:
    encoded = counting_encoder(counter)
    assert counter.count_tools(TOOLS) == counter.count_tools(copy.deepcopy(TOOLS))
    assert len(encoded) == 1


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"role": "user", "content": "a"}, {"role": "user", "content": "b"}),
        ({"role": "user", "content": "a"}, {"role": "assistant", "content": "a"}),
        ({"role": "user", "content": "a"}, {"role": "user", "name": "a"}),
        ({"role": "user", "content": ["a"]}, {"role": "user", "content": "a"}),
        ({"role": "user", "content": {"a": "b"}}, {"role": "user", "content": [["a", "b"]]}),
        ({"role": "user", "content": None}, {"role": "user", "content": ""}),
    ],
)
def test_message_key_distinguishes(left: Any, right: Any) -> None:
    assert message_key(left) != message_key(right)
    assert message_key(left) == message_key(copy.deepcopy(left))


def test_concurrent_counting_agrees(counter: TokenCounter) -> None:
    expected = TokenCounter(cache_size=0).count_messages(history(50))
    results: list[int] = []

    def work() -> None:
        for _ in range(20):
            results.append(counter.count_messages(copy.deepcopy(history(50))))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 80


# --- hostile values: counting and keying are total --------------------------------------------------


def deep(depth: int, leaf: Any = "x") -> Any:
    """`depth` nested lists and dicts around `leaf`, built without recursion."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [900, 5000, 50_000])
@pytest.mark.parametrize("place", ["content", "content part", "tool arguments", "unknown key"])
def test_deep_nesting_is_counted_not_raised(counter: TokenCounter, depth: int, place: str) -> None:
    value = deep(depth)
    message = {
        "content": {"role": "user", "content": value},
        "content part": {"role": "user", "content": [{"type": "text", "text": "hi"}, value]},
        "tool arguments": {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": value}}]},
        "unknown key": {"role": "user", "content": "hi", "x-vendor": value},
    }[place]
    count = counter.count_message(message)
    assert isinstance(count, int) and count >= 3
    assert counter.count_messages([message], tools=[{"type": "function", "function": {"parameters": value}}]) > 0
    assert message_key(message) == message_key(copy.deepcopy(message) if depth < 900 else message)


def test_deep_parts_count_their_json_text(counter: TokenCounter) -> None:
    # Past the recursion limit a part is counted as the very JSON text json.dumps would give for it.
    value = deep(3000)
    text = dumps_iteratively(value, separators=(", ", ": "))
    assert text.startswith('[{"k": [{"k": ') and text.count("[") == 1500
    assert counter.count_message({"role": "user", "content": [value]}) == 3 + counter.count_text("user") \
        + counter.count_text(text)


@pytest.mark.parametrize("text", ["\ud800", "a\udc00b", "\udfff" * 3, "ok \ud83d"])
def test_lone_surrogates_are_counted_not_raised(counter: TokenCounter, text: str) -> None:
    message = {"role": "user", "content": [{"type": "text", "text": text}, [text]], "name": text}
    assert counter.count_message(message) >= 3
    assert counter.count_text(text) >= 1
    assert counter.count_tools([{"function": {"name": text, "parameters": {text: [text]}}}]) >= 1
    assert message_key(message) == message_key(copy.deepcopy(message))


@pytest.mark.parametrize(("left", "right"), [
    ({"role": "user", "content": [1]}, {"role": "user", "content": [True]}),
    ({"role": "user", "content": [1]}, {"role": "user", "content": [1.0]}),
    ({"role": "user", "content": [[]]}, {"role": "user", "content": [{}]}),
    ({"role": "user", "content": [["a"], "b"]}, {"role": "user", "content": [["a", "b"]]}),
    ({"role": "user", "content": [{"a": "b", "c": "d"}]}, {"role": "user", "content": [{"a": "d", "c": "b"}]}),
    (deep(5000), deep(5001)),
])
def test_flattened_keys_keep_structure_apart(left: Any, right: Any) -> None:
    assert message_key(left) != message_key(right)


@pytest.mark.parametrize(("instructions", "tools"), [
    ("Be brief.", None), ([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}], None),
    (None, [{"name": "ls", "input_schema": {"type": "object"}}]), ("", []), ([], None),
])
def test_what_a_request_costs_beside_its_messages(instructions: Any, tools: Any, counter: TokenCounter) -> None:
    text = instructions if isinstance(instructions, str) else json.dumps(instructions) if instructions else ""
    assert counter.count_aside(instructions, tools) == counter.count_text(text) + counter.count_tools(tools) + \
        REPLY_PRIMER


@pytest.mark.parametrize("instructions", ["You are a coding agent. " * 200,
                                          [{"type": "text", "text": "Be brief. " * 100}]])
def test_instructions_resent_each_turn_are_counted_once(instructions: Any) -> None:
    counter = TokenCounter()
    first = counter.count_aside(instructions, None)
    misses = counter.cache_info().misses
    again = counter.count_aside(instructions if isinstance(instructions, str) else json.loads(json.dumps(instructions)),
                                None)
    assert again == first and counter.cache_info().misses == misses  # the same count, from the cache
    assert counter.count_aside(str(instructions) + " More.", None) != first  # other instructions, counted anew
    assert counter.cache_info().misses == misses + 1


# --- long texts, counted a slice at a time ---------------------------------------------------------


def code_text(chars: int, seed: int = 0) -> str:
    words = ["def", "return", "self.value", "(x, y)", "# note", "\n    ", "ValueError", "0x1f", "é", "中文"]
    out, index, length = [], seed, 0
    while length < chars:
        out.append(words[index % len(words)] + " ")
        length += len(out[-1])
        index = (index * 31 + 7) % 1_000_003
    return "".join(out)[:chars]


@pytest.mark.parametrize("chars", [SLICE_CHARS, SLICE_CHARS + 1, 3 * SLICE_CHARS + 5])
def test_a_long_text_is_counted_in_slices_one_step_each(counter: TokenCounter, chars: int) -> None:
    text = code_text(chars)
    message = {"role": "tool", "tool_call_id": "c1", "content": text}
    steps = list(counter.counting_in_slices([message]))
    slices = -(-chars // SLICE_CHARS)
    assert len(steps) == (slices if chars > SLICE_CHARS else 0)  # one slice or less: nothing to step through
    seen = counting_encoder(counter)
    assert counter.count_text(text) == TokenCounter().count_text(text)
    assert seen == ([] if chars > SLICE_CHARS else [text])  # a long one's count was kept: not encoded again


def test_long_texts_are_found_at_any_depth_and_counted_once(counter: TokenCounter) -> None:
    texts = [code_text(SLICE_CHARS + 100, seed) for seed in range(3)]
    message = {"role": "user", "content": [{"type": "text", "text": texts[0]}, {"type": "text", "text": "short"}],
               "extra": {"deep": [[texts[1]]]}}
    assert len(list(counter.counting_in_slices([message, {"role": "tool", "content": texts[2]}]))) == 6
    assert list(counter.counting_in_slices([message])) == []  # known now: no step
    seen = counting_encoder(counter)
    for text in texts:
        assert counter.count_text(text) == TokenCounter().count_text(text)
    assert seen == []


def test_a_long_text_counted_whole_is_known_to_the_slices(counter: TokenCounter) -> None:
    text = code_text(2 * SLICE_CHARS + 1)
    counted = counter.count_text(text)
    assert list(counter.counting_in_slices([{"role": "user", "content": text}])) == []
    assert counter.count_message({"role": "user", "content": text}) == counted + MESSAGE_OVERHEAD + 1


def test_long_texts_kept_are_bounded_least_recently_used_first(counter: TokenCounter,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.core.tokens.LONG_TEXTS", 2)
    first, second, third = (code_text(SLICE_CHARS + 1, seed) for seed in range(3))
    for text in (first, second, first, third):  # first used again: second is the least recently used
        counter.count_text(text)
    seen = counting_encoder(counter)
    counter.count_text(first), counter.count_text(third)
    assert seen == []
    counter.count_text(second)
    assert seen == [second]  # dropped: counted again


@pytest.mark.parametrize("encoding", ["bundled", "estimate"])
@settings(max_examples=60, deadline=None)
@given(chars=st.integers(min_value=SLICE_CHARS - 2, max_value=3 * SLICE_CHARS + 3), seed=st.integers(0, 10 ** 6))
def test_counting_in_slices_counts_what_counting_whole_counts(encoding: str, chars: int, seed: int) -> None:
    counter = TokenCounter()
    if encoding == "estimate":
        counter.encoding = TextEncoding(ESTIMATE_ENCODING, "estimate", estimate_tokens)
    text = code_text(chars, seed)
    whole = counter.encoding.count(text)
    list(counter.counting_in_slices([{"role": "tool", "content": text}]))
    assert counter.count_text(text) == whole


def test_slices_and_whole_counts_from_threads_agree(counter: TokenCounter) -> None:
    texts = [code_text(SLICE_CHARS + 500, seed) for seed in range(8)]
    expected = [TokenCounter().count_text(text) for text in texts]
    results: list[list[int]] = []

    def count_all() -> None:
        results.append([counter.count_text(text) for text in texts])

    threads = [threading.Thread(target=count_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    list(counter.counting_in_slices([{"role": "tool", "content": text} for text in texts]))
    for thread in threads:
        thread.join()
    assert results == [expected] * 4 and [counter.count_text(text) for text in texts] == expected
