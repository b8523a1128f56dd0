"""`codex exec` (the pinned npm build) through the proxy: a multi-step shell task past a small window finishes,
every request it sends valid; without compaction Codex runs out of room in the model's context window."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.e2e_agents.codex_cli import CODEX_BIN, CODEX_VERSION, ROOT, codex_binary, codex_exec, codex_home
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.windowed import WindowedModel

pytestmark = pytest.mark.agent_cli

ROUNDS = 8
WINDOW = 20_000  # Codex's own instructions and tools are ~10,000 tokens of every request
TASK = "Count to a few thousand with seq, several times, and tell me when you are done."


@pytest.fixture
def model(fake: FakeUpstream) -> ResponsesModel:
    responses = ResponsesModel(window=WINDOW, parallel_calls=1, tool="exec_command", finish_after=ROUNDS,
                               arguments=lambda turn, n: json.dumps({"cmd": f"seq {turn} {turn + 1500}"}))
    fake.responses_hook = responses
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return responses


def outputs_answer_their_calls(body: dict[str, Any]) -> bool:
    called: set[str] = set()
    for item in body["input"]:
        if item.get("type") == "function_call":
            called.add(item["call_id"])
        elif item.get("type") == "function_call_output" and item["call_id"] not in called:
            return False
    return True


@pytest.mark.parametrize("compaction", [True, False], ids=["through-the-proxy", "forwarded-untouched"])
async def test_codex_exec_finishes_a_task_past_the_window(compaction: bool, model: ResponsesModel,
                                                          make_proxy: ProxyFactory, tmp_path: Path) -> None:
    binary = codex_binary()
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "compaction": {"enabled": compaction}})
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = await codex_exec(binary, codex_home(tmp_path / "codex-home", proxy.url), workdir, TASK, timeout=300)
    rounds = sum(1 for body in model.received if body["input"][-1].get("type") == "function_call_output")
    if not compaction:  # the control: the same task dies where the history passes the window
        assert run.returncode != 0 and max(model.prompts) > WINDOW, run.stdout[-2000:]
        assert "context window" in (run.stdout + run.stderr).lower()
        return
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"Done after {ROUNDS} rounds." in run.stdout
    assert rounds >= ROUNDS and max(model.prompts) <= WINDOW
    assert all(outputs_answer_their_calls(body) for body in model.received)
    assert all(body["input"][0].get("role") == "developer" for body in model.received)  # its instructions kept


def test_the_pinned_codex_is_the_one_the_readme_installs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"npm install --prefix .cache/npm --no-audit --no-fund @openai/codex@{CODEX_VERSION}" in readme
    assert codex_binary() == CODEX_BIN or "CODEX_BIN" in os.environ
