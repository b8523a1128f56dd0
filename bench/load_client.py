"""The orchestrator's handle on the load generator process: send one command, wait (bounded) for its answer."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.processes import BENCH_ROOT, spawn, stop

ANSWER_GRACE = 60.0   # seconds an answer may take beyond the command's own max_seconds


class LoadFailed(RuntimeError):
    """The load generator crashed or did not answer in time."""


class LoadClient:
    def __init__(self, directory: Path) -> None:
        self.child = spawn("load generator", [sys.executable, "-m", "bench.load"], cwd=BENCH_ROOT,
                           log=directory / "load.log", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._next_index = 0

    def call(self, command: dict[str, Any]) -> dict[str, Any]:
        process = self.child.process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write((json.dumps(command) + "\n").encode())
        process.stdin.flush()
        timeout = float(command["max_seconds"]) + ANSWER_GRACE
        readable, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline() if readable else b""
        if not line:
            raise LoadFailed(f"no answer to {command['op']} within {timeout:g} s:\n{self.child.output()}")
        answer: dict[str, Any] = json.loads(line)
        if "crash" in answer:
            raise LoadFailed(f"the load generator crashed:\n{answer['crash']}")
        return answer

    def run(self, url: str, shape: str, concurrency: int, max_requests: int, max_seconds: float,
            expect: tuple[str, str] | None = None) -> dict[str, Any]:
        """One closed-loop run; its request bodies are numbered on from the last run's."""
        first, self._next_index = self._next_index, self._next_index + max_requests
        return self.call({"op": "run", "url": url, "shape": shape, "concurrency": concurrency,
                          "max_requests": max_requests, "max_seconds": max_seconds, "first_index": first,
                          "expect": list(expect) if expect else None})

    def hold(self, url: str, streams: int, max_seconds: float, pids: list[int]) -> dict[str, Any]:
        return self.call({"op": "hold", "url": url, "streams": streams, "max_seconds": max_seconds, "pids": pids})

    def close(self) -> None:
        if self.child.process.stdin is not None:
            self.child.process.stdin.close()
        stop(self.child)
