"""The real program as a child process (`python -m proxy`), its log in a file, every wait bounded."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.ports import free_port, said_port


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without what would change the proxy's config or metrics behind the test's back."""
    dropped = ("OPENAI_API_KEY", "COMPACTION_THRESHOLD", "PROXY_API_KEYS", "PROMETHEUS_MULTIPROC_DIR")
    return {**{key: value for key, value in os.environ.items() if key not in dropped}, **extra}


# Each proxy of a test writes its own log, however many a test starts.
_STARTED = itertools.count()


@dataclass
class ProxyProcess:
    process: asyncio.subprocess.Process
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    async def wait_for_log(self, text: str, *, count: int = 1, timeout: float = 10) -> str:
        """Wait until `text` has appeared `count` times in the log; returns the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            output = self.output()
            if output.count(text) >= count:
                return output
            if self.process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        raise AssertionError(f"{text!r} did not appear {count} time(s) within {timeout} s:\n{self.output()}")

    async def wait_healthy(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                assert self.process.returncode is None, f"the proxy exited early:\n{self.output()}"
                try:
                    async with session.get(f"{self.base}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as answer:
                        if answer.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError(f"/healthz did not answer within {timeout} s:\n{self.output()}")

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    async def exit_code(self, timeout: float = 15) -> int:
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"the proxy did not exit within {timeout} s:\n{self.output()}") from None


@asynccontextmanager
async def proxy_process(tmp_path: Path, config: Path | None, *, args: Sequence[str] = (), port: int | None = None,
                        env: dict[str, str] | None = None, healthy: bool = True) -> AsyncIterator[ProxyProcess]:
    """Start the proxy; killed at the end if the test did not stop it. Without `port` it listens on port 0 and is
    found where its start-up line says it listens: a port picked beforehand can be taken by another process before
    the proxy binds it, and a proxy of a suite running beside this one would then answer this test. `--workers`
    needs a fixed port, and so does a proxy not waited for (`healthy` False): one free now is picked for them."""
    fixed = port or (free_port() if "--workers" in args or not healthy else None)
    log = tmp_path / f"proxy-{next(_STARTED)}.log"
    argv = [sys.executable, "-m", "proxy", "--port", str(fixed or 0), *args]
    if config is not None:
        argv += ["--config", str(config)]
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(*argv, cwd=tmp_path, env=env or clean_env(),
                                                       stdout=log_file, stderr=log_file)
    try:
        running = ProxyProcess(process, fixed or await listening_port(process, log), log)
        if healthy:
            await running.wait_healthy()
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def listening_port(process: asyncio.subprocess.Process, log: Path, timeout: float = 15) -> int:
    """The port a proxy started with `--port 0` says it listens on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (port := said_port(log)) is not None:
            return port
        assert process.returncode is None, f"the proxy exited early:\n{log.read_text(errors='replace')}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"the proxy did not say where it listens within {timeout} s:\n{log.read_text()}")


async def refused(base: str, timeout: float = 5) -> float:
    """Seconds until a new connection to `base` is refused (raises if it never is within `timeout`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            try:
                async with session.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=1)):
                    pass
            except aiohttp.ClientConnectorError:
                return time.monotonic() - started
            except (aiohttp.ClientError, TimeoutError):
                pass  # accepted, then closed: the listener was still there
        await asyncio.sleep(0.02)
    raise AssertionError(f"new connections to {base} were still accepted after {timeout} s")
