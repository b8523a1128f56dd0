"""proxy.dialects.body: hostile bodies get a clear OpenAI-shaped 400 at parse time, never a 500."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.app import RunningServer
from proxy.core.fingerprint import canonical_json, hash_chain, message_digest
from proxy.core.tenants import tenant_namespace
from proxy.dialects.body import (
    MAX_NESTING,
    _plainly_within_limits,
    decode_body,
    encode_json,
    has_lone_surrogate_escape,
)
from proxy.dialects.chat_request import ChatCall
from proxy.errors import BadRequest
from tests.fakes.openai_upstream import FakeUpstream, chunk, completion, sse

HEADERS: dict[str, str] = {}
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse(body: bytes | str) -> ChatCall:
    return ChatCall.parse(body.encode() if isinstance(body, str) else body, HEADERS, "")


def chat_body(content: str = '"hi"', extra: str = "") -> str:
    """A chat body as raw JSON text, with `content` (raw JSON text) as the user message's content."""
    return '{"model":"fake-small","messages":[{"role":"user","content":' + content + "}]" + extra + "}"


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


def deep_list(depth: int, inner: Any = None) -> Any:
    """`depth` nested lists around `inner`, built without recursion."""
    value = [] if inner is None else [inner]
    for _ in range(depth - 1):
        value = [value]
    return value


def contains_surrogate(value: Any) -> bool:
    """The ground truth, by walking the decoded value: does any string or key hold a surrogate code point?"""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return True
        elif isinstance(node, dict):
            stack += [*node.keys(), *node.values()]
        elif isinstance(node, list):
            stack += node
    return False


# --- nesting depth ---------------------------------------------------------------------------------------

def test_brackets_5000_deep_are_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="nested"):
        parse(b"[" * 5000 + b"]" * 5000)


@pytest.mark.parametrize("body", [
    pytest.param("{" + '"a":{' * 5000 + "}" * 5001, id="objects"),
    pytest.param(chat_body(nested(900, '"x"')), id="900 levels inside a message"),
    pytest.param(chat_body(nested(5000)), id="5000 levels inside a message"),
    pytest.param('{"a":' + "[" * 5000, id="unclosed"),
    pytest.param('{"a":' + "[1," * 5000, id="unclosed with items"),
    pytest.param('{"a":' + "[" * 5000 + "}" * 5000, id="mismatched"),
])
def test_deep_bodies_are_bad_requests_not_crashes(body: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(body)
    assert caught.value.status == 400 and caught.value.error_type == "invalid_request_error"


@pytest.mark.parametrize("extra", ["", ',"seed":' + str(2 ** 70)], ids=["fast path", "with a big integer"])
def test_nesting_limit_is_exact(extra: str) -> None:
    # The body object is level 1; `metadata` adds its own levels below it. A big integer makes orjson refuse the
    # payload whatever its depth, so the limit is then found by the walk: both must agree.
    at_limit = chat_body(extra=',"metadata":' + nested(MAX_NESTING - 1) + extra)
    assert parse(at_limit).payload["model"] == "fake-small"
    with pytest.raises(BadRequest, match=f"nested more than {MAX_NESTING} levels"):
        parse(chat_body(extra=',"metadata":' + nested(MAX_NESTING) + extra))


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps("[" * 10_000 + "{" * 10_000)
    assert parse(chat_body(text)).messages == [{"role": "user", "content": "[" * 10_000 + "{" * 10_000}]


def test_wide_bodies_are_not_deep() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": str(i)}]} for i in range(5000)]
    assert len(parse(json.dumps({"model": "m", "messages": messages})).messages or []) == 5000


def test_depth_and_surrogate_checks_are_cheap_on_a_large_body() -> None:
    # ~10 MB with an escaped emoji in every message: the checks that run on every chat request cost a small
    # fraction of the parse they follow (about a tenth; half is the bound, for noisy machines).
    messages = [{"role": "user", "content": [{"type": "text", "text": f"{i}: " + "word 😀 " * 170}]}
                for i in range(3_400)]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    assert len(body) > 10_000_000 and body.count(b"\\ud83d\\ude00") > 500_000
    payload = parse(body).payload
    assert payload["messages"] == messages
    parsing = min(_timed(lambda: json.loads(body)) for _ in range(5))
    checking = min(_timed(lambda: _plainly_within_limits(payload)) for _ in range(5))
    assert checking < 0.5 * parsing


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


# --- lone surrogates -------------------------------------------------------------------------------------

LONE = {
    "high": r'"\ud800"',
    "low": r'"\udc00"',
    "upper-case hex": r'"\uD83D"',
    "high then text": r'"\ud800x"',
    "high then non-surrogate escape": r'"\ud800\u0041"',
    "high then high then low": r'"\ud83d\ud83d\ude00"',
    "low then high": r'"\ude00\ud83d"',
    "at the end": r'"ok \udbff"',
    "after an escaped backslash": r'"\\\ud800"',
}
PAIRED = {
    "pair": r'"\ud83d\ude00"',
    "upper-case pair": r'"\uD83D\uDE00"',
    "escaped backslash then text": r'"\\ud800"',
    "two escaped backslashes then a pair": r'"\\\\\ud83d\ude00"',
    "plain escape": r'"\u00e9\n\"\/"',
}


@pytest.mark.parametrize("extra", ["", ',"seed":' + str(2 ** 70)], ids=["plain", "with a big integer"])
@pytest.mark.parametrize("content", sorted(LONE))
def test_lone_surrogate_escapes_are_bad_requests(content: str, extra: str) -> None:
    with pytest.raises(BadRequest, match="surrogate"):
        parse(chat_body(LONE[content], extra))


def test_lone_surrogate_in_a_key_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="surrogate"):
        parse(chat_body(extra=r',"metadata":{"\udfff":1}'))


@pytest.mark.parametrize("extra", ["", ',"seed":' + str(2 ** 70)], ids=["plain", "with a big integer"])
@pytest.mark.parametrize("content", sorted(PAIRED))
def test_paired_surrogates_and_escaped_backslashes_are_fine(content: str, extra: str) -> None:
    call = parse(chat_body(PAIRED[content], extra))
    assert call.messages is not None and call.messages[0]["content"] == json.loads(PAIRED[content])


@pytest.mark.parametrize("raw", [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xff", b"\xc3"])
def test_invalid_utf8_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest, match="UTF-8"):
        parse(chat_body('"a').encode() + raw + b'"}]}')


ESCAPE_PIECES = st.sampled_from([r"\ud800", r"\udbff", r"\udc00", r"\udfff", r"\uD83D", r"\uDE00", r"\\",
                                 r"\"", r"\u0041", "u", "d8", "00", "a", "\\\\u", "é", r"\n"])


@given(st.lists(ESCAPE_PIECES, max_size=12), st.booleans())
@settings(max_examples=1000, deadline=None)
def test_surrogate_check_matches_the_decoded_strings(pieces: list[str], big_integer: bool) -> None:
    literal = '"' + "".join(pieces) + '"'
    try:
        value = json.loads(literal)
    except ValueError:
        return  # not a JSON string (a dangling backslash): the parser's problem, covered elsewhere
    assert has_lone_surrogate_escape(literal) == contains_surrogate(value)
    # A big integer makes orjson refuse the payload, so the text decides: both ways must agree.
    body = chat_body(literal, ',"seed":' + str(2 ** 70) if big_integer else "")
    if contains_surrogate(value):
        with pytest.raises(BadRequest, match="surrogate"):
            parse(body)
    else:
        assert parse(body).messages == [{"role": "user", "content": value}]


# --- re-encoding -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [
    pytest.param({"a": "\ud800", "b": "é"}, id="lone surrogate"),
    pytest.param({"a": 2 ** 70}, id="big integer"),
    pytest.param({"a": deep_list(300)}, id="deeper than orjson"),
    pytest.param({"a": deep_list(5000, "\ud800")}, id="deeper than the recursion limit"),
])
def test_encode_json_is_total(payload: dict[str, Any]) -> None:
    encoded = encode_json(payload)
    text = encoded.decode("utf-8")  # always valid UTF-8 on the wire
    if text.count("[") < 900:
        assert json.loads(encoded) == payload
    else:
        assert text == '{"a":' + nested(5000, '"\\ud800"') + "}"


# --- over real sockets -----------------------------------------------------------------------------------

HOSTILE = {
    "5000 brackets": b"[" * 5000 + b"]" * 5000,
    "900 levels inside a message": chat_body(nested(900, '"x"')).encode(),
    "lone surrogate in a message": chat_body(r'"\ud800"').encode(),
    "surrogate bytes in a message": chat_body('"a').encode() + b"\xed\xa0\x80" + b'"}]}',
    "unclosed brackets": b'{"messages":' + b"[" * 5000,
}


@pytest.mark.parametrize("mode", ["auto", "off"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_bodies_get_a_400_over_sockets(name: str, mode: str, fake: FakeUpstream,
                                                     proxy: RunningServer) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.url}/v1/chat/completions", data=HOSTILE[name],
            headers={"Content-Type": "application/json", "x-compaction-mode": mode}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert fake.chat_requests() == []


async def test_escaped_emoji_pass_byte_for_byte(fake: FakeUpstream, proxy: RunningServer) -> None:
    body = ('{ "model" : "fake-small",\n "messages": [{"role": "user", "content": "hi \\ud83d\\ude00 \\\\ud800"}],'
            ' "model": "fake-small", "x-vendor": {"deep": ' + nested(40, "1") + "} }").encode()
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == "echo: hi 😀 \\ud800"
    assert fake.requests[-1].body == body


# --- property: random bodies through a real proxy ---------------------------------------------------------

# Raw JSON text, built piece by piece so it can hold what json.dumps never writes: lone surrogate escapes,
# duplicate keys, NaN, huge numbers, 3000 levels of nesting, and plain garbage. Valid shapes are drawn more
# often than hostile ones, so the compaction path (and its token counting and hashing) sees many of them.
VALID_STRING = st.tuples(st.text(max_size=12), st.booleans()).map(
    lambda spec: json.dumps(spec[0], ensure_ascii=spec[1]))  # ensure_ascii spells emoji as surrogate pairs
ESCAPED_STRING = st.lists(st.one_of(VALID_STRING.map(lambda text: text[1:-1]), ESCAPE_PIECES), max_size=5).map(
    lambda parts: '"' + "".join(parts) + '"')  # valid JSON, but it may decode to a lone surrogate
STRING = st.one_of(*[VALID_STRING] * 8, ESCAPED_STRING)
SCALARS = st.one_of(
    st.sampled_from(["null", "true", "false", "0", "-0", "1e999", "-1e400", "NaN", "Infinity", "1.5", "01", "1.",
                     str(2 ** 70), "-" + str(2 ** 64)]),
    st.integers().map(str), st.floats(allow_nan=False, allow_infinity=False).map(repr), STRING, STRING)


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    arrays = st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
    keys = st.one_of(STRING, st.sampled_from(['"role"', '"content"', '"type"', '"text"', '"a"']))
    objects = st.lists(st.tuples(keys, children), max_size=4).map(
        lambda pairs: "{" + ",".join(f"{key}:{value}" for key, value in pairs) + "}")
    return st.one_of(arrays, objects)


def _object(*fields: st.SearchStrategy[tuple[str, str]]) -> st.SearchStrategy[str]:
    return st.tuples(*fields).map(lambda pairs: "{" + ",".join(f"{key}:{value}" for key, value in pairs) + "}")


JSON_TEXT = st.recursive(SCALARS, _containers, max_leaves=12)
DEEP = st.tuples(st.one_of(st.integers(1, 200), st.integers(1, 3000)), JSON_TEXT,
                 st.sampled_from([True] * 5 + [False])).map(
    lambda spec: nested(spec[0], spec[1]) if spec[2] else "[" * spec[0] + spec[1])
ANY_VALUE = JSON_TEXT
ROLE = st.one_of(st.sampled_from(['"user"', '"assistant"', '"system"', '"tool"', '"developer"']), ANY_VALUE)
PART = st.one_of(
    _object(st.just(('"type"', '"text"')), st.tuples(st.just('"text"'), STRING)),
    _object(st.just(('"type"', '"image_url"')), st.tuples(st.just('"image_url"'), ANY_VALUE)),
    ANY_VALUE)
CONTENT = st.one_of(STRING, STRING, st.lists(PART, max_size=3).map(lambda parts: "[" + ",".join(parts) + "]"),
                    ANY_VALUE, DEEP)
TOOL_CALL = _object(st.tuples(st.just('"id"'), STRING), st.just(('"type"', '"function"')),
                    st.tuples(st.just('"function"'), _object(st.tuples(st.just('"name"'), STRING),
                                                             st.tuples(st.just('"arguments"'), ANY_VALUE))))
MESSAGE = st.one_of(
    _object(st.tuples(st.just('"role"'), ROLE), st.tuples(st.just('"content"'), CONTENT)),
    _object(st.tuples(st.just('"role"'), ROLE), st.tuples(st.just('"content"'), CONTENT),
            st.tuples(st.just('"tool_calls"'), st.lists(TOOL_CALL, max_size=2).map(lambda c: "[" + ",".join(c) + "]")),
            st.just(('"role"', '"assistant"'))),  # a duplicate key: the last one wins
    _object(st.tuples(st.just('"role"'), ROLE), st.tuples(st.just('"tool_call_id"'), STRING),
            st.tuples(st.just('"content"'), CONTENT)),
    ANY_VALUE)
MESSAGES = st.one_of(st.lists(MESSAGE, min_size=1, max_size=6).map(lambda items: "[" + ",".join(items) + "]"),
                     st.lists(MESSAGE, max_size=6).map(lambda items: "[" + ",".join(items) + "]"), ANY_VALUE)
EXTRA_FIELD = st.one_of(
    st.tuples(st.just('"stream"'), st.one_of(st.sampled_from(["true", "false", '"true"', "1"]), ANY_VALUE)),
    st.tuples(st.sampled_from(['"max_tokens"', '"max_completion_tokens"', '"stream_options"', '"tools"',
                               '"functions"', '"n"', '"truncation"', '"model"', '"messages"']), ANY_VALUE),
    st.tuples(STRING, ANY_VALUE), st.tuples(STRING, DEEP))
CHAT_BODY = st.tuples(st.one_of(st.just('"fake-small"'), st.just('"gpt-4o"'), ANY_VALUE), MESSAGES,
                      st.lists(EXTRA_FIELD, max_size=4)).map(
    lambda spec: "{" + ",".join([f'"model":{spec[0]}', f'"messages":{spec[1]}']
                                + [f"{key}:{value}" for key, value in spec[2]]) + "}")
BODY = st.one_of(
    CHAT_BODY.map(lambda text: text.encode()), CHAT_BODY.map(lambda text: text.encode()),
    CHAT_BODY.map(lambda text: text.encode()).flatmap(
        lambda body: st.tuples(st.just(body), st.integers(0, len(body)), st.binary(max_size=4)).map(
            lambda cut: cut[0][: cut[1]] + cut[2] + cut[0][cut[1]:])),
    ANY_VALUE.map(lambda text: text.encode()),
    st.binary(max_size=64), st.sampled_from([b"", b"\xed\xa0\x80", b'"\xed\xa0\x80"', b"\xef\xbb\xbf{}"]))
MODE = st.sampled_from([None, "auto", "off", "force", "bogus"])


async def fixed_answer(request: web.Request, state: FakeUpstream) -> web.StreamResponse:
    """The upstream's answer to any body: a completion, or a stream when the body asks for one."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("stream") is not True:
        return web.json_response(completion({}, "upstream says hi"), headers={"x-from-upstream": "1"})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-from-upstream": "1"})
    await response.prepare(request)
    await response.write(sse(chunk({}, {"role": "assistant", "content": "upstream"})))
    await response.write(sse(chunk({}, {}, "stop")) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def assert_openai_error(status: int, body: bytes) -> None:
    assert 400 <= status < 500, (status, body[:300])
    error = json.loads(body)["error"]
    event(f"error: {re.sub(r'[0-9]+', 'N', error['message'])[:45]}")
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)


@given(body=BODY, mode=MODE)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
async def test_random_bodies_never_get_a_500(body: bytes, mode: str | None, fake: FakeUpstream,
                                             proxy: RunningServer) -> None:
    fake.raw_chat_hook = fixed_answer
    fake.requests.clear()
    headers = {"Content-Type": "application/json", **({"x-compaction-mode": mode} if mode else {})}
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
            f"{proxy.url}/v1/chat/completions", data=body, headers=headers) as response:
        answer = await response.read()
        event(f"status {response.status}")  # the spread of outcomes, shown by --hypothesis-show-statistics
        if response.headers.get("x-from-upstream") == "1":
            assert response.status == 200
        else:
            assert_openai_error(response.status, answer)


# --- hashing: total on any string --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    pytest.param({"role": "user", "content": "\ud800"}, id="lone surrogate"),
    pytest.param({"role": "user", "content": [{"\udfff": ["\udc80"]}]}, id="surrogate key"),
    pytest.param({"role": "user", "content": deep_list(5000, "x")}, id="5000 levels"),
    pytest.param({"role": "user", "content": deep_list(300, 2 ** 70)}, id="big integer, 300 levels"),
])
def test_fingerprints_are_total_and_stable(value: Any) -> None:
    digest = message_digest(value)
    assert len(digest) == 32 and message_digest(value) == digest
    assert canonical_json(value).decode("utf-8", "surrogatepass").startswith("{")
    chain = hash_chain([value, {"role": "assistant", "content": "ok"}], tenant_namespace("sk-\udcff", "t\ud800"))
    assert len(chain) == 2 and chain == hash_chain([value, {"role": "assistant", "content": "ok"}],
                                                   tenant_namespace("sk-\udcff", "t\ud800"))


def test_canonical_json_past_the_recursion_limit_matches_json_dumps() -> None:
    shallow = {"b": [1, {"y": None, "x": "é"}], "a": 2.5}
    assert canonical_json(deep_list(5000, shallow)) == (
        "[" * 5000 + json.dumps(shallow, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        + "]" * 5000).encode()


async def raw_request(url: str, head: bytes, body: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(-1), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("keys", [False, True], ids=["open proxy", "proxy keys"])
async def test_undecodable_credentials_and_tenants_are_not_a_crash(keys: bool, fake: FakeUpstream,
                                                                   make_proxy: Any) -> None:
    overrides = {"server": {"api_keys": ["sk-proxy"], "tenant_header": "x-tenant"}} if keys \
        else {"server": {"tenant_header": "x-tenant"}}
    proxy = await make_proxy(overrides)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer sk-\xff\xfe\r\nx-tenant: t\xff\r\n")
    answer = await raw_request(proxy.url, head, chat_body().encode())
    status = int(answer.split(b" ", 2)[1])
    assert status == (401 if keys else 200), answer[:300]


# --- the fast reader agrees with json.loads ----------------------------------------------------------------

JSON_SCALARS = (st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
                | st.integers(min_value=-(2 ** 80), max_value=2 ** 80) | st.text())
JSON_VALUES = st.recursive(JSON_SCALARS, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=20)


def typed(value: Any) -> Any:
    """`value` with every number tagged by its type, so 1 and 1.0 (equal in Python) compare unequal."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


@given(JSON_VALUES, st.booleans())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_decoding_gives_exactly_what_json_loads_gives(value: Any, ascii_only: bool) -> None:
    body = json.dumps({"model": "m", "extra": value}, ensure_ascii=ascii_only).encode()
    event("long digit run" if re.search(rb"\d{19}", body) else "no long digit run")
    assert typed(decode_body(body)) == typed(json.loads(body))


@pytest.mark.parametrize("body", [
    pytest.param(b'{"n": 123456789012345678901234567890}', id="integer beyond 64 bits"),
    pytest.param(b'{"n": -9223372036854775809}', id="just below the smallest 64-bit integer"),
    pytest.param(b'{"n": NaN}', id="NaN"),
    pytest.param(b'\xef\xbb\xbf{"n": 1}', id="byte order mark"),
    pytest.param('{"n": "é"}'.encode("utf-16"), id="UTF-16"),
])
def test_bodies_orjson_would_read_inexactly_or_refuse_are_read_by_json(body: bytes) -> None:
    text = body.decode(json.detect_encoding(body))
    assert typed(decode_body(body)) == typed(json.loads(text))
