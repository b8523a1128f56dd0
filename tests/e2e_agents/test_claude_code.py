"""`claude -p` (Claude Code, the pinned npm build) through the proxy: a multi-step shell task past a small window
finishes, every request it sends valid; without compaction Claude Code runs out of room in the model's window.

What claude 2.1.332 sends (found by running it against a fake on 127.0.0.1; see claude_cli.py for the env):
- only POST /v1/messages?beta=true, streamed (`stream: true`), `anthropic-beta: claude-code-20250219,
  interleaved-thinking-2025-05-14,context-management-2025-06-27,...`, x-api-key; no count_tokens in print mode;
- `system`: three text blocks (a billing header line, the Agent SDK line, ~6,800 characters of instructions, the last
  two cache_control ephemeral); 12 tools, its shell tool "Bash" with {"command", "description", "timeout", ...};
  `thinking: {"type": "adaptive", "display": "omitted"}`, `context_management` (clear_thinking, keep all),
  `output_config.effort`; its instructions and tools are ~13,000 tokens of every request (the fake's count);
- its first request also tries the `mid-conversation-tool-changes-2026-07-01` beta with a `role: "system"` message
  after the user's; refused (400, as the fake does), it sends the same turn again with that text in the user message."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.e2e_agents.claude_cli import CLAUDE_BIN, CLAUDE_VERSION, claude_binary, claude_env, claude_print
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel

pytestmark = pytest.mark.agent_cli

ROUNDS = 8
MAX_OUTPUT = 4096  # CLAUDE_CODE_MAX_OUTPUT_TOKENS: the max_tokens of every request, within the window too
WINDOW = 32_000  # Claude Code's own system prompt and tools are ~13,000 tokens; a round of seq ~4,000 more
TASK = "Count to a few thousand with seq, several times, and tell me when you are done."
SYSTEM_ROLE = "messages.1.role: Input should be 'user' or 'assistant'"


@pytest.fixture
def model(fake: FakeUpstream) -> MessagesModel:
    messages = MessagesModel(window=WINDOW, parallel_calls=1, tool="Bash", finish_after=ROUNDS, thinks=False,
                             input=lambda turn, n: {"command": f"seq {turn} {turn + 1500}", "description": "count"})
    fake.messages_hook = messages
    fake.count_tokens = False  # a count_tokens the upstream lacks: the proxy answers it from its estimate
    fake.chat_hook = WindowedModel(window=32_768)  # the summariser's model, on chat completions
    return messages


def is_system_role_probe(body: dict[str, Any]) -> bool:
    """Claude Code's first try of a turn: a `role: "system"` message, which the fake (as a server without the
    mid-conversation beta) refuses."""
    return any(message.get("role") == "system" for message in body["messages"])


async def metric_total(proxy_url: str, *labels: str) -> float:
    """The sum of the counters (`_total` lines) whose labels include every one of `labels`."""
    async with aiohttp.ClientSession() as session, session.get(f"{proxy_url}/metrics") as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if not line.startswith("#") and "_total" in line and all(label in line for label in labels))


async def counted_by_proxy(proxy_url: str) -> float:
    return await metric_total(proxy_url, 'route="messages_count_tokens"')


@pytest.mark.parametrize(("compaction", "thinking"), [(True, True), (True, False), (False, True)],
                         ids=["through-the-proxy", "through-the-proxy-thinking-off", "forwarded-untouched"])
async def test_claude_code_finishes_a_task_past_the_window(compaction: bool, thinking: bool, model: MessagesModel,
                                                           fake: FakeUpstream, make_proxy: ProxyFactory,
                                                           tmp_path: Path) -> None:
    """As users run it (thinking on: signed thinking blocks, and a `clear_thinking` edit keeping all of them on
    every request, which changes nothing and so leaves the compacting to the proxy), and with thinking off."""
    binary = claude_binary()
    model.thinks = thinking
    proxy = await make_proxy({"models": {"default": {"context_window": WINDOW}},
                              "compaction": {"enabled": compaction}})
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = await claude_print(binary, claude_env(tmp_path / "claude-home", proxy.url, MAX_OUTPUT, thinking=thinking),
                             workdir, TASK, timeout=100)
    assert not run.timed_out, (run.stdout[-2000:], run.stderr[-2000:])
    turns = [body for body in model.received if not is_system_role_probe(body)]
    rounds = sum(1 for body in turns if any(block.get("type") == "tool_result" for block in
                                            (body["messages"][-1].get("content") or []) if isinstance(block, dict)))
    if not compaction:  # the control: the same task dies where the history passes the window
        assert max(model.prompts) + MAX_OUTPUT > WINDOW, model.prompts
        assert run.returncode != 0 or "prompt is too long" in (run.stdout + run.stderr).lower(), run.stdout[-2000:]
        assert f"Done after {ROUNDS} rounds." not in run.stdout
        print(f"control: rc {run.returncode} in {run.seconds:.1f}s, prompts {model.prompts}: {run.stdout.strip()!r}")
        return
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert f"Done after {ROUNDS} rounds." in run.stdout
    assert rounds >= ROUNDS
    assert max(prompt for body, prompt in zip(model.received, model.prompts, strict=True)
               if not is_system_role_probe(body)) + MAX_OUTPUT <= WINDOW, model.prompts
    problems = [model.problem(body) for body in model.received]
    assert all(problem is None or (problem == SYSTEM_ROLE and is_system_role_probe(body))
               for problem, body in zip(problems, model.received, strict=True)), problems
    assert all(body.get("stream") is True and body["tools"] and re.search("Claude", str(body["system"]))
               for body in turns)  # streamed, its tools and instructions kept
    # Claude Code's context management (with thinking on: clear_thinking, keeping all) is the proxy's to apply in
    # front of a server without it: read, honoured, never forwarded.
    assert not any("context_management" in body for body in turns)
    if thinking:  # its thinking came back signed as the model wrote it (model.problem checks the latest turn's)
        assert await metric_total(proxy.url, 'edit="clear_thinking_20251015"', 'outcome="keeps_all"') >= len(turns)
        assert any(block.get("type") == "thinking" for body in turns for message in body["messages"]
                   if isinstance(message.get("content"), list) for block in message["content"])
    else:
        assert not any("thinking" in body for body in turns)
    assert fake.chat_requests(), "the proxy never asked its summariser"
    print(f"claude: {run.seconds:.1f}s, {len(model.received)} requests, prompts {model.prompts}, "
          f"{len(fake.chat_requests())} summaries, paths {sorted({r.path for r in fake.requests})}")
    count_calls = [r for r in fake.requests if r.path.endswith("/messages/count_tokens")]
    if count_calls:  # not in print mode with 2.1.332; if it starts to, the proxy must be the one answering
        assert await counted_by_proxy(proxy.url) >= len(count_calls)


def test_the_pinned_claude_is_the_one_installed() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"@anthropic-ai/claude-code@{CLAUDE_VERSION} &&" in readme  # with Codex, in the one npm command
    binary = claude_binary()
    package = binary.resolve().parents[1] / "package.json"
    assert f'"version": "{CLAUDE_VERSION}"' in package.read_text(encoding="utf-8") or binary != CLAUDE_BIN
