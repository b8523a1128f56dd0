"""The Codex CLI from npm, run as its users run it: a pinned version, a CODEX_HOME whose provider is the proxy."""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Pinned with the README's test command, which installs it here (npm ships the binary inside the package).
CODEX_VERSION = "0.171.0"
CODEX_BIN = ROOT / ".cache" / "npm" / "node_modules" / ".bin" / "codex"


def codex_binary() -> Path:
    """The pinned codex; a missing one fails the test with the step that installs it."""
    binary = Path(os.environ.get("CODEX_BIN") or CODEX_BIN)
    if not binary.exists():
        raise AssertionError(f"codex is not installed at {binary}: run the README's test command, which installs "
                             f"@openai/codex@{CODEX_VERSION} with npm into .cache/npm (or set CODEX_BIN)")
    return binary


@dataclass
class CodexRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def codex_home(home: Path, base_url: str) -> dict[str, str]:
    """A CODEX_HOME whose model provider is the proxy (Responses wire API), and the environment to run codex in."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        'model = "fake-codex"\nmodel_provider = "proxy"\n\n[model_providers.proxy]\nname = "proxy"\n'
        f'base_url = "{base_url}/v1"\nwire_api = "responses"\nenv_key = "PROXY_TEST_KEY"\n', encoding="utf-8")
    path = os.pathsep.join(part for part in (os.environ.get("PATH", ""), str(Path(shutil.which("node") or "").parent))
                           if part)
    return {"CODEX_HOME": str(home), "PROXY_TEST_KEY": "sk-test", "PATH": path, "HOME": str(home),
            "NO_COLOR": "1", "RUST_LOG": "error"}


def openai_codex_home(home: Path, base_url: str, extra_config: str = "") -> dict[str, str]:
    """A CODEX_HOME on Codex's built-in OpenAI provider pointed at the proxy, and the environment to run codex in.

    Only the built-in provider (name "OpenAI") gets remote compaction (`compaction_trigger`); a custom
    [model_providers.x] compacts with an inline prompt. `openai_base_url` in config.toml moves it (the
    OPENAI_BASE_URL variable does not: codex 0.171.0 then goes to api.openai.com). `codex exec` sends no
    Authorization with OPENAI_API_KEY alone; CODEX_API_KEY is its key (as `codex login --with-api-key` is)."""
    env = codex_home(home, base_url)
    (home / "config.toml").write_text(
        f'model = "fake-codex"\nopenai_base_url = "{base_url}/v1"\n{extra_config}', encoding="utf-8")
    del env["PROXY_TEST_KEY"]
    return {**env, "CODEX_API_KEY": "sk-test"}


async def codex_exec(binary: Path, env: dict[str, str], workdir: Path, prompt: str, timeout: float) -> CodexRun:
    loop = asyncio.get_running_loop()
    started = loop.time()
    process = await asyncio.create_subprocess_exec(
        str(binary), "exec", "--skip-git-repo-check", "-C", str(workdir), prompt, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
    assert process.returncode is not None
    return CodexRun(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                    loop.time() - started)
