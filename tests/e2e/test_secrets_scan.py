"""The secrets scan can fail a session, and what the proxy shows after a keyed compaction holds no key."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import WINDOW, big_history, compaction_config
from tests.e2e.test_keys import CLIENT_UPSTREAM_KEY, OPERATOR_KEY, PROXY_KEY
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client
from tests.secrets_scan import assert_no_secrets, find_secrets

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
INNER_TIMEOUT = 120

LEAKING_SUITE = f'''
import logging

def test_a_proxy_logger_writes_a_proxy_key():
    logging.getLogger("proxy.upstream").warning("forwarding with key %s", "{PROXY_KEY}")

def test_a_store_file_keeps_a_bearer_token(tmp_path):
    (tmp_path / "summaries.sqlite").write_bytes(b"SQLite format 3\\x00 Authorization: Bearer abcdefgh12345678")

def test_a_test_of_its_own_may_log_anything():
    logging.getLogger("tests.client").warning("the client sends %s", "{CLIENT_UPSTREAM_KEY}")
'''

CLEAN_SUITE = '''
import logging

def test_an_sk_key_the_deployment_redaction_removes():
    logging.getLogger("proxy.compaction").warning("Authorization: Bearer sk-redacted0123456789")

def test_nothing_secret():
    logging.getLogger("proxy").warning("upstream http://gateway:8000/v1 answered 401 (authorization failed)")
'''


def run_inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str) -> pytest.RunResult:
    """Run `source` as a suite of its own, in a subprocess so its log records never reach this session's scan."""
    pytester.makepyfile(test_inner=source)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        return pytester.runpytest_subprocess("-p", "tests.secrets_scan", "-p", "no:cacheprovider", "-q",
                                             timeout=INNER_TIMEOUT)
    finally:
        # The inner suite's tmp dirs sit under this session's: its planted store file must not trip the outer scan.
        for inner_temp in pytester.path.glob("runpytest-*"):
            shutil.rmtree(inner_temp, ignore_errors=True)


def test_a_leaked_key_fails_the_session_naming_the_test_and_the_pattern(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_inner(pytester, monkeypatch, LEAKING_SUITE)
    output = result.stdout.str()
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert "SECRETS SCAN FAILED: 2 secret(s)" in output, output
    assert ("a literal test secret in log record of proxy.upstream during "
            "test_inner.py::test_a_proxy_logger_writes_a_proxy_key (call)") in output
    assert "a bearer token in " in output and "summaries.sqlite during the test that owns " in output
    assert "tests.client" not in output, "only what the proxy writes is scanned"
    assert PROXY_KEY not in output, "the report does not repeat the secret"


def test_a_clean_session_passes_and_counts_what_the_redaction_removed(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_inner(pytester, monkeypatch, CLEAN_SUITE)
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, output
    assert "scanned 2 log records" in output and "2 secret(s) removed by the log redaction" in output
    assert "secrets scan: no secret in any log record or store file" in output


@pytest.mark.parametrize("text", [
    f"key {PROXY_KEY} here", "Authorization: Bearer abcdefgh12345678", "redis://:s3cret-Pa55word@cache:6379/0",
    "sk-abcdefgh1234", "upstream http://user:pw@host/v1",
])
def test_the_patterns_find_secrets(text: str) -> None:
    assert list(find_secrets(text)), text


@pytest.mark.parametrize("text", [
    "sk-***", "Bearer ***", "redis://:***@cache:6379/0", "task-update sk-upper", "http://gateway:8000/v1",
    "x-proxy-api-key: ***", "desk-test",
])
def test_the_patterns_leave_masked_and_ordinary_text_alone(text: str) -> None:
    assert not list(find_secrets(text)), text


async def test_metrics_and_the_store_after_a_keyed_compaction_hold_no_key(
        fake: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    model = WindowedModel(window=WINDOW)
    fake.chat_hook = model
    store = tmp_path / "summaries.sqlite"
    proxy = await make_proxy({**compaction_config(background=False),
                              "server": {"api_keys": [PROXY_KEY], "tenant_header": "x-tenant"},
                              "store": {"kind": "sqlite", "path": str(store)}})
    headers = {"x-proxy-api-key": PROXY_KEY, "x-tenant": "acme"}
    client = async_client(proxy.url, api_key=CLIENT_UPSTREAM_KEY, default_headers=headers)
    await client.chat.completions.create(model="fake-small", messages=big_history(1))
    raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=big_history(20))
    assert raw.headers["x-compaction"] == "proactive" and len(model.summarizer_calls) == 1
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics", headers=headers) as response:
        assert response.status == 200
        metrics = await response.text()
    assert "compaction_proxy_compactions_total" in metrics
    assert_no_secrets(metrics, "/metrics")
    for path in tmp_path.glob("summaries.sqlite*"):
        assert_no_secrets(path.read_bytes().decode("utf-8", "replace"), str(path))
    assert store.stat().st_size > 0
    assert OPERATOR_KEY not in metrics
