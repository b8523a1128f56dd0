"""Keys stay where they belong: proxy keys never go upstream, no open relay, secrets scrubbed from logs and URLs."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy import log_filters
from proxy.cli import main
from proxy.config import ConfigError, open_relay_problem, settings_from_mapping
from proxy.log_filters import RedactSecrets, mask_url, redact
from proxy.upstream.upstream import request_headers
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import WINDOW, big_history, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.ports import free_port
from tests.proxy_process import listening_port
from tests.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)
from tests.sdk import async_client
from tests.test_cli import wait_until_healthy, write

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config.example.yaml"
PROXY_KEY = "proxy-key-7f3e9a1b2c"
OTHER_PROXY_KEY = "proxy-key-second-55d0"
CLIENT_UPSTREAM_KEY = "sk-client-own-upstream-key"
OPERATOR_KEY = "sk-operator-paid-key-0042"


ADMIN_KEY = "admin-key-operator-9c41e2"


def keyed(**upstream: Any) -> dict[str, Any]:
    return {"server": {"api_keys": [PROXY_KEY, OTHER_PROXY_KEY], "admin_keys": [ADMIN_KEY]}, "upstream": upstream}


def everything_sent(fake: FakeUpstream) -> str:
    return json.dumps([request.headers for request in fake.requests])


def everything_received(fake: FakeUpstream) -> str:
    """Every request line, header and body the upstream received, as one text (nothing escaped)."""
    return "\n".join(f"{request.method} {request.path}?{request.query}\n"
                     + "".join(f"{name}: {value}\n" for name, value in request.headers.items())
                     + request.body.decode("utf-8", "replace") for request in fake.requests)


def b64(text: str, *, urlsafe: bool = False, padded: bool = True) -> str:
    encoded = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(text.encode()).decode()
    return encoded if padded else encoded.rstrip("=")


def percent_encoded(text: str) -> str:
    return "".join(f"%{byte:02X}" for byte in text.encode())


# --- proxy keys are never forwarded ---------------------------------------------------------------------------

@pytest.mark.parametrize("carrier", [
    {"Authorization": f"Bearer {PROXY_KEY}"},
    {"authorization": f"bearer   {OTHER_PROXY_KEY}"},
    {"x-api-key": PROXY_KEY},
    {"x-proxy-api-key": PROXY_KEY},
    {"x-proxy-api-key": PROXY_KEY, "x-api-key": PROXY_KEY, "api-key": PROXY_KEY},
], ids=["bearer", "bearer-lowercase", "x-api-key", "x-proxy-api-key", "every-header"])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/echo/anything"])
async def test_an_accepted_proxy_key_is_never_forwarded(fake: FakeUpstream, make_proxy: ProxyFactory,
                                                        carrier: dict[str, str], path: str) -> None:
    proxy = await make_proxy(keyed())
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}{path}", headers=carrier) as response:
        assert response.status == 200
    sent = everything_sent(fake)
    assert PROXY_KEY not in sent and OTHER_PROXY_KEY not in sent
    assert "x-proxy-api-key" not in {name.lower() for name in fake.requests[-1].headers}


# Header names by forms a proxy key (or an operator key) may be hidden in; the request itself is authorised by
# x-proxy-api-key, so each of these is an extra header the proxy would otherwise forward as it is.
HIDDEN_KEYS = [
    ("Authorization", f"Token {PROXY_KEY}", PROXY_KEY),
    ("Authorization", f"Bearer\t{PROXY_KEY}", PROXY_KEY),
    ("Authorization", f"BEARER {OTHER_PROXY_KEY}", OTHER_PROXY_KEY),
    ("Authorization", f"Basic {b64('user:' + PROXY_KEY)}", PROXY_KEY),
    ("Authorization", f"basic {b64(OTHER_PROXY_KEY + ':')}", OTHER_PROXY_KEY),
    ("Authorization", f"Basic {b64(PROXY_KEY + ':x', urlsafe=True, padded=False)}", PROXY_KEY),
    ("Authorization", f'Digest username="u", response="{PROXY_KEY}"', PROXY_KEY),
    ("OpenAI-Organization", PROXY_KEY, PROXY_KEY),
    ("OpenAI-Organization", f"org-1 {OTHER_PROXY_KEY}", OTHER_PROXY_KEY),
    ("OpenAI-Project", PROXY_KEY.upper(), PROXY_KEY),
    ("x-api-key", f"Key {PROXY_KEY}", PROXY_KEY),
    ("api-key", f'"{PROXY_KEY}"', PROXY_KEY),
    ("x-request-id", PROXY_KEY, PROXY_KEY),
    ("X-Trace", f"prefix-{PROXY_KEY}-suffix", PROXY_KEY),
    ("Cookie", f"session={PROXY_KEY}; theme=dark", PROXY_KEY),
    ("X-Forwarded-Authorization", f"Bearer {ADMIN_KEY}", ADMIN_KEY),
    ("x-api-key", ADMIN_KEY, ADMIN_KEY),
    ("X-Credentials", f"Basic {b64(ADMIN_KEY + ':')}", ADMIN_KEY),
    ("X-Escaped", percent_encoded(PROXY_KEY), PROXY_KEY),
]


@pytest.mark.parametrize(("name", "value", "key"), HIDDEN_KEYS,
                         ids=[f"{index}-{name}" for index, (name, _, _) in enumerate(HIDDEN_KEYS)])
@pytest.mark.parametrize("route", ["passthrough", "chat"])
async def test_a_withheld_key_in_any_header_and_form_never_reaches_the_upstream(
        fake: FakeUpstream, make_proxy: ProxyFactory, name: str, value: str, key: str, route: str) -> None:
    proxy = await make_proxy(keyed())
    headers = {"x-proxy-api-key": PROXY_KEY, name: value, "X-Harmless": "kept"}
    async with aiohttp.ClientSession() as session:
        if route == "chat":
            chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
            answer = session.post(f"{proxy.url}/v1/chat/completions", json=chat, headers=headers)
        else:
            answer = session.get(f"{proxy.url}/v1/echo/anything", headers=headers)
        async with answer as response:
            assert response.status == 200
    received = everything_received(fake)
    assert fake.requests and "X-Harmless: kept" in received  # forwarded, with its other headers
    assert key.lower() not in received.lower() and value not in received


async def test_dedicated_header_lets_the_client_bring_its_own_upstream_key(fake: FakeUpstream,
                                                                           make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(keyed())
    client = async_client(proxy.url, api_key=CLIENT_UPSTREAM_KEY, default_headers={"x-proxy-api-key": PROXY_KEY})
    answer = await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "echo: hi"
    assert fake.requests[-1].headers["Authorization"] == f"Bearer {CLIENT_UPSTREAM_KEY}"
    assert PROXY_KEY not in everything_sent(fake)


async def test_a_wrong_dedicated_header_is_refused_even_with_a_proxy_key_in_authorization(
        fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(keyed())
    client = async_client(proxy.url, api_key=PROXY_KEY, default_headers={"x-proxy-api-key": "wrong"})
    with pytest.raises(openai.AuthenticationError):
        await client.models.list()
    assert fake.requests == []


async def test_the_operator_key_replaces_the_proxy_key(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(keyed(api_key=OPERATOR_KEY))
    await async_client(proxy.url, api_key=PROXY_KEY).models.list()
    assert fake.requests[-1].headers["Authorization"] == f"Bearer {OPERATOR_KEY}"
    assert PROXY_KEY not in everything_sent(fake)


async def test_without_proxy_keys_the_client_key_passes_through(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    client = async_client(proxy.url, api_key=CLIENT_UPSTREAM_KEY, default_headers={"x-proxy-api-key": "stray"})
    await client.models.list()
    assert fake.requests[-1].headers["Authorization"] == f"Bearer {CLIENT_UPSTREAM_KEY}"
    assert "stray" not in everything_sent(fake)


async def test_summariser_and_discovery_requests_never_carry_the_proxy_key(fake: FakeUpstream,
                                                                            make_proxy: ProxyFactory) -> None:
    model = WindowedModel(window=WINDOW)
    fake.chat_hook = model
    proxy = await make_proxy({**compaction_config(background=False), **keyed()})
    client = async_client(proxy.url, api_key=PROXY_KEY)
    await client.chat.completions.create(model="fake-small", messages=big_history(1))
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(20))
    assert raw.headers["x-compaction"] == "proactive" and len(model.summarizer_calls) == 1
    assert any(request.path.endswith("/models") for request in fake.requests)   # discovery asked
    assert PROXY_KEY not in everything_sent(fake)


@pytest.mark.parametrize(("api_key", "expected_authorization"),
                         [(None, None), (OPERATOR_KEY, f"Bearer {OPERATOR_KEY}")])
def test_request_headers_withhold_proxy_keys_from_every_carrier(api_key: str | None,
                                                                 expected_authorization: str | None) -> None:
    incoming = CIMultiDict([("AUTHORIZATION", f"Bearer {PROXY_KEY}"), ("X-Api-Key", OTHER_PROXY_KEY),
                            ("api-key", PROXY_KEY), ("X-Proxy-Api-Key", PROXY_KEY), ("x-request-id", PROXY_KEY),
                            ("OpenAI-Organization", "org-1")])
    sent = request_headers(incoming, api_key, (PROXY_KEY, OTHER_PROXY_KEY))
    assert sent.get("Authorization") == expected_authorization
    assert {"x-api-key", "api-key", "x-proxy-api-key", "x-request-id"}.isdisjoint(name.lower() for name in sent)
    assert sent["OpenAI-Organization"] == "org-1"    # carries no key


@pytest.mark.parametrize(("name", "value", "key"), HIDDEN_KEYS,
                         ids=[f"{index}-{name}" for index, (name, _, _) in enumerate(HIDDEN_KEYS)])
def test_request_headers_drop_a_header_hiding_a_withheld_key(name: str, value: str, key: str) -> None:
    sent = request_headers(CIMultiDict([(name, value), ("X-Harmless", "kept")]), None,
                           (PROXY_KEY, OTHER_PROXY_KEY, ADMIN_KEY))
    assert name not in sent and sent["X-Harmless"] == "kept"


@pytest.mark.parametrize(("name", "value"), [
    ("Authorization", f"Bearer {CLIENT_UPSTREAM_KEY}"),
    ("Authorization", f"Basic {b64('user:' + CLIENT_UPSTREAM_KEY)}"),
    ("Authorization", "Basic"),
    ("OpenAI-Organization", "org-proxy-key"),        # a prefix of a proxy key is not the key
    ("OpenAI-Project", "proj_abc123"),
    ("User-Agent", "AsyncOpenAI/Python 1.40.0"),
    ("X-Stainless-Arch", "x64"),
    ("Content-Type", "application/json; charset=utf-8"),
    ("X-Escaped", "a%ZZb%"),                         # not valid percent-encoding: left as it is
    ("X-Request-Id", "req_" + "A" * 200),
])
def test_request_headers_keep_headers_that_hide_no_withheld_key(name: str, value: str) -> None:
    sent = request_headers(CIMultiDict([(name, value)]), None, (PROXY_KEY, OTHER_PROXY_KEY, ADMIN_KEY))
    assert sent[name] == value


def test_request_headers_keep_a_client_key_that_is_not_a_proxy_key() -> None:
    incoming = CIMultiDict([("Authorization", f"Bearer {CLIENT_UPSTREAM_KEY}"), ("api-key", "azure-own"),
                            ("x-proxy-api-key", PROXY_KEY)])
    sent = request_headers(incoming, None, (PROXY_KEY,))
    assert sent["Authorization"] == f"Bearer {CLIENT_UPSTREAM_KEY}" and sent["api-key"] == "azure-own"
    assert "x-proxy-api-key" not in sent


# --- no open relay on the operator's key ----------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST", "[::1]",
                                  "::ffff:127.0.0.1"])
def test_loopback_with_an_operator_key_is_allowed(host: str) -> None:
    settings = settings_from_mapping({"server": {"host": host}, "upstream": {"api_key": OPERATOR_KEY}}, env={})
    assert open_relay_problem(settings) is None


@pytest.mark.parametrize(("tree", "host", "relay"), [
    ({"server": {"host": "0.0.0.0"}, "upstream": {"api_key": OPERATOR_KEY}}, None, True),
    ({"server": {"host": "::"}, "upstream": {"api_key": OPERATOR_KEY}}, None, True),
    ({"server": {"host": "10.0.0.5"}, "upstream": {"api_key": OPERATOR_KEY}}, None, True),
    ({"server": {"host": "proxy.internal"}, "upstream": {"api_key": OPERATOR_KEY}}, None, True),
    ({"upstream": {"api_key": OPERATOR_KEY}}, "0.0.0.0", True),
    ({"server": {"host": "0.0.0.0"}, "upstream": {"api_key": OPERATOR_KEY}}, "127.0.0.1", False),
    ({"server": {"host": "0.0.0.0"}, "compaction": {"summarizer": {"upstream": {"api_key": OPERATOR_KEY}}}},
     None, True),
    ({"server": {"host": "0.0.0.0", "api_keys": [PROXY_KEY]}, "upstream": {"api_key": OPERATOR_KEY}}, None, False),
    ({"server": {"host": "0.0.0.0"}}, None, False),
], ids=["any-v4", "any-v6", "lan", "hostname", "cli-host", "cli-loopback", "summariser-key", "proxy-keys",
        "client-keys"])
def test_open_relay_is_recognised(tree: dict[str, Any], host: str | None, relay: bool) -> None:
    problem = open_relay_problem(settings_from_mapping(tree, env={}), host)
    assert (problem is not None) == relay
    if problem is not None:
        assert "server.api_keys" in problem and "127.0.0.1" in problem


@pytest.fixture
def operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPERATOR_KEY)
    monkeypatch.delenv("PROXY_API_KEYS", raising=False)
    monkeypatch.delenv("COMPACTION_THRESHOLD", raising=False)


def serve_and_expect_refusal(*argv: str) -> str:
    """Run the real program; an open relay must exit 1 at once instead of serving."""
    env = {**os.environ, "OPENAI_API_KEY": OPERATOR_KEY}
    env.pop("PROXY_API_KEYS", None)
    try:
        result = subprocess.run([sys.executable, "-m", "proxy", *argv], capture_output=True, text=True,
                                timeout=30, env=env, cwd=REPO, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the proxy served as an open relay instead of refusing to start")
    assert result.returncode == 1, result.stderr
    assert OPERATOR_KEY not in result.stdout + result.stderr
    return result.stderr


def test_serving_as_an_open_relay_exits_1_naming_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, f"server: {{host: 0.0.0.0, port: {free_port()}}}\n"
                           "upstream: {api_key: '${OPENAI_API_KEY}'}\n")
    err = serve_and_expect_refusal("--config", str(path))
    assert "open relay" in err and "server.api_keys" in err and "Traceback" not in err


def test_example_config_on_every_interface_is_refused() -> None:
    err = serve_and_expect_refusal("--config", str(EXAMPLE), "--host", "0.0.0.0", "--port", str(free_port()))
    assert "server.api_keys" in err and "PROXY_API_KEYS" in err


@pytest.mark.usefixtures("operator_environment")
def test_check_config_reports_an_open_relay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "server: {host: 0.0.0.0}\nupstream: {api_key: '${OPENAI_API_KEY}'}\n")
    assert main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "open relay" in err and OPERATOR_KEY not in out + err


@pytest.mark.usefixtures("operator_environment")
def test_example_takes_proxy_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PROXY_API_KEYS", f"{PROXY_KEY}, {OTHER_PROXY_KEY}")
    assert main(["--host", "0.0.0.0", "check-config", str(EXAMPLE)]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["server"]["api_keys"] == ["**********", "**********"]


@pytest.mark.parametrize(("value", "keys"), [("", []), ("  ", []), ("k1", ["k1"]), (" k1 , k2 ", ["k1", "k2"]),
                                            (["k1", "k2"], ["k1", "k2"])])
def test_proxy_keys_come_as_a_list_or_one_comma_separated_string(value: Any, keys: list[str]) -> None:
    settings = settings_from_mapping({"server": {"api_keys": value}}, env={})
    assert [key.get_secret_value() for key in settings.server.api_keys] == keys
    assert list(settings.upstream.withheld_keys) == keys


@pytest.mark.parametrize("value", ["k1,,k2", "k1,", [""], ["k1", " "]])
def test_a_blank_proxy_key_is_still_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"server\.api_keys"):
        settings_from_mapping({"server": {"api_keys": value}}, env={})


# --- secrets scrubbed from logs --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "secret"), [
    ("b'Authorization: Bearer sk-secret-token-abc123\\x7f\\x00'", "sk-secret-token-abc123"),
    ("authorization:basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("{'x-api-key': 'plain-secret-value'}", "plain-secret-value"),
    ('"api-key": "azure-secret-value"', "azure-secret-value"),
    ("X-Proxy-Api-Key: proxy-secret-value", "proxy-secret-value"),
    ("token Bearer abc.def-ghi_jkl was refused", "abc.def-ghi_jkl"),
    ("key sk-proj-AbCdEf0123456789 leaked", "AbCdEf0123456789"),
    ("upstream http://user:hunter2@gateway:8000/v1 down", "hunter2"),
    ("b'GET / HTTP/1.1\\r\\nAuthorization: Bearer tok-in-raw-bytes\\r\\nHost: x\\r\\n'", "tok-in-raw-bytes"),
])
def test_redact_removes_credentials(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert "***" in redact(text)


def full_redaction(text: str) -> str:
    """Every pattern applied, as redact() does when its quick look finds something to redact."""
    text = log_filters._CREDENTIAL_FIELD.sub(log_filters._field, text)
    text = log_filters._BEARER.sub(lambda match: match["scheme"] + log_filters.MASK, text)
    text = log_filters._SECRET_KEY.sub("sk-" + log_filters.MASK, text)
    return log_filters._URL_PASSWORD.sub(lambda match: f"{match['head']}{log_filters.MASK}@", text)


# Letters whose case folding differs (dotless i, long s, the Kelvin sign) are there on purpose: the redaction
# must not be fooled by them, nor trip over them.
PIECES = st.sampled_from(["Authorization: ", "AUTHORIZATION=", "authorızation: ", "x-api-key: ", "api-KEY=",  # noqa: RUF001
                          "proxy-key: ", "Bearer ", "BEARER ", "beareſ ", "sk-", "SK-", "ſk-", "http://", "u:p@",  # noqa: RUF001
                          "abcdefgh12345678", " ", "\r\n", "'", '"', "ı", "ſ", "K", "é"])  # noqa: RUF001


@given(st.lists(PIECES | st.text(max_size=6), max_size=12))
@settings(max_examples=500)
def test_the_quick_look_never_skips_a_text_the_patterns_would_change(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert redact(text) == full_redaction(text)


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "upstream http://gateway:8000/v1 answered 401 for model gpt-4o-mini (authorization failed)"
    assert redact(text) == text


def test_filter_scrubs_message_arguments_and_tracebacks() -> None:
    try:
        raise ValueError("bad header b'Authorization: Bearer sk-in-exception-123456'")
    except ValueError:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "headers %s from %s",
                                   ({"x-api-key": "sk-in-args-abcdef12"}, "client"), sys.exc_info())
    assert RedactSecrets().filter(record) is True
    text = logging.Formatter().format(record)
    assert "sk-in-exception-123456" not in text and "sk-in-args-abcdef12" not in text
    assert "ValueError" in text and "from client" in text


async def test_bad_request_log_lines_carry_no_bearer_token(tmp_path: Path, fake: FakeUpstream) -> None:
    config = write(tmp_path, f"upstream:\n  base_url: {fake.url}/v1\n")
    env = {key: value for key, value in os.environ.items() if key not in ("OPENAI_API_KEY", "COMPACTION_THRESHOLD")}
    log = tmp_path / "proxy.log"
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "--config", str(config), "--port", "0",
            cwd=tmp_path, env=env, stdout=log_file, stderr=log_file)
    try:
        port = await listening_port(process, log)
        await wait_until_healthy(f"http://127.0.0.1:{port}", process, log)
        for request in (b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer sk-raw-socket-secret-1\x7f\r\n\r\n",
                        b"GET /v1/models HTTP/1.1\r\nx-api-key: raw-socket-secret-2\r\nBad\x01: y\r\n\r\n"):
            await asyncio.to_thread(send_raw, port, request)
        output = ""
        for _ in range(50):
            output = log.read_text()
            if output.count("Error handling request") >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        process.terminate()
        await process.wait()
    assert output.count("Error handling request") >= 2, output
    assert "raw-socket-secret" not in output, output


def send_raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(request)
        return connection.recv(4096)


# --- passwords in URLs masked ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "masked"), [
    ("http://user:pass@host/v1", "http://user:***@host/v1"),
    ("https://user:p%40ss:w@host:8443/v1", "https://user:***@host:8443/v1"),
    ("https://u:pa@ss@host/v1", "https://u:***@host/v1"),
    ("redis://:secret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("http://host:8000/v1", "http://host:8000/v1"),
    ("http://token@host/v1", "http://token@host/v1"),
    ("http://host/v1?next=http://a:b@c", "http://host/v1?next=http://a:b@c"),
])
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


async def test_readyz_masks_the_upstream_password(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    host = fake.url.removeprefix("http://")
    proxy = await make_proxy({"server": {"admin_keys": [ADMIN_KEY]},
                              "upstream": {"base_url": f"http://gateway-user:hunter2-secret@{host}/v1"}})
    async with aiohttp.ClientSession() as session, \
            session.get(f"{proxy.url}/readyz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        text = await response.text()
    assert "hunter2-secret" not in text
    assert json.loads(text)["upstream"] == f"http://gateway-user:***@{host}/v1"


# --- /readyz details for operators only ------------------------------------------------------------------------

@pytest.mark.parametrize(("headers", "operator"), [
    ({}, False),
    ({"Authorization": f"Bearer {PROXY_KEY}"}, False),
    ({"x-proxy-api-key": PROXY_KEY}, False),
    ({"Authorization": f"Bearer {ADMIN_KEY}x"}, False),
    ({"Authorization": f"Bearer {ADMIN_KEY[:-1]}"}, False),
    ({"x-proxy-api-key": ADMIN_KEY}, True),
    ({"Authorization": f"Bearer {ADMIN_KEY}"}, True),
    ({"x-api-key": ADMIN_KEY}, True),
], ids=["none", "proxy-key", "proxy-key-dedicated", "admin-key-longer", "admin-key-shorter", "admin-dedicated",
        "admin-bearer", "admin-x-api-key"])
async def test_readyz_shows_the_upstream_and_the_store_only_to_an_operator(
        fake: FakeUpstream, make_proxy: ProxyFactory, redis_server: RedisServer,  # noqa: F811
        headers: dict[str, str], operator: bool) -> None:
    proxy = await make_proxy({**keyed(), "store": {"kind": "redis", "url": redis_server.url}})
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/readyz", headers=headers) as response:
        assert response.status == 200
        text = await response.text()
    body = json.loads(text)
    assert (body["status"], body["store"]) == ("ready", "ok")
    if operator:
        assert body["upstream"] == f"{fake.url}/v1"
        assert body["store_detail"] == {"kind": "redis", "url": redis_server.url, "reachable": True}
    else:
        assert set(body) == {"status", "store"}
        assert fake.url not in text and str(redis_server.port) not in text


async def test_an_admin_key_is_no_proxy_key_and_never_leaves(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(keyed())
    async with aiohttp.ClientSession() as session:
        for carrier in ({"Authorization": f"Bearer {ADMIN_KEY}"}, {"x-api-key": ADMIN_KEY},
                        {"x-proxy-api-key": ADMIN_KEY}):
            async with session.get(f"{proxy.url}/v1/models", headers=carrier) as response:
                assert response.status == 401
        assert fake.requests == []
        headers = {"x-proxy-api-key": PROXY_KEY, "Authorization": f"Bearer {ADMIN_KEY}", "x-api-key": ADMIN_KEY}
        async with session.get(f"{proxy.url}/v1/models", headers=headers) as response:
            assert response.status == 200
    assert len(fake.requests) == 1 and ADMIN_KEY not in everything_received(fake)


def test_check_config_masks_url_passwords(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "upstream: {base_url: 'http://u:main-secret@gateway/v1'}\n"
                           "compaction: {summarizer: {upstream: {base_url: 'https://s:summary-secret@cheap/v1'}}}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "main-secret" not in out and "summary-secret" not in out
    resolved = json.loads(out)
    assert resolved["upstream"]["base_url"] == "http://u:***@gateway/v1"
    assert resolved["compaction"]["summarizer"]["upstream"]["base_url"] == "https://s:***@cheap/v1"
