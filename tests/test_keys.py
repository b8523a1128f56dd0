"""Keys stay where they belong: proxy keys never go upstream, no open relay, secrets scrubbed from logs and URLs."""

from __future__ import annotations

import asyncio
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
from proxy.upstream import request_headers
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.ports import free_port
from tests.sdk import async_client
from tests.test_cli import wait_until_healthy, write
from tests.test_compaction_e2e import WINDOW, big_history, compaction_config

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config.example.yaml"
PROXY_KEY = "proxy-key-7f3e9a1b2c"
OTHER_PROXY_KEY = "proxy-key-second-55d0"
CLIENT_UPSTREAM_KEY = "sk-client-own-upstream-key"
OPERATOR_KEY = "sk-operator-paid-key-0042"


def keyed(**upstream: Any) -> dict[str, Any]:
    return {"server": {"api_keys": [PROXY_KEY, OTHER_PROXY_KEY]}, "upstream": upstream}


def everything_sent(fake: FakeUpstream) -> str:
    return json.dumps([request.headers for request in fake.requests])


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
    assert {"x-api-key", "api-key", "x-proxy-api-key"}.isdisjoint(name.lower() for name in sent)
    assert sent["x-request-id"] == PROXY_KEY and sent["OpenAI-Organization"] == "org-1"    # not a key carrier


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
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("OPENAI_API_KEY", "COMPACTION_THRESHOLD")}
    log = tmp_path / "proxy.log"
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "--config", str(config), "--port", str(port),
            cwd=tmp_path, env=env, stdout=log_file, stderr=log_file)
    try:
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
    proxy = await make_proxy({"upstream": {"base_url": f"http://gateway-user:hunter2-secret@{host}/v1"}})
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/readyz") as response:
        text = await response.text()
    assert "hunter2-secret" not in text
    assert json.loads(text)["upstream"] == f"http://gateway-user:***@{host}/v1"


def test_check_config_masks_url_passwords(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "upstream: {base_url: 'http://u:main-secret@gateway/v1'}\n"
                           "compaction: {summarizer: {upstream: {base_url: 'https://s:summary-secret@cheap/v1'}}}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "main-secret" not in out and "summary-secret" not in out
    resolved = json.loads(out)
    assert resolved["upstream"]["base_url"] == "http://u:***@gateway/v1"
    assert resolved["compaction"]["summarizer"]["upstream"]["base_url"] == "https://s:***@cheap/v1"
