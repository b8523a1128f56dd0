"""proxy.core.fingerprint: canonical JSON, the recursion-free encoder, message digests and prefix hash chains."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from proxy.core.fingerprint import (
    canonical_json,
    chain_link,
    chain_root,
    digest_of,
    dumps_iteratively,
    hash_chain,
    message_digest,
)


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param({"b": 1, "a": [None, True, 2.5]}, b'{"a":[null,true,2.5],"b":1}', id="sorted, compact"),
    pytest.param({"z": {"y": 1, "x": 2}}, b'{"z":{"x":2,"y":1}}', id="nested keys sorted"),
    pytest.param({"é": "ü"}, '{"é":"ü"}'.encode(), id="utf-8, not escaped"),
    pytest.param(None, b"null", id="null"),
    pytest.param(2 ** 70, b"1180591620717411303424", id="beyond 64 bits"),
    pytest.param({"n": 2 ** 64, "a": 1}, b'{"a":1,"n":18446744073709551616}', id="big int still sorted"),
    pytest.param("\ud800", b'"\xed\xa0\x80"', id="lone surrogate"),
    pytest.param({"\udfff": 1, "a": 2}, b'{"a":2,"\xed\xbf\xbf":1}', id="surrogate key"),
    pytest.param({1: "a"}, b'{"1":"a"}', id="int key"),
    pytest.param(float("nan"), b"null", id="NaN is written as null"),
])
def test_canonical_json(value: Any, expected: bytes) -> None:
    assert canonical_json(value) == expected


def test_canonical_json_is_key_order_insensitive_and_matches_json_dumps() -> None:
    value = {"role": "user", "content": [{"type": "text", "text": "héllo"}], "name": None}
    reordered = {"name": None, "content": [{"text": "héllo", "type": "text"}], "role": "user"}
    assert canonical_json(value) == canonical_json(reordered)
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=False).encode()


def test_canonical_json_of_dicts_nested_past_the_recursion_limit() -> None:
    assert canonical_json(nested(4000, 2 ** 70)) == ('{"k":' * 4000 + "1180591620717411303424" + "}" * 4000).encode()


@pytest.mark.parametrize("value", [object(), {"a": {1, 2}}, {(1, 2): "tuple key"}, b"bytes"])
def test_canonical_json_refuses_non_json(value: Any) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


@pytest.mark.parametrize(("value", "options"), [
    ({"b": [1, 2.5, None, True, False], "a": "x"}, {}),
    ({"b": [1, 2.5, None], "a": {"d": 1, "c": 2}}, {"sort_keys": True}),
    ({None: 1, True: 2, False: 3, 1.5: 4, 2: 5, "s": 6}, {}),
    ([], {}), ({}, {}), ([[]], {}), ([{}, [], {"a": []}], {}),
    (("tuple", 1), {}),
    ({"é": "\u2603"}, {"ensure_ascii": True}),
    ({"é": "\u2603"}, {"ensure_ascii": False}),
    ({"a": [1, 2]}, {"separators": (", ", ": ")}),
    ({"s": {3, 1, 2}}, {"default": sorted}),
    ("\ud800", {"ensure_ascii": False}),
    (-0.0, {}), (float("inf"), {}), (10 ** 30, {}),
])
def test_dumps_iteratively_gives_the_text_json_dumps_gives(value: Any, options: dict[str, Any]) -> None:
    options = {"separators": (",", ":"), **options}
    assert dumps_iteratively(value, **options) == json.dumps(value, **options)


def test_dumps_iteratively_past_the_recursion_limit() -> None:
    deep: Any = "leaf"
    for index in range(20000):
        deep = [deep, index] if index % 2 else {"z": 1, "a": deep}
    text = dumps_iteratively(deep, sort_keys=True)
    assert text.startswith('[{"a":[{"a":') and text.count("[") == 10000 and text.count("{") == 10000
    assert text.endswith(',"z":1},19997],"z":1},19999]')


@pytest.mark.parametrize(("value", "message"), [
    (object(), "Object of type object is not JSON serializable"),
    ([1, {"a": b"x"}], "Object of type bytes is not JSON serializable"),
    ({(1, 2): 1}, "keys must be str, int, float, bool or None, not tuple"),
])
def test_dumps_iteratively_refuses_what_json_dumps_refuses(value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        dumps_iteratively(value)
    with pytest.raises(TypeError):
        json.dumps(value)


def blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def test_digests_are_blake2b_256_of_the_canonical_form() -> None:
    message = {"role": "user", "content": "hi"}
    assert digest_of(b"abc") == blake(b"abc")
    assert message_digest(message) == blake(b'{"content":"hi","role":"user"}')
    assert message_digest({"content": "hi", "role": "user"}) == message_digest(message)
    assert message_digest({"role": "user", "content": "hi "}) != message_digest(message)
    assert message_digest("\ud800") == blake(b'"\xed\xa0\x80"') != message_digest("\ufffd")


def test_chain_root_and_link() -> None:
    assert chain_root("ns") == blake(b"ns")
    assert chain_root("ns\ud800") == blake(b"ns\xed\xa0\x80") != chain_root("ns\ufffd")
    assert chain_link(b"s" * 32, b"d" * 32) == blake(b"s" * 32 + b"d" * 32)


def test_hash_chain_links_each_prefix() -> None:
    messages: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, "\udcff"]
    chain = hash_chain(messages, "tenant")
    state = blake(b"tenant")
    for index, message in enumerate(messages):
        state = blake(state + blake(canonical_json(message)))
        assert chain[index] == state.hex()
    assert len(chain) == 3 and all(len(entry) == 64 for entry in chain)
    assert hash_chain(messages[:2], "tenant") == chain[:2]
    assert hash_chain([], "tenant") == []


@pytest.mark.parametrize(("left", "right"), [
    (([{"a": 1}, {"b": 2}], "ns"), ([{"b": 2}, {"a": 1}], "ns")),  # order
    (([{"a": 1}], "ns"), ([{"a": 1}], "other")),  # namespace
    (([{"a": 1}], ""), ([{"a": 1}], "\ud800")),  # surrogate namespace
    (([[{"a": 1}, {"b": 2}]], "ns"), ([{"a": 1}, {"b": 2}], "ns")),  # one list message is not two messages
])
def test_hash_chain_separates(left: tuple[list[Any], str], right: tuple[list[Any], str]) -> None:
    assert set(hash_chain(*left)).isdisjoint(hash_chain(*right))
