"""Child processes of the benchmark: start on free 127.0.0.1 ports, wait until ready, read CPU and RSS, stop."""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from tests.ports import said_port

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BENCH_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
PR_SET_PDEATHSIG = 1


class StartFailed(RuntimeError):
    """A child did not become ready; the message ends with its log."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self, tail: int = 4000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-tail:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None


def raise_open_files() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit; children inherit it (1,000 streams need 2,000+ descriptors)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# glibc's malloc gives a freed buffer's memory back to the system once enough of it is free at the heap's top, and
# maps a large one afresh each time: a process with a small heap (the floor) then takes a different number of page
# faults on each half-megabyte body, from a few to hundreds, and its CPU on the same request moves from 0.5 to 1.3
# ms with them. Both thresholds fixed (and high) for every child keep that noise out of every column alike.
STEADY_MALLOC = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432"


def bench_env(**extra: str) -> dict[str, str]:
    """This environment without what would change a proxy's config behind the benchmark's back, with glibc's
    malloc steady (STEADY_MALLOC) unless GLIBC_TUNABLES is set already."""
    dropped = ("OPENAI_API_KEY", "COMPACTION_THRESHOLD", "PROXY_API_KEYS", "PROMETHEUS_MULTIPROC_DIR", "PYTHONPATH")
    kept = {key: value for key, value in os.environ.items() if key not in dropped}
    return {"GLIBC_TUNABLES": STEADY_MALLOC, **kept, **extra}


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies (killed by a timeout, say), so nothing lingers."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: children are still stopped on every normal exit


def spawn(name: str, argv: Sequence[str], *, cwd: Path, log: Path, stdin: int = subprocess.DEVNULL,
          stdout: int | None = None) -> Child:
    with log.open("wb") as log_file:
        process = subprocess.Popen(list(argv), cwd=cwd, env=bench_env(), stdin=stdin,
                                   stdout=log_file if stdout is None else stdout,
                                   stderr=log_file if stdout is not None else subprocess.STDOUT,
                                   preexec_fn=die_with_parent)
    return Child(name, process, log)


def wait_until(child: Child, ready: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise StartFailed(f"{child.name} exited with {child.process.returncode}:\n{child.output()}")
        if ready():
            return
        time.sleep(0.05)
    raise StartFailed(f"{child.name} was not ready within {timeout:g} s:\n{child.output()}")


def answers(url: str) -> bool:
    """True when a GET of `url` returns 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start_upstream(directory: Path) -> tuple[Child, int]:
    """The fake upstream (bench.fast_upstream) on a port it picks; returns it and the port."""
    ready = directory / "upstream.port"
    argv = [sys.executable, "-m", "bench.fast_upstream", "--port", "0", "--ready-file", str(ready)]
    child = spawn("fake upstream", argv, cwd=BENCH_ROOT, log=directory / "upstream.log")
    wait_until(child, ready.exists)
    return child, int(ready.read_text())


def serve_child(app: web.Application, port: int, ready_file: Path) -> None:
    """A benchmark child's main (the fake upstream, the floor): serve `app` on 127.0.0.1:`port` until SIGINT or
    SIGTERM, writing the bound port into `ready_file` once it listens; on uvloop when it is installed, as
    `python -m proxy` serves by default."""
    raise_open_files()
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve_until_stopped(app, port, ready_file))
    else:
        uvloop.run(_serve_until_stopped(app, port, ready_file))


async def _serve_until_stopped(app: web.Application, port: int, ready_file: Path) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    partial = ready_file.with_suffix(".tmp")
    partial.write_text(str(runner.addresses[0][1]))
    os.replace(partial, ready_file)  # the port appears whole or not at all
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def start_floor(directory: Path, upstream_port: int) -> tuple[Child, int]:
    """The minimal aiohttp reverse proxy (bench.floor) in front of the fake upstream; returns it and its port."""
    ready = directory / "floor.port"
    argv = [sys.executable, "-m", "bench.floor", "--upstream", f"http://127.0.0.1:{upstream_port}", "--port", "0",
            "--ready-file", str(ready)]
    child = spawn("floor", argv, cwd=BENCH_ROOT, log=directory / "floor.log")
    wait_until(child, ready.exists)
    return child, int(ready.read_text())


def start_proxy(name: str, root: Path, config: Path, log: Path) -> Child:
    """`python -m proxy` with cwd = root, so that root's `proxy` package is the one imported (not yet ready)."""
    return spawn(name, [sys.executable, "-m", "proxy", "--config", str(config)], cwd=root, log=log)


def wait_proxy(child: Child, timeout: float = START_TIMEOUT) -> int:
    """The port of a proxy started with `server.port: 0`, read from its start-up line, once /healthz answers there.

    A port picked beforehand (tests.ports.free_port) and handed to the proxy is bound a second later: any other
    process may take it first. With test suites running side by side, one proxy of the bench could not bind its
    port, another suite's proxy answered /healthz on it, and the bench's requests met a closed port."""
    wait_until(child, lambda: said_port(child.log) is not None, timeout)
    port = said_port(child.log)
    assert port is not None, "a port once said stays in the log"
    wait_until(child, lambda: answers(f"http://127.0.0.1:{port}/healthz"), timeout)
    return port


def stop(child: Child) -> None:
    """SIGTERM, then SIGKILL if it has not exited within STOP_TIMEOUT."""
    if not child.alive():
        return
    child.process.send_signal(signal.SIGTERM)
    try:
        child.process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.process.kill()
        child.process.wait(STOP_TIMEOUT)


def children_of(pid: int) -> list[int]:
    """Every live descendant of `pid`."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _stats(pid: int, with_children: bool) -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields after its command in /proc/PID/stat) for `pid` and, with children, its live descendants."""
    for each in [pid, *(children_of(pid) if with_children else [])]:
        try:
            yield each, Path(f"/proc/{each}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue


def cpu_seconds(pid: int, *, with_children: bool = True) -> float:
    """utime + stime of `pid` (and its live and reaped children) from /proc/PID/stat, in seconds."""
    total = 0
    for each, fields in _stats(pid, with_children):
        # After the command: state is field 3, so utime (14), stime (15), cutime (16), cstime (17) sit at 11..14.
        total += int(fields[11]) + int(fields[12])
        if each == pid and with_children:
            total += int(fields[13]) + int(fields[14])
    return total / CLOCK_TICKS


def minor_faults(pid: int, *, with_children: bool = True) -> int:
    """Minor page faults of `pid` (and its live and reaped children) from /proc/PID/stat: pages the kernel had to map
    (and zero) for it, as when a freed buffer's memory went back to the system and is taken again."""
    total = 0
    for each, fields in _stats(pid, with_children):
        # After the command: minflt (field 10) and cminflt (11) sit at 7 and 8.
        total += int(fields[7]) + (int(fields[8]) if each == pid and with_children else 0)
    return total


def rss_bytes(pid: int, *, with_children: bool = True) -> int:
    """VmRSS of `pid` (and its live children) from /proc/PID/status, in bytes."""
    total = 0
    for each in [pid, *(children_of(pid) if with_children else [])]:
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
