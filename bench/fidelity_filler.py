"""Seeded filler for the fidelity benchmark: realistic tool rounds that carry no planted fact."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]

MODULES = ("models", "views", "tasks", "schema", "client", "cache", "audit", "export", "limits", "hooks")
PACKAGES = ("billing", "payments", "invoicing", "accounts", "reports", "ingest")
WORDS = ("amber", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "jasper", "krill", "lumen",
         "maple", "nickel", "onyx", "pylon", "quartz", "raven", "sable", "tundra", "umber", "vesper", "willow")
VERBS = ("load", "parse", "merge", "apply", "check", "split", "flush", "render", "record", "resolve")


def hex_id(rng: random.Random, length: int = 4) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(length))


def tool_call(call_id: str, name: str, arguments: dict[str, Any], note: str | None = None) -> Message:
    """An assistant turn calling one tool; `note` is what the agent says alongside the call."""
    return {"role": "assistant", "content": note,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def tool_result(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _python_excerpt(rng: random.Random, path: str) -> str:
    lines = [f"# {path}", "from __future__ import annotations", ""]
    for _ in range(rng.randint(2, 3)):
        name = f"{rng.choice(VERBS)}_{rng.choice(WORDS)}"
        arg = rng.choice(("rows", "batch", "entry", "payload", "items"))
        lines += [f"def {name}({arg}: list[dict]) -> int:",
                  f"    total = sum(item.get('{rng.choice(WORDS)}', 0) for item in {arg})",
                  f"    return total // {rng.randint(2, 9)}", ""]
    return "\n".join(lines)


def _test_log(rng: random.Random, package: str) -> str:
    count = rng.randint(3, 5)
    lines = ["============ test session starts ============", f"collected {count} items", ""]
    lines += [f"tests/{package}/test_{rng.choice(MODULES)}.py::test_{rng.choice(VERBS)}_{rng.choice(WORDS)} PASSED"
              for _ in range(count)]
    lines.append(f"============ {count} passed in {rng.randint(1, 9)}.{rng.randint(10, 99)}s ============")
    return "\n".join(lines)


def _grep_output(rng: random.Random, package: str) -> str:
    symbol = f"{rng.choice(VERBS)}_{rng.choice(WORDS)}"
    return "\n".join(f"src/{package}/{rng.choice(MODULES)}.py:{rng.randint(10, 400)}:    {symbol}(batch)"
                     for _ in range(rng.randint(3, 4)))


def _git_status(rng: random.Random, package: str) -> str:
    changed = sorted({f"src/{package}/{rng.choice(MODULES)}.py" for _ in range(3)})
    return "On branch fix/reconcile\nChanges not staged for commit:\n" + \
        "\n".join(f"  modified:   {path}" for path in changed)


def filler_round(rng: random.Random, call_id: str) -> list[Message]:
    """One tool call and its result, about 80-150 tokens, chosen and worded by `rng`."""
    package = rng.choice(PACKAGES)
    kind = rng.randrange(4)
    if kind == 0:
        path = f"src/{package}/{rng.choice(MODULES)}.py"
        return [tool_call(call_id, "read_file", {"path": path}, f"Let me look at {path}."),
                tool_result(call_id, _python_excerpt(rng, path))]
    if kind == 1:
        command = f"pytest tests/{package} -q"
        return [tool_call(call_id, "run_command", {"command": command}, "Checking the neighbouring tests still pass."),
                tool_result(call_id, _test_log(rng, package))]
    if kind == 2:
        pattern = f"{rng.choice(VERBS)}_"
        return [tool_call(call_id, "run_command", {"command": f"grep -rn '{pattern}' src/{package}"},
                          "Searching for the other callers."),
                tool_result(call_id, _grep_output(rng, package))]
    return [tool_call(call_id, "run_command", {"command": "git status"}, "Checking what has changed so far."),
            tool_result(call_id, _git_status(rng, package))]


def padded(messages: list[Message], rng: random.Random, tokens: int, count: Callable[[str], int]) -> list[Message]:
    """`messages` with each tool result grown to about `tokens` tokens by build-log lines after what it says (a
    coding agent's tool output is mostly such noise around the line that matters); 0 leaves them as they are. The
    lines carry no number above 1999, so none can pass for a planted value. A settings file (every line KEY=VALUE)
    is left as it is: reading one prints nothing else."""
    if tokens <= 0:
        return messages
    grown = []
    for message in messages:
        settings = all("=" in line for line in str(message.get("content")).splitlines() if line.strip())
        if message.get("role") == "tool" and not settings and (have := count(str(message["content"]))) < tokens:
            lines = [str(message["content"]), "--- build log ---"]
            while have < tokens:
                lines.append(f"[{rng.randint(0, 999):03d}] {rng.choice(VERBS)} {rng.choice(WORDS)}/"
                             f"{rng.choice(MODULES)}.py:{rng.randint(1, 1999)} ok ({rng.randint(1, 999)} ms)")
                have = count("\n".join(lines))
            message = {**message, "content": "\n".join(lines)}
        grown.append(message)
    return grown
