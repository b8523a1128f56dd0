"""Command line: check-config output and exit codes, help/version, and the real program serving and stopping."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import aiohttp
import pytest

from proxy import __version__
from proxy.cli import loop_factory, main
from tests.fakes.openai_upstream import FakeUpstream
from tests.proxy_process import listening_port
from tests.sdk import async_client

REPO = Path(__file__).resolve().parent.parent
ENV_SECRET = "sk-cli-env-secret-4f9a1c"
FILE_SECRET = "proxy-cli-file-secret-77b2"
GOOD_CONFIGS = {
    "secrets": f"""
server: {{port: 9001, api_keys: ["{FILE_SECRET}"]}}
upstream: {{base_url: "http://gateway:8000/v1/", api_key: "${{OPENAI_API_KEY}}"}}
models: {{gpt-4o: {{context_window: 8192}}}}
""",
    "explicit defaults": "{}\n",
    "example": (REPO / "config.example.yaml").read_text(encoding="utf-8"),
}
BAD_CONFIGS = {
    "nested unknown key": ("compaction:\n  summarizer:\n    modle: gpt-4o-mini\n",
                           "compaction.summarizer.modle: unknown key"),
    "model unknown key": ("models:\n  gpt-4o:\n    contxt_window: 8192\n", "models.gpt-4o.contxt_window: unknown key"),
    "out of range": ("server:\n  port: 123456\n", "server.port: "),
    "missing variable": ("upstream:\n  api_key: ${CLI_TEST_UNSET_VARIABLE}\n", "CLI_TEST_UNSET_VARIABLE"),
    "not yaml": ("server: [1,\n", "not valid YAML"),
    "empty": ("# nothing here yet\n", "is empty"),
}


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_SECRET)
    monkeypatch.delenv("COMPACTION_THRESHOLD", raising=False)
    monkeypatch.delenv("CLI_TEST_UNSET_VARIABLE", raising=False)


@pytest.mark.parametrize("name", GOOD_CONFIGS)
def test_check_config_prints_resolved_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               name: str) -> None:
    assert main(["check-config", str(write(tmp_path, GOOD_CONFIGS[name]))]) == 0
    out, err = capsys.readouterr()
    resolved = json.loads(out)
    assert resolved["compaction"]["threshold"] == 0.8 and "default" in resolved["models"]
    assert ENV_SECRET not in out + err and FILE_SECRET not in out + err
    assert err == ""


def test_check_config_masks_secrets_and_shows_resolution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(write(tmp_path, GOOD_CONFIGS["secrets"]))]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["upstream"]["base_url"] == "http://gateway:8000/v1"
    assert resolved["upstream"]["api_key"] == "**********"
    assert resolved["server"]["api_keys"] == ["**********"] and resolved["server"]["port"] == 9001
    assert resolved["models"]["gpt-4o"]["context_window"] == 8192


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_check_config_rejects_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    text, expected = BAD_CONFIGS[name]
    assert main(["check-config", str(write(tmp_path, text))]) == 1
    out, err = capsys.readouterr()
    assert out == "" and expected in err and "Traceback" not in err


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "absent.yaml")]) == 1
    assert "cannot read config" in capsys.readouterr().err


def test_serving_with_a_bad_config_exits_1_before_listening(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BAD_CONFIGS["nested unknown key"][0])
    assert main(["--config", str(path), "--port", "0"]) == 1
    assert "compaction.summarizer.modle" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--help"], "check-config"),
    (["--version"], __version__),
    (["check-config", "--help"], "path"),
])
def test_help_and_version_need_no_config(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert expected in capsys.readouterr().out


def console_script() -> Path:
    script = Path(sysconfig.get_path("scripts")) / "compaction-proxy"
    assert script.exists(), "the package is not installed: run `pip install -e .`"
    return script


@pytest.mark.parametrize(("text", "code", "stream", "expected"), [
    (GOOD_CONFIGS["secrets"], 0, "stdout", '"api_key": "**********"'),
    (BAD_CONFIGS["nested unknown key"][0], 1, "stderr", "compaction.summarizer.modle: unknown key"),
], ids=["good", "bad"])
def test_console_script_check_config(tmp_path: Path, text: str, code: int, stream: str, expected: str) -> None:
    result = subprocess.run([str(console_script()), "check-config", str(write(tmp_path, text))],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == code, result.stderr
    assert expected in getattr(result, stream)
    assert ENV_SECRET not in result.stdout + result.stderr


async def wait_until_healthy(base: str, process: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + 10
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            assert process.returncode is None, f"the proxy exited early:\n{log.read_text()}"
            try:
                async with session.get(f"{base}/healthz") as response:
                    if response.status == 200 and (await response.json()) == {"status": "ok"}:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    pytest.fail(f"/healthz did not answer within 10 s:\n{log.read_text()}")


@pytest.mark.parametrize(("event_loop", "expected"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
async def test_real_program_serves_and_stops_cleanly_on_sigterm(tmp_path: Path, fake: FakeUpstream, event_loop: str,
                                                                 expected: str) -> None:
    config = write(tmp_path, f"upstream:\n  base_url: {fake.url}/v1\nlogging:\n  level: INFO\n"
                             f"server:\n  event_loop: {event_loop}\n")
    env = {key: value for key, value in os.environ.items() if key not in ("OPENAI_API_KEY", "COMPACTION_THRESHOLD")}
    log = tmp_path / "proxy.log"
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "--config", str(config), "--port", "0",
            cwd=tmp_path, env=env, stdout=log_file, stderr=log_file)
    try:
        port = await listening_port(process, log)
        base = f"http://127.0.0.1:{port}"
        await wait_until_healthy(base, process, log)
        client = async_client(base, api_key="sk-client-key")
        try:
            answer = await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hello from the cli test"}])
        finally:
            await client.close()
        assert answer.choices[0].message.content == "echo: hello from the cli test"
        assert fake.requests[-1].headers["Authorization"] == "Bearer sk-client-key"

        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 10)
        output = log.read_text()
        assert code == 0, output
        assert "Traceback" not in output and "shutting down" in output
        assert f"event loop {expected}" in output
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize(("choice", "installed", "expected"), [
    ("auto", True, "uvloop"), ("auto", False, None), ("asyncio", True, None), ("asyncio", False, None),
    ("uvloop", True, "uvloop"),
])
def test_the_event_loop_follows_the_config_and_what_is_installed(
        choice: str, installed: bool, expected: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if not installed:
        monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails as if it were absent
    factory = loop_factory(choice)
    assert (factory.__module__.split(".")[0] if factory is not None else None) == expected


def test_uvloop_asked_for_but_absent_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(SystemExit, match="uvloop is not installed"):
        loop_factory("uvloop")
