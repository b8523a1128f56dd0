"""The supervisor of `--workers N`: N serving processes on one port, signals forwarded, metrics shared."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from proxy.config import Settings
from proxy.metrics import MULTIPROCESS_DIR_VARIABLE

log = logging.getLogger(__name__)

# A worker that exits this soon after it started did not start (port taken, config gone): starting it again
# would fail the same way, so the supervisor stops instead of looping.
START_SECONDS = 5.0
# A worker's exit code for "the port could not be opened": it did not start however long it took to find out (an
# interpreter's imports alone take seconds on a busy machine), so the supervisor stops instead of starting another.
CANNOT_LISTEN = 69  # EX_UNAVAILABLE
RESPAWN_DELAY_SECONDS = 1.0
# Beyond the grace period, how long the workers get to cancel what is left and exit before they are killed.
EXIT_MARGIN_SECONDS = 10.0


def supervise(args: argparse.Namespace, settings: Settings) -> int:
    """Run `args.workers` workers until SIGTERM or SIGINT; 0 when every worker then exited cleanly."""
    port = args.port if args.port is not None else settings.server.port
    if port == 0:
        print("--workers needs a fixed port: with port 0 each worker would pick a different one", file=sys.stderr)
        return 1
    if settings.store.kind == "memory":
        log.warning("%d workers with store.kind memory: each keeps summaries of its own; redis shares them",
                    args.workers)
    metrics_dir, owned = _metrics_dir()
    try:
        return asyncio.run(Supervisor(args, port, metrics_dir, settings.server.shutdown_grace_seconds).run())
    finally:
        if owned:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _metrics_dir() -> tuple[Path, bool]:
    """The workers' shared metrics directory, and whether it is ours to delete at exit.

    An operator's PROMETHEUS_MULTIPROC_DIR is used, emptied of a previous run's values first (they would be
    summed with this run's); otherwise a private temporary directory.
    """
    given = os.environ.get(MULTIPROCESS_DIR_VARIABLE)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix="compaction-proxy-metrics-")), True


class Supervisor:
    def __init__(self, args: argparse.Namespace, port: int, metrics_dir: Path, grace: float) -> None:
        self._args = args
        self._port = port
        self._metrics_dir = metrics_dir
        self._grace = grace
        self._workers: dict[int, asyncio.subprocess.Process] = {}
        self._started: dict[int, float] = {}
        self._stopping = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        log.info("supervisor %d starting %d workers on port %d (metrics shared through %s)", os.getpid(),
                 self._args.workers, self._port, self._metrics_dir)
        for index in range(self._args.workers):
            await self._start(index)
        failed = await self._watch()
        return await self._stop_all() or failed

    async def _start(self, index: int) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", *self._worker_argv(index),
            env={**os.environ, MULTIPROCESS_DIR_VARIABLE: str(self._metrics_dir)})
        self._workers[index], self._started[index] = process, time.monotonic()
        log.info("worker-%d started, pid %d", index, process.pid)

    def _worker_argv(self, index: int) -> list[str]:
        argv = ["--port", str(self._port), "--worker-index", str(index), "--supervisor-pid", str(os.getpid())]
        if self._args.config is not None:
            argv += ["--config", str(self._args.config)]
        if self._args.host is not None:
            argv += ["--host", self._args.host]
        return argv

    async def _watch(self) -> int:
        """Restart workers that die, until asked to stop; 1 if a worker could not start (then stop them all)."""
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                exits = {asyncio.create_task(process.wait()): index for index, process in self._workers.items()}
                done, _ = await asyncio.wait([stopping, *exits], return_when=asyncio.FIRST_COMPLETED)
                for task in exits:
                    task.cancel()
                for task in done & exits.keys():
                    if self._stopping.is_set():
                        break
                    if not await self._replace(exits[task]):
                        return 1
            return 0
        finally:
            stopping.cancel()

    async def _replace(self, index: int) -> bool:
        process = self._workers[index]
        self._forget(process)
        lived = time.monotonic() - self._started[index]
        if lived < START_SECONDS or process.returncode == CANNOT_LISTEN:
            log.error("worker-%d (pid %d) exited with %s %.1f s after it started: stopping", index, process.pid,
                      process.returncode, lived)
            return False
        log.error("worker-%d (pid %d) exited with %s; starting a new one", index, process.pid, process.returncode)
        await asyncio.sleep(RESPAWN_DELAY_SECONDS)
        await self._start(index)
        return True

    def _forget(self, process: asyncio.subprocess.Process) -> None:
        """A dead worker's live gauges (open streams) stop counting; its counters stay in the sums."""
        mark_process_dead(process.pid, str(self._metrics_dir))  # type: ignore[no-untyped-call]

    def _forward(self, signum: signal.Signals) -> None:
        for process in self._workers.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # it exited since
                    process.send_signal(signum)

    async def _stop_all(self) -> int:
        """SIGTERM to every worker, which drains; 0 when all exited 0 in time."""
        log.info("supervisor stopping %d workers", len(self._workers))
        self._forward(signal.SIGTERM)
        # aiohttp gives handlers the grace period to finish, then as long again to end once cancelled.
        deadline = time.monotonic() + self._grace * 2 + EXIT_MARGIN_SECONDS
        failed = False
        for index, process in self._workers.items():
            try:
                code = await asyncio.wait_for(process.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                log.error("worker-%d (pid %d) did not exit in time: killed", index, process.pid)
                process.kill()
                code = await process.wait()
            failed |= code != 0
            self._forget(process)
        log.info("supervisor stopped")
        return 1 if failed else 0
