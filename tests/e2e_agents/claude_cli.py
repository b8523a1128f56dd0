"""Claude Code from npm, run as its users run it: a pinned version, `claude -p` with ANTHROPIC_BASE_URL at the proxy.

What claude 2.1.332 needs to run offline against 127.0.0.1 (found by running it against a fake there):
- ANTHROPIC_BASE_URL (no /v1: it posts to {base}/v1/messages?beta=true) and ANTHROPIC_API_KEY (sent as x-api-key);
- HOME and CLAUDE_CONFIG_DIR of its own, and DISABLE_TELEMETRY, DISABLE_ERROR_REPORTING, DISABLE_AUTOUPDATER,
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: then POST /v1/messages is the only request it makes (no models list,
  no count_tokens in print mode);
- `--allowedTools Bash` to run its shell tool without asking (`--dangerously-skip-permissions` is refused as root);
- CLAUDE_CODE_MAX_OUTPUT_TOKENS, or every request asks max_tokens 32000, which a small window cannot hold;
- with thinking on (its default) every request carries `thinking: {"type": "adaptive", ...}` and
  `context_management: {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}` — an edit that changes
  nothing, which the proxy compacts through; CLAUDE_CODE_DISABLE_THINKING=1 drops both.
A model name it does not know ("claude-fake") makes it assume a 1M-token window (a warning on stderr), so it never
compacts by itself: whatever keeps the conversation within a small window is the proxy."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# npm ships the native binary inside the package (bin/claude.exe, ~400 MB); installed next to codex, in one command,
# or npm prunes whichever of the two the .cache/npm/package.json does not list.
CLAUDE_VERSION = "2.1.332"
CLAUDE_BIN = ROOT / ".cache" / "npm" / "node_modules" / ".bin" / "claude"
MODEL = "claude-fake"


def claude_binary() -> Path:
    """The pinned claude; a missing one fails the test with the step that installs it."""
    binary = Path(os.environ.get("CLAUDE_BIN") or CLAUDE_BIN)
    if not binary.exists():
        raise AssertionError(f"claude is not installed at {binary}: run `npm install --prefix .cache/npm --no-audit "
                             f"--no-fund @openai/codex@0.171.0 @anthropic-ai/claude-code@{CLAUDE_VERSION}` "
                             "(both at once: npm prunes what the prefix's package.json does not list), "
                             "or set CLAUDE_BIN")
    return binary


@dataclass
class ClaudeRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


def claude_env(home: Path, base_url: str, max_output_tokens: int = 4096, *, thinking: bool = False) -> dict[str, str]:
    """The environment to run claude in: the proxy as its Anthropic API, a home of its own, nothing else called.
    `thinking` off (CLAUDE_CODE_DISABLE_THINKING): no `thinking` and no `context_management` in its requests."""
    config = home / ".claude"
    config.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(part for part in (os.environ.get("PATH", ""), str(Path(shutil.which("node") or "").parent))
                           if part)
    return {"PATH": path, "HOME": str(home), "CLAUDE_CONFIG_DIR": str(config), "NO_COLOR": "1",
            "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-test",
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens),
            **({} if thinking else {"CLAUDE_CODE_DISABLE_THINKING": "1"})}


async def claude_print(binary: Path, env: dict[str, str], workdir: Path, prompt: str, timeout: float) -> ClaudeRun:
    """`claude -p PROMPT` in workdir; past the timeout its whole process group (its shell commands too) is killed."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    process = await asyncio.create_subprocess_exec(
        str(binary), "-p", prompt, "--model", MODEL, "--allowedTools", "Bash", env=env, cwd=str(workdir),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True)
    timed_out = False
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        timed_out = True
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = await process.communicate()
    assert process.returncode is not None
    return ClaudeRun(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                     loop.time() - started, timed_out)
