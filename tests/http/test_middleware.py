"""The middleware's edge, its guarding steps (the log's are in test_request_log), over real sockets: an escaping
path is refused before the key check, a missing key before the handler, every failure answered as JSON (or cut once
started), and a request answered before its body was read closes its connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy.config import Settings
from proxy.errors import BadRequest
from proxy.http.middleware import edge
from proxy.http.request_body import read_bounded
from tests.fakes.serving import serve_app

KEY = b"sk-guard-proxy-key-0123456789"


def app_with(keys: list[bytes], ran: list[str]) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        ran.append(request.path)
        action = request.match_info.get("action", "ok")
        if action == "read":
            return web.json_response({"length": len(await read_bounded(request, 1 << 20, 5))})
        if action == "refuse":
            raise BadRequest("not this one", param="messages")
        if action == "crash":
            raise ValueError("a bug, with message text that must not be shown")
        if action == "cut":
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b"data: {}\n\n")
            raise ValueError("after the start")
        return web.json_response({"ok": True})

    settings = Settings.model_validate({"server": {"api_keys": [key.decode() for key in keys]}})
    app = web.Application(middlewares=[edge(settings)])
    app.router.add_route("*", "/v1/{action}", handler)
    app.router.add_get("/healthz", handler)
    return app


@pytest.fixture
async def served() -> AsyncIterator[Callable[[list[bytes], list[str]], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(keys: list[bytes], ran: list[str]) -> str:
        runner, url = await serve_app(app_with(keys, ran))
        runners.append(runner)
        return url

    yield start
    for runner in runners:
        await runner.cleanup()


WITH_KEY = {"x-proxy-api-key": KEY.decode()}


@pytest.mark.parametrize(("path", "headers", "status", "code", "ran"), [
    ("/v1/%2e%2e/admin", {}, 400, "invalid_path", False),                # the path before the key
    ("/v1/read", {}, 401, "invalid_api_key", False),
    ("/v1/read", {"Authorization": "Bearer wrong"}, 401, "invalid_api_key", False),
    ("/v1/read", WITH_KEY, 200, None, True),
    ("/v1/refuse", WITH_KEY, 400, None, True),
    ("/v1/crash", WITH_KEY, 500, "internal_error", True),
], ids=["escaping", "no-key", "wrong-key", "read", "refused", "crash"])
async def test_the_guards_steps_in_their_order(served: Callable[[list[bytes], list[str]], Awaitable[str]],
                                               path: str, headers: dict[str, str], status: int, code: str | None,
                                               ran: bool) -> None:
    handled: list[str] = []
    url = await served([KEY], handled)
    async with aiohttp.ClientSession() as session, \
            session.post(URL(url + path, encoded=True), data=b'{"model": "m"}', headers=headers) as response:
        body = await response.json()
        assert response.status == status
        assert ("error" in body) is (status >= 400)
        if code is not None:
            assert body["error"]["code"] == code
        assert "message text" not in str(body)
    assert bool(handled) is ran


@pytest.mark.parametrize(("head", "status"), [
    (b"POST /v1/%2e%2e/admin HTTP/1.1", b"400"),
    (b"POST /v1/read HTTP/1.1", b"401"),
    (b"POST /v1/refuse HTTP/1.1\r\nx-proxy-api-key: " + KEY, b"400"),
    (b"POST /v1/crash HTTP/1.1\r\nx-proxy-api-key: " + KEY, b"500"),
], ids=["escaping", "no-key", "refused", "crash"])
async def test_an_answer_before_the_body_closes_the_connection(
        served: Callable[[list[bytes], list[str]], Awaitable[str]], head: bytes, status: bytes) -> None:
    url = URL(await served([KEY], []))
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(head + b"\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)  # most never sent
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert answer.startswith(b"HTTP/1.1 " + status)
        assert b"connection: close" in answer.lower()
    finally:
        writer.close()


async def test_probes_stay_open_and_no_keys_means_open(
        served: Callable[[list[bytes], list[str]], Awaitable[str]]) -> None:
    handled: list[str] = []
    keyed, open_url = await served([KEY], handled), await served([], handled)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{keyed}/healthz") as response:
            assert response.status == 200
        async with session.post(f"{open_url}/v1/read", data=b"{}") as response:
            assert response.status == 200
    assert handled == ["/healthz", "/v1/read"]


async def test_a_failure_after_the_start_cuts_the_connection(
        served: Callable[[list[bytes], list[str]], Awaitable[str]]) -> None:
    url = await served([], [])
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/cut", data=b"{}") as response:
        assert response.status == 200  # the status line was out: it stays
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_concurrent_requests_each_get_their_own_verdict(
        served: Callable[[list[bytes], list[str]], Awaitable[str]]) -> None:
    url = await served([KEY], [])

    async def one(index: int) -> int:
        headers = {"x-proxy-api-key": KEY.decode()} if index % 2 else {}
        async with aiohttp.ClientSession() as session, \
                session.post(f"{url}/v1/read", data=b"{}", headers=headers) as response:
            return response.status

    assert await asyncio.gather(*(one(index) for index in range(40))) == [401, 200] * 20
