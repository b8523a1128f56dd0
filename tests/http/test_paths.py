"""Paths stay under the upstream: dot segments and encoded separators are refused before auth and forwarding."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import unquote, unquote_to_bytes

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from proxy.http.paths import checked, refusal
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream

ESCAPING = [
    "/v1/../admin",
    "/v1/./models",
    "/v1/..",
    "/v1/models/..",
    "/v1/%2e%2e/admin",
    "/v1/%2E%2e/admin",
    "/v1/.%2e/admin",
    "/v1/%2e./admin",
    "/v1/%2e/models",
    "/v1/..%2fadmin",
    "/v1/..%2Fadmin",
    "/v1/files%2f..%2f..%2fadmin",
    "/v1/..%5cadmin",
    "/v1/%5C..%5Cadmin",
    "/v1/..\\admin",
    "/v1/%00/models",
    "/v1/models%00",
    "/v1/%252e%252e/admin",
    "/v1/%25252e%25252e/admin",
    "/v1/%252f..%252fadmin",
    "/v1/..;/admin",
    "/v1/%2e%2e;x=1/admin",
    # IIS-style %uXXXX escapes
    "/v1/%u002e%u002e/admin",
    "/v1/%U002E%U002E/admin",
    "/v1/..%u002fadmin",
    "/v1/%25u002e%25u002e/admin",
    # overlong (or otherwise invalid) UTF-8 for '.', '/' and '\', as lenient decoders read it
    "/v1/%c0%ae%c0%ae/admin",
    "/v1/%C0%AE./admin",
    "/v1/%e0%80%ae%e0%80%ae/admin",
    "/v1/%f0%80%80%ae%f0%80%80%ae/admin",
    "/v1/..%c0%afadmin",
    "/v1/..%e0%80%afadmin",
    "/v1/..%c1%9cadmin",
    "/v1/..%c0%2e/admin",
    "/v1/%25c0%25ae%25c0%25ae/admin",
    # a sequence left open takes the next segment's '/' as its continuation byte, to a lenient decoder: './'
    "/v1/.%c0/admin",
    "/v1/..%e0%80/admin",
    "/v1/.%25c0/admin",
    # Latin-1 and other bytes that are not UTF-8: no certain reading at all
    "/v1/caf%e9",
    # segments that are dot segments once trailing dots and spaces are stripped (as Windows servers do)
    "/v1/.../admin",
    "/v1/..../admin",
    "/v1/..%2e/admin",
    "/v1/..%20/admin",
    "/v1/.%20./admin",
    "/v1/..%20%20/admin",
    "/v1/.%20/models",
    "/v1/..%20;x/admin",
    "/v1/%252e%252e%2520/admin",
    "/v1/files%2f...%2fadmin",
]
NORMAL = [
    ("GET", "/v1/models"),
    ("GET", "/v1/files/file-abc/content"),
    ("GET", "/v1/echo/a.b/..c/c..?path=../x&v=1.2.3"),
    ("GET", "/v1/echo/v1.2/x%20y"),
    ("POST", "/v1/echo/file.name.jsonl"),
    # An encoded slash alone stays inside its segment: the openai SDK sends model ids like "org/model" this way.
    ("GET", "/v1/echo/org%2Fmodel"),
    ("GET", "/v1/echo/%252fadmin"),
    ("GET", "/v1/echo/gpt-4.1"),
    ("GET", "/v1/echo/ft:gpt-4.1-mini:org::abc.1"),
    ("GET", "/v1/echo/file-abc.jsonl"),
    ("GET", "/v1/echo/meta-llama%2FLlama-3.1-8B-Instruct"),
    ("GET", "/v1/echo/a..b/.hidden/trailing./x.%20"),
    ("GET", "/v1/echo/caf%C3%A9/%E2%82%AC/%F0%9F%98%80"),
    ("GET", "/v1/echo/%20/name%20with%20spaces"),
    ("GET", "/v1/echo/100%25"),
]


async def raw_request(session: aiohttp.ClientSession, method: str, base: str, path: str,
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    async with session.request(method, URL(base + path, encoded=True), headers=headers or {}) as response:
        return response.status, await response.json(content_type=None)


@pytest.mark.parametrize("with_key", [True, False], ids=["with-key", "without-key"])
async def test_escaping_paths_never_reach_the_upstream(with_key: bool, fake: FakeUpstream,
                                                       make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"api_keys": ["proxy-key"]}, "upstream": {"api_key": "sk-operator"}})
    headers = {"Authorization": "Bearer proxy-key"} if with_key else {}
    before = {request.path for request in fake.requests}
    async with aiohttp.ClientSession() as session:
        for path in ESCAPING:
            for method in ("GET", "POST"):
                status, body = await raw_request(session, method, proxy.url, path, headers)
                assert status == 400, (method, path, status, body)
                error = body["error"]
                assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
                assert error["type"] == "invalid_request_error"
    assert {request.path for request in fake.requests} == before


async def test_raw_socket_paths_are_refused(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """What no client library would send: a raw backslash, an absolute-form target."""
    proxy = await make_proxy()
    for target in (b"/v1/..\\admin", b"http://127.0.0.1:1/v1/../admin", b"/v1/a/../../admin",
                   b"/v1/\xc0\xae\xc0\xae/admin", b"/v1/.. /admin"):
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        try:
            writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
        assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), (target, answer[:200])  # 1.0: aiohttp's parser
    assert not [request for request in fake.requests if "admin" in request.path]


async def test_normal_paths_still_forwarded_verbatim(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session:
        for method, path in NORMAL:
            async with session.request(method, URL(proxy.url + path, encoded=True)) as response:
                assert response.status in (200, 404), (path, response.status)
                await response.read()
            target, _, query = path.partition("?")
            recorded = fake.requests[-1]
            assert (recorded.method, recorded.path, recorded.query) == (method, target, query)


@pytest.mark.parametrize("path", [*ESCAPING, "/v1/../../etc", "*", "http://x/v1/models"])
def test_refusal_names_every_escaping_path(path: str) -> None:
    assert refusal(path) is not None


@pytest.mark.parametrize("path", [path for _, path in NORMAL] + ["/healthz", "/v1/chat/completions",
                                                                 "/v1/a%2Bb", "/v1/%E2%82%AC"])
def test_refusal_leaves_normal_paths_alone(path: str) -> None:
    assert refusal(path) is None


@given(st.text(alphabet="abcXYZ019_-/", max_size=40))
def test_a_plain_path_passed_at_a_glance_passes_the_full_check(tail: str) -> None:
    assert refusal("/" + tail) is None
    assert checked("/" + tail) is None


@pytest.mark.parametrize("path", ["/v1/./x", "/v1/a%2e%2e/x", "v1/chat", "/v1\\..", "/v1/x;..", "/v1/é"])
def test_a_path_with_anything_else_gets_the_full_check(path: str) -> None:
    assert refusal(path) == checked(path)


# --- whatever refusal lets through, no decoder a server behind the proxy might run makes a dot segment of ------

def iis_decoded(text: str) -> str:
    return re.sub(r"%u([0-9a-fA-F]{4})", lambda match: chr(int(match[1], 16)), text)


def leniently_decoded(text: str) -> str:
    """Percent-decoding then UTF-8 decoding that takes overlong forms and any byte as a continuation byte."""
    raw, decoded, index = unquote_to_bytes(text), [], 0
    while index < len(raw):
        lead = raw[index]
        follows = 0 if lead < 0xC0 else 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3 if lead < 0xF8 else 4
        point = lead if not follows else lead & (0x3F >> follows)
        for byte in raw[index + 1:index + 1 + follows]:
            point = point << 6 | byte & 0x3F
        lone_continuation = 0x80 <= lead < 0xC0
        decoded.append("\ufffd" if lone_continuation or point >= 0x110000 else chr(point))
        index += 1 + follows
    return "".join(decoded)


DECODERS = (unquote, iis_decoded, leniently_decoded)


def views(path: str, depth: int = 3) -> set[str]:
    """The path as every chain of up to `depth` decodings (standard, IIS, lenient UTF-8) leaves it."""
    seen, frontier = {path}, {path}
    for _ in range(depth):
        frontier = {decode(view) for view in frontier for decode in DECODERS} - seen
        seen |= frontier
    return seen


def traverses(view: str) -> bool:
    """A '.' or '..' segment to some server: split at '/' or '\\', ';' parameters dropped, trailing dots and
    spaces stripped as Windows does."""
    for piece in re.split(r"[/\\]", view):
        name = piece.partition(";")[0]
        if name and set(name) <= {".", " "} and "." in name:
            return True
    return False


PIECES = ["a", "b1", ".", "..", " ", "%20", "%2e", "%2E", "%252e", "%u002e", "%U002F", "u002e", "%c0%ae",
          "%e0%80%ae", "%c0%af", "%c1%9c", "%c1%b5", "%c0%a5", "c0", "ae", "%c0", "%ae", "%2f", "%2F", "%5c",
          "%25", ";", "-", "%c3%a9", "%e2%82%ac", "%00"]
SEGMENT = st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map("".join)


@given(st.lists(SEGMENT, min_size=1, max_size=3))
@settings(max_examples=1500, deadline=None)
def test_no_decoding_of_an_accepted_path_has_a_dot_segment(segments: list[str]) -> None:
    path = "/v1/" + "/".join(segments)
    if refusal(path) is None:
        escaping = [view for view in views(path) if traverses(view)]
        assert not escaping, (path, escaping)


@given(st.text(max_size=40))
@settings(max_examples=500, deadline=None)
def test_refusal_answers_any_text(text: str) -> None:
    assert isinstance(refusal("/v1/" + text), str | None)
