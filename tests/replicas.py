"""Proxy replicas as real processes (`python -m proxy --config F --port P`): started, probed, killed, stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.ports import said_port

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_SECONDS = 20.0  # interpreter start, imports and the tiktoken encoding, on two shared cores
STOP_TIMEOUT_SECONDS = 5.0
# Variables that would change what a replica does behind the config file's back.
_HIDDEN_VARIABLES = ("OPENAI_API_KEY", "COMPACTION_THRESHOLD", "PROXY_API_KEYS")


class ProxyProcess:
    """One proxy replica in its own process; its stdout and stderr go to `<name>.log` in `directory`."""

    def __init__(self, name: str, directory: Path, config: dict[str, Any]) -> None:
        self.name = name
        self.directory = directory
        self.config_path = directory / f"{name}.yaml"
        self.log_path = directory / f"{name}.log"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    async def start(self) -> None:
        """Start on port 0 and return once /healthz answers on the port the replica says it took (a port picked
        beforehand could be taken first, and another suite's proxy would answer for this replica)."""
        env = {key: value for key, value in os.environ.items() if key not in _HIDDEN_VARIABLES}
        said_from = self.log_path.stat().st_size if self.log_path.exists() else 0  # a restart appends to the log
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "proxy", "--config", str(self.config_path), "--port", "0"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        if not await self._healthy(said_from):
            self.kill()
            raise RuntimeError(f"replica {self.name} did not start:\n{self.log_text()[-4000:]}")

    async def _healthy(self, said_from: int) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        self.port = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline:
                if not self.running:
                    return False
                self.port = self.port or said_port(self.log_path, said_from) or 0
                try:
                    if self.port:
                        async with session.get(f"{self.url}/healthz") as response:
                            if response.status == 200:
                                return True
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        return False

    def kill(self) -> None:
        """Die as a crash does: SIGKILL, nothing released, nothing announced."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=10)

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_SECONDS; the exit code (None if it never ran)."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        return process.returncode


ReplicaFactory = Callable[[str, dict[str, Any]], Awaitable[ProxyProcess]]


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[ReplicaFactory]:
    """Start named replicas with a config each (a nested dict, as in YAML); all are stopped at the end."""
    started: list[ProxyProcess] = []

    async def start(name: str, config: dict[str, Any]) -> ProxyProcess:
        replica = ProxyProcess(name, tmp_path, config)
        started.append(replica)
        await replica.start()
        return replica

    yield start
    await asyncio.gather(*(replica.stop() for replica in started))
