"""Request ids and access log lines, over real sockets: ids come back, every request has one JSON line, no secrets."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.config import Settings
from proxy.http.middleware import edge
from proxy.http.request_log import CLIENT_CLOSED, on_response_prepare, sane_request_id
from proxy.request_context import annotate, current_request_id
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import big_history, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

MARKER_TEXT = "zebra-quartz-marker-5521"
MARKER_KEY = "sk-reqlog-marker-key-99e1c7"
PROXY_KEY = "proxy-key-7f3e9a1b2c"
MESSAGES = [{"role": "user", "content": f"say {MARKER_TEXT}"}]
HEX = frozenset("0123456789abcdef")


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[list[dict[str, Any]]]:
    """The access log lines, parsed as they arrive (every logger is captured, for the leak checks)."""
    caplog.set_level(logging.DEBUG)
    parsed: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            parsed.append(json.loads(record.getMessage()))  # a line that is not JSON fails the test here

    handler = Collect(logging.DEBUG)
    logging.getLogger("proxy.access").addHandler(handler)
    yield parsed
    logging.getLogger("proxy.access").removeHandler(handler)


async def wait_for_lines(lines: list[dict[str, Any]], count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        assert time.monotonic() < deadline, f"{len(lines)} access log lines, expected {count}"
        await asyncio.sleep(0.01)


def only(lines: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    found = [line for line in lines if all(line.get(key) == value for key, value in match.items())]
    assert len(found) == 1, (match, lines)
    return found[0]


async def raw_request(host: str, port: int, head: bytes, timeout: float = 5.0) -> bytes:
    """One request written byte for byte (headers no HTTP client would send); the whole answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def header_of(answer: bytes, name: str) -> list[str]:
    head = answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return [value.strip() for line in head for key, _, value in [line.partition(":")] if key.lower() == name]


async def test_a_clients_id_is_returned_and_logged(proxy: Any, lines: list[dict[str, Any]]) -> None:
    raw = await async_client(proxy.url).chat.completions.with_raw_response.create(
        model="fake-small", messages=MESSAGES, extra_headers={"x-request-id": "client-id-42"})
    assert raw.headers["x-request-id"] == "client-id-42"
    # The upstream's own id is not lost: it moves aside, and the line carries it for correlation.
    assert raw.headers["x-upstream-request-id"] == "req_123"
    await wait_for_lines(lines, 1)
    line = only(lines, request_id="client-id-42")
    assert line["event"] == "request" and "request_id_source" not in line
    assert (line["method"], line["route"], line["path"], line["status"]) == ("POST", "chat", "/v1/chat/completions",
                                                                             200)
    assert line["stream"] is False and line["compaction"] == "none" and line["upstream_request_id"] == "req_123"
    assert line["bytes"] == len(raw.http_response.content) and 0 <= line["duration_ms"] < 5000


async def test_a_missing_id_is_generated_returned_and_logged(proxy: Any, lines: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        ids = []
        for _ in range(2):
            async with session.get(f"{proxy.url}/v1/models") as response:
                assert response.status == 200
                ids.append(response.headers["x-request-id"])
    assert ids[0] != ids[1] and all(len(one) == 32 and set(one) <= HEX for one in ids)
    await wait_for_lines(lines, 2)
    for one in ids:
        line = only(lines, request_id=one)
        assert line["request_id_source"] == "generated" and line["route"] == "passthrough"
        assert line["path"] == "/v1/models" and line["status"] == 200 and line["upstream_request_id"] == "req_models"


@pytest.mark.parametrize("hostile", [
    b"tab\there", b"caf\xc3\xa9-id", b"latin\xe9", b"x" * 200, b"has space",
    PROXY_KEY.encode(),                 # a configured key sent as an id is never reflected nor logged
    MARKER_KEY.encode(),                # nor is anything that looks like a key
    b"Bearer abcdefgh12345678",
])
async def test_a_hostile_id_is_replaced_never_reflected(hostile: bytes, make_proxy: ProxyFactory,
                                                        lines: list[dict[str, Any]]) -> None:
    proxy = await make_proxy({"server": {"api_keys": [PROXY_KEY]}})
    answer = await raw_request(proxy.host, proxy.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-request-id: " + hostile
                               + b"\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")
    assert hostile not in answer
    [returned] = header_of(answer, "x-request-id")
    assert len(returned) == 32 and set(returned) <= HEX
    await wait_for_lines(lines, 1)
    assert only(lines, request_id=returned)["request_id_source"] == "replaced"
    assert hostile.decode("latin-1") not in json.dumps(lines) + "".join(map(str, lines))


async def test_two_ids_are_no_id(proxy: Any, lines: list[dict[str, Any]]) -> None:
    answer = await raw_request(proxy.host, proxy.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-request-id: one-id\r\n"
                               b"x-request-id: two-id\r\nConnection: close\r\n\r\n")
    [returned] = header_of(answer, "x-request-id")
    assert returned not in ("one-id", "two-id")


async def test_header_smuggling_and_oversized_ids_are_not_reflected(proxy: Any) -> None:
    # CR LF ends the header: what follows is another request header, never one of the response.
    smuggled = await raw_request(proxy.host, proxy.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                 b"x-request-id: ok-id\r\nSet-Cookie: evil=1\r\nConnection: close\r\n\r\n")
    assert header_of(smuggled, "x-request-id") == ["ok-id"] and b"evil" not in smuggled
    # A bare CR or a DEL inside the value, and a 10 KB id (past aiohttp's header line limit), are refused by the parser.
    for value in (b"left\rSet-Cookie: evil=1", b"a\x7fdel", b"y" * 10_240):
        answer = await raw_request(proxy.host, proxy.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-request-id: " + value
                                   + b"\r\nConnection: close\r\n\r\n")
        # aiohttp answers these itself, before any middleware, quoting the line escaped in a text body: no header.
        head = answer.partition(b"\r\n\r\n")[0]
        assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")) and value not in answer
        assert header_of(answer, "x-request-id") == [] and header_of(answer, "set-cookie") == [] and b"evil" not in head


def test_sane_ids() -> None:
    assert sane_request_id("req_01HZX-abc.def:42/7")
    assert sane_request_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert sane_request_id("x" * 128) and not sane_request_id("x" * 129) and not sane_request_id("")
    assert not sane_request_id("sk-abcdefgh1234") and not sane_request_id("secret", [b"secret"])
    assert sane_request_id("secret-ish", [b"secret"])  # whole ids only: no oracle for a key's first letters


async def test_proxy_made_errors_carry_the_id(make_proxy: ProxyFactory, lines: list[dict[str, Any]]) -> None:
    proxy = await make_proxy({"server": {"api_keys": [PROXY_KEY], "max_body_bytes": 1024}})
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/chat/completions", json={"messages": MESSAGES},
                                headers={"x-request-id": "no-key", "Authorization": f"Bearer {MARKER_KEY}"}) as denied:
            assert denied.status == 401 and denied.headers["x-request-id"] == "no-key"
        big = json.dumps({"model": "m", "messages": [{"role": "user", "content": MARKER_TEXT * 200}]})
        async with session.post(f"{proxy.url}/v1/chat/completions", data=big,
                                headers={"x-request-id": "too-big", "Authorization": f"Bearer {PROXY_KEY}",
                                         "Content-Type": "application/json"}) as refused:
            assert refused.status == 413 and refused.headers["x-request-id"] == "too-big"
    answer = await raw_request(proxy.host, proxy.port, b"GET /v1/a/%2e%2e/b HTTP/1.1\r\nHost: x\r\n"
                               b"x-request-id: bad-path\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and header_of(answer, "x-request-id") == ["bad-path"]
    await wait_for_lines(lines, 3)
    assert only(lines, request_id="no-key")["status"] == 401
    assert only(lines, request_id="too-big")["status"] == 413
    assert only(lines, request_id="bad-path")["status"] == 400


async def test_no_message_text_or_secret_reaches_any_log(fake: FakeUpstream, make_proxy: ProxyFactory,
                                                         lines: list[dict[str, Any]],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    model = WindowedModel(window=8192)
    fake.chat_hook = model
    proxy = await make_proxy(compaction_config(background=False))
    history = big_history(20)
    history[-1] = {"role": "user", "content": f"{history[-1]['content']} {MARKER_TEXT}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/chat/completions?api-key={MARKER_KEY}",
                                json={"model": "fake-small", "messages": history},
                                headers={"Authorization": f"Bearer {MARKER_KEY}",
                                         "x-request-id": "leak-check"}) as done:
            assert done.status == 200 and done.headers["x-compaction"] == "proactive"
            tokens = int(done.headers["x-compaction-tokens-before"]), int(done.headers["x-compaction-tokens-after"])
            await done.read()
    await wait_for_lines(lines, 1)
    line = only(lines, request_id="leak-check")
    assert line["compaction"] == "proactive" and (line["tokens_before"], line["tokens_after"]) == tokens
    assert line["path"] == "/v1/chat/completions"  # no query string
    everything = caplog.text + json.dumps(lines)
    assert MARKER_TEXT not in everything and MARKER_KEY not in everything and "reqlog-marker" not in everything
    assert "FACT-" not in everything  # nor any other message text


async def test_concurrent_requests_keep_their_own_ids(fake: FakeUpstream, make_proxy: ProxyFactory,
                                                      lines: list[dict[str, Any]]) -> None:
    async def slow(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> None:
        await asyncio.sleep(0.2)  # all twenty are inside the proxy at once
        return None

    fake.chat_hook = slow
    proxy = await make_proxy()
    client = async_client(proxy.url)
    ids = [f"concurrent-{index:02d}" for index in range(20)]
    answers = await asyncio.wait_for(asyncio.gather(*(client.chat.completions.with_raw_response.create(
        model="fake-small", messages=MESSAGES, extra_headers={"x-request-id": one}) for one in ids)), 10)
    assert [answer.headers["x-request-id"] for answer in answers] == ids
    await wait_for_lines(lines, 20)
    assert sorted(line["request_id"] for line in lines) == ids
    assert all(line["duration_ms"] >= 200 for line in lines)


async def test_a_stream_is_logged_when_it_ends(fake: FakeUpstream, proxy: Any, lines: list[dict[str, Any]]) -> None:
    fake.stream_gate = asyncio.Event()
    client = async_client(proxy.url)
    raw = await client.chat.completions.with_raw_response.create(
        model="fake-small", messages=MESSAGES, stream=True, extra_headers={"x-request-id": "streamed"})
    assert raw.headers["x-request-id"] == "streamed" and raw.headers["x-upstream-request-id"] == "req_stream"
    stream = raw.parse()
    iterator = stream.__aiter__()
    await asyncio.wait_for(iterator.__anext__(), 5)
    await asyncio.sleep(0.3)
    assert lines == []  # the stream is still open: no line yet
    fake.stream_gate.set()
    rest = [chunk async for chunk in iterator]
    assert rest
    await wait_for_lines(lines, 1)
    line = only(lines, request_id="streamed")
    assert line["stream"] is True and line["status"] == 200 and line["compaction"] == "none"
    assert line["duration_ms"] >= 300 and line["bytes"] > 0 and "aborted" not in line


async def test_a_client_leaving_a_stream_is_logged(fake: FakeUpstream, proxy: Any,
                                                   lines: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.get(f"{proxy.url}/v1/endless", headers={"x-request-id": "left-early"})
        assert response.headers["x-request-id"] == "left-early"
        await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
        await asyncio.sleep(0.2)
        response.close()  # the client leaves mid-stream
    await wait_for_lines(lines, 1)
    line = only(lines, request_id="left-early")
    assert line["status"] == 200 and line["stream"] is True and line["aborted"] is True
    assert line["duration_ms"] >= 200


async def test_the_access_log_can_be_switched_off(make_proxy: ProxyFactory, lines: list[dict[str, Any]]) -> None:
    proxy = await make_proxy({"logging": {"access_log": False}})
    raw = await async_client(proxy.url).chat.completions.with_raw_response.create(
        model="fake-small", messages=MESSAGES, extra_headers={"x-request-id": "quiet"})
    assert raw.headers["x-request-id"] == "quiet"
    await asyncio.sleep(0.1)
    assert lines == []


async def test_probes_log_at_debug(proxy: Any, caplog: pytest.LogCaptureFixture,
                                   lines: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/healthz") as response:
        assert response.status == 200
    await wait_for_lines(lines, 1)
    [record] = [record for record in caplog.records if record.name == "proxy.access"]
    assert record.levelno == logging.DEBUG


@pytest.fixture
async def context_app() -> AsyncIterator[str]:
    """A bare app with the proxy's middleware and no runtime: handlers report what current_request_id() says."""

    async def handler(request: web.Request) -> web.Response:
        seen = [current_request_id()]
        annotate(model=request.query.get("model", "m"), upstream_status=201)
        await asyncio.sleep(0.05 * (int(request.query["n"]) % 5))  # interleave the requests
        seen.append(current_request_id())
        return web.json_response({"seen": seen})

    async def disconnect(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)  # cancelled when the client leaves
        return web.Response()

    async with logged_app({"/context": handler, "/slow": disconnect}) as url:
        yield url


@asynccontextmanager
async def logged_app(routes: dict[str, Handler], *on_prepare: Any) -> AsyncIterator[str]:
    """A bare app with the proxy's middleware and no runtime (and the log's signal, then `on_prepare`), serving
    GET `routes`."""
    app = web.Application(middlewares=[edge(Settings())])
    app.on_response_prepare.append(on_response_prepare)
    app.on_response_prepare.extend(on_prepare)
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    # As start_server runs the proxy: a client that leaves cancels its handler.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_the_current_id_is_isolated_per_request(context_app: str, lines: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        async def one(index: int) -> list[str]:
            async with session.get(f"{context_app}/context?n={index}&model=gpt-{index}",
                                   headers={"x-request-id": f"ctx-{index}"}) as response:
                seen: list[str] = (await response.json())["seen"]
                return seen

        seen = await asyncio.wait_for(asyncio.gather(*(one(index) for index in range(20))), 10)
    assert seen == [[f"ctx-{index}"] * 2 for index in range(20)]
    assert current_request_id() is None
    await wait_for_lines(lines, 20)
    for index in range(20):
        line = only(lines, request_id=f"ctx-{index}")
        assert line["model"] == f"gpt-{index}" and line["upstream_status"] == 201 and line["route"] == "other"
        assert "path" not in line  # a path no route knows is the client's invention


async def test_a_client_gone_before_the_answer_is_logged(context_app: str, lines: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(session.get(f"{context_app}/slow", headers={"x-request-id": "gone"}), 0.3)
    await wait_for_lines(lines, 1)
    line = only(lines, request_id="gone")
    assert line["status"] == CLIENT_CLOSED and line["aborted"] is True and line["error"] == "CancelledError"
    assert line["duration_ms"] >= 250


@pytest.fixture
async def ordered_app() -> AsyncIterator[tuple[str, list[str]]]:
    """A bare app with the proxy's middleware, noting in one list when each response's headers go out and when
    each access line is written."""
    order: list[str] = []

    async def whole(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await response.write_eof()
        return response

    async def sent(request: web.Request, response: web.StreamResponse) -> None:
        order.append(f"sent {request.path}")

    class Note(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            order.append(f"line {json.loads(record.getMessage())['status']}")

    note = Note(logging.DEBUG)
    logging.getLogger("proxy.access").addHandler(note)
    async with logged_app({"/whole": whole, "/stream": stream}, sent) as url:
        yield url, order
    logging.getLogger("proxy.access").removeHandler(note)


async def test_the_line_is_written_after_a_whole_answer_went_out(ordered_app: tuple[str, list[str]],
                                                               lines: list[dict[str, Any]]) -> None:
    """The client's answer does not wait for the proxy's bookkeeping: a whole body is sent first, then its line."""
    url, order = ordered_app
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.get(f"{url}/whole") as response:
                assert response.status == 200 and await response.json() == {"ok": True}
    await wait_for_lines(lines, 3)
    assert order == ["sent /whole", "line 200"] * 3
    assert all(line["bytes"] == len(b'{"ok": true}') and line["stream"] is False for line in lines)


async def test_a_stream_on_a_closing_connection_is_not_logged_as_cut(ordered_app: tuple[str, list[str]],
                                                                    lines: list[dict[str, Any]]) -> None:
    """aiohttp closes a `Connection: close` client's connection once the answer is sent: the line, written after,
    still tells an answer that reached its end from one the proxy had to cut."""
    url, order = ordered_app
    host, port = url.removeprefix("http://").split(":")
    answer = await raw_request(host, int(port), b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and b"data: 1" in answer
    await wait_for_lines(lines, 1)
    assert order == ["sent /stream", "line 200"]
    assert lines[0]["stream"] is True and "aborted" not in lines[0] and lines[0]["bytes"] > len(b"data: 1\n\n")


async def test_compaction_log_lines_run_under_the_requests_id(fake: FakeUpstream, make_proxy: ProxyFactory,
                                                              lines: list[dict[str, Any]]) -> None:
    """What the compactor logs, it logs while current_request_id() names the request it compacts for."""
    seen: list[tuple[str, str | None]] = []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.getMessage(), current_request_id()))

    fake.chat_hook = WindowedModel(window=8192)
    proxy = await make_proxy(compaction_config(background=False))
    watch = Watch(logging.DEBUG)
    logging.getLogger("proxy.compaction").addHandler(watch)
    try:
        raw = await async_client(proxy.url).chat.completions.with_raw_response.create(
            model="fake-small", messages=big_history(20), extra_headers={"x-request-id": "compacting"})
    finally:
        logging.getLogger("proxy.compaction").removeHandler(watch)
    assert raw.headers["x-compaction"] == "proactive"
    compactions = [request_id for message, request_id in seen if '"event": "compaction"' in message]
    assert compactions == ["compacting"]
