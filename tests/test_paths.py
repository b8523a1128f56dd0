"""Paths stay under the upstream: dot segments and encoded separators are refused before auth and forwarding."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from yarl import URL

from proxy.paths import refusal
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
    for target in (b"/v1/..\\admin", b"http://127.0.0.1:1/v1/../admin", b"/v1/a/../../admin"):
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        try:
            writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 400"), (target, answer[:200])
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
