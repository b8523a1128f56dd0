"""A bounded soak: the real proxy in its own process under mixed, partly hostile load, its health and resources watched.

Usage: python bench/soak.py [--seconds 120] [--seed 1]

Everything runs on 127.0.0.1: a fake upstream (window-enforcing chat model and summariser, reasoning-first and slow
streams) in this process, the proxy as `python -m proxy --config FILE`, and a /healthz prober in a third process so
its latencies are the proxy's, not this busy driver's. Load: streaming and non-streaming chat conversations that
grow until they compact, pass-through `/v1/models`, reasoning-first streams, clients that drop mid-stream,
slowloris clients (half a request head, or a head and a trickle of body) and gzip bombs. Afterwards it checks that
descriptors return to baseline, RSS stays flat, /healthz p99 stays under 50 ms, and every request got the answer
its kind should get; it prints the figures and exits 1 when an invariant fails. The proxy's CPU run and run-queue
wait times (/proc/PID/schedstat) are printed too: where neighbours starve the proxy of a CPU, the latency there
is the machine's and is reported, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.config import ServerConfig
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp, chunk, sse
from tests.fakes.windowed import WindowedModel

MAX_SECONDS = 600
WINDOW = 8192
MIB = 1024 * 1024
# Short server limits so slow clients are dropped within the run; a key missing from ServerConfig is skipped.
SERVER_LIMITS: dict[str, float | int] = {"max_body_bytes": MIB, "header_timeout": 1.0, "body_timeout": 2.0,
                                         "keepalive_timeout": 2.0}
# A small store bound, so the store is full within the first third and its growth does not read as a leak.
STORE = {"kind": "memory", "max_entries": 100, "max_bytes": MIB}
BOMB_INFLATED_BYTES = 256 * MIB                 # 256x server.max_body_bytes, about 250 KiB on the wire
REASONING_MODEL = "soak-reasoning"
SLOW_MODEL = "soak-slow"
SLOW_CHUNKS, SLOW_CHUNK_DELAY = 100, 0.02
HEALTH_PERIOD = 0.1
HEALTH_P99_LIMIT_MS = 50.0
IDLE_PROBE_SECONDS = 3.0
# A third of the run in which the proxy was runnable but waiting for a CPU more than this share of the time
# (neighbours on a shared machine) has its /healthz p99 reported, not judged: the figure is the machine's.
STARVED_SHARE = 0.25
# Descriptors the proxy may hold beyond its idle baseline once the load is gone (a pooled upstream connection that
# discovery or a late request reopened, say); a leak grows with the load, far past this.
FD_MARGIN = 3
# RSS may end this much above where it stood in the first third: CPython keeps freed arenas and the allocator's
# high-water mark moves with the largest burst of concurrent bodies, but a leak grows with the request count.
RSS_GROWTH_LIMIT = 0.10
RSS_FLOOR_KIB = 4 * 1024
SETTLE_SECONDS = 15.0
SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}
# Workers per kind: kept modest, the machine is shared and the point is a steady mix, not a flood.
WORKERS = {"chat-json": 3, "chat-stream": 3, "reasoning": 2, "models": 2, "disconnect": 2, "slowloris-head": 3,
           "slowloris-body": 1, "gzip-bomb": 2}
EXPECTED = {"chat-json": {"200"}, "chat-stream": {"200"}, "reasoning": {"200"}, "models": {"200"},
            "disconnect": {"cut"}, "slowloris-head": {"closed", "408"}, "slowloris-body": {"closed", "408"},
            "gzip-bomb": {"413"}}

PROBE_SCRIPT = r'''
import http.client, json, sys, time
host, port, seconds, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
samples, connection = [], None
for tick in range(int(seconds / period)):
    time.sleep(max(0.0, start + tick * period - time.monotonic()))
    began = time.monotonic()
    try:
        connection = connection or http.client.HTTPConnection(host, port, timeout=5)
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        response.read()
        samples.append([began - start, (time.monotonic() - began) * 1000, response.status])
    except Exception as error:
        samples.append([began - start, None, type(error).__name__])
        connection = None
json.dump(samples, sys.stdout)
'''


# --- the fake upstream ---------------------------------------------------------------------------------------

@dataclass
class LightWindowedModel(WindowedModel):
    """The window-enforcing fake, counting a prompt by its JSON length (about 3 characters a token).

    The driver shares two cores with the proxy: tiktoken on every body would take one of them, and the proxy's
    latency would then measure the driver. The proxy calibrates to whatever the upstream's usage says.
    """

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return math.ceil(len(json.dumps(body.get("messages"))) / 3)


@dataclass
class Upstream:
    """The fake's state plus what the soak wants to know of it afterwards."""

    state: FakeUpstream = field(default_factory=FakeUpstream)
    model: WindowedModel = field(default_factory=lambda: LightWindowedModel(window=WINDOW))
    summaries: int = 0
    slow_started: int = 0
    slow_finished: int = 0
    slow_abandoned: int = 0
    url: str = ""

    def forget(self) -> None:
        """Drop the bodies the fakes record, so the driver's memory stays flat over a long run."""
        self.summaries += sum(1 for received in self.model.received if received.summarizer)
        self.model.received.clear()
        self.state.requests.clear()


def is_summary_call(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and messages[0].get("role") == "system" and "<analysis>" in str(messages[0].get("content"))


async def write_chunks(request: web.Request, body: dict[str, Any], deltas: list[dict[str, Any]],
                       delay: float) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for delta in deltas:
        await response.write(sse(chunk(body, delta)))
        if delay:
            await asyncio.sleep(delay)
    await response.write(sse(chunk(body, {}, "stop")) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def reasoning_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """A reasoning model: the first delta carries reasoning_content only, the answer follows."""
    thoughts = [{"role": "assistant", "reasoning_content": "Let me think."},
                *({"reasoning_content": f" step {index}."} for index in range(3))]
    return await write_chunks(request, body, [*thoughts, {"content": "Done thinking."}], 0.0)


async def slow_stream(request: web.Request, body: dict[str, Any], upstream: Upstream) -> web.StreamResponse:
    """A long trickle the client abandons; the proxy must notice and let go of it."""
    upstream.slow_started += 1
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    try:
        await response.write(sse(chunk(body, {"role": "assistant", "content": ""})))
        for index in range(SLOW_CHUNKS):
            await asyncio.sleep(SLOW_CHUNK_DELAY)
            await response.write(sse(chunk(body, {"content": f"w{index} "})))
        await response.write(sse(chunk(body, {}, "stop")) + b"data: [DONE]\n\n")
    except ConnectionError:
        upstream.slow_abandoned += 1   # the proxy let go: what it should do once its client has left
        return response
    except asyncio.CancelledError:
        upstream.slow_abandoned += 1
        raise
    upstream.slow_finished += 1
    return response


def chat_hook(upstream: Upstream) -> Callable[..., Awaitable[web.StreamResponse]]:
    async def hook(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        if body.get("stream") and not is_summary_call(body):
            if body.get("model") == REASONING_MODEL:
                return await reasoning_stream(request, body)
            if body.get("model") == SLOW_MODEL:
                return await slow_stream(request, body, upstream)
        return await upstream.model(request, body, state)
    return hook


async def serve_upstream(upstream: Upstream) -> web.AppRunner:
    upstream.state.chat_hook = chat_hook(upstream)
    # A short keep-alive: pooled proxy->upstream connections close soon after the load, so fds can settle.
    runner = web.AppRunner(FakeUpstreamApp(upstream.state).build(), access_log=None, keepalive_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return runner


# --- the proxy process ----------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_limits() -> tuple[dict[str, Any], list[str]]:
    """The short limits this proxy version knows, and the names of those it does not (reported, not sent)."""
    known = {name: value for name, value in SERVER_LIMITS.items() if name in ServerConfig.model_fields}
    return known, sorted(set(SERVER_LIMITS) - set(known))


def proxy_config(upstream_url: str, port: int, limits: dict[str, Any]) -> dict[str, Any]:
    return {"server": {"port": port, **limits}, "upstream": {"base_url": f"{upstream_url}/v1"},
            "models": {"default": {"context_window": WINDOW}},
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25},
            "store": STORE, "logging": {"level": "WARNING"}}


@dataclass
class ProxyProcess:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


async def start_proxy(upstream_url: str, workdir: Path, limits: dict[str, Any]) -> ProxyProcess:
    port = free_port()
    config = workdir / "soak.yaml"
    config.write_text(json.dumps(proxy_config(upstream_url, port, limits)))  # JSON is YAML
    log = workdir / "proxy.log"
    with log.open("wb") as stream:
        process = subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(config)], stdout=stream,
                                   stderr=subprocess.STDOUT, cwd=workdir)
    proxy = ProxyProcess(process, f"http://127.0.0.1:{port}", port, log)
    async with aiohttp.ClientSession() as session:
        for _ in range(150):
            if process.poll() is not None:
                break
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{proxy.url}/healthz") as response:
                    if response.status == 200:
                        return proxy
            await asyncio.sleep(0.1)
    proxy.stop()
    raise RuntimeError(f"the proxy did not start:\n{log.read_text()[-2000:]}")


def proc_status(pid: int) -> tuple[int, int, int]:
    """(VmRSS in KiB, open descriptors, threads) of a live process."""
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def cpu_times(pid: int) -> tuple[float, float]:
    """Seconds a process has run on a CPU, and seconds it was runnable but waited for one (/proc/PID/schedstat).

    The wait tells a proxy that is slow from one that is starved by its neighbours on a shared machine.
    """
    running, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(running) / 1e9, int(waiting) / 1e9


# --- the load -------------------------------------------------------------------------------------------------

@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    compaction: Counter[str] = field(default_factory=Counter)
    close_seconds: dict[str, list[float]] = field(default_factory=dict)

    def count(self, kind: str, outcome: str) -> None:
        self.requests[kind] += 1
        self.outcomes[(kind, outcome)] += 1


@dataclass
class Load:
    url: str
    session: aiohttp.ClientSession
    tally: Tally
    deadline: float
    rng: random.Random
    bomb: bytes

    def running(self) -> bool:
        return time.monotonic() < self.deadline


REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)


def user_turn(conversation: str, index: int) -> dict[str, Any]:
    filler = " ".join(f"word{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{conversation}-{index}. {filler}"}


def assistant_turn(conversation: str, index: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"Noted FACT-{conversation}-{index}. " + "ok " * 60}


async def chat(load: Load, kind: str, body: dict[str, Any]) -> None:
    """One chat request; a stream must end with [DONE], anything else is counted as what it was."""
    try:
        async with load.session.post(f"{load.url}/v1/chat/completions", json=body,
                                     timeout=REQUEST_TIMEOUT) as response:
            payload = await response.read()
            outcome = str(response.status)
            if response.status == 200 and body.get("stream") and not payload.rstrip().endswith(b"data: [DONE]"):
                outcome = "200-truncated"
            load.tally.compaction[response.headers.get("x-compaction", "-")] += 1
    except (aiohttp.ClientError, TimeoutError) as error:
        outcome = type(error).__name__
    load.tally.count(kind, outcome)


async def conversations(load: Load, worker: int, *, stream: bool) -> None:
    """Conversations that grow past the compaction threshold (30-70 turns of ~170 tokens), then start over."""
    kind = "chat-stream" if stream else "chat-json"
    number = 0
    while load.running():
        name, number = f"{kind}{worker}.{number}", number + 1
        history: list[dict[str, Any]] = [SYSTEM]
        for index in range(load.rng.randint(30, 70)):
            if not load.running():
                return
            history.append(user_turn(name, index))
            await chat(load, kind, {"model": "fake-small", "messages": history, "stream": stream})
            history.append(assistant_turn(name, index))
            await asyncio.sleep(load.rng.uniform(0.01, 0.05))


async def reasoning(load: Load, worker: int) -> None:
    while load.running():
        messages = [SYSTEM, user_turn(f"r{worker}", load.rng.randint(0, 9))]
        await chat(load, "reasoning", {"model": REASONING_MODEL, "messages": messages, "stream": True})
        await asyncio.sleep(load.rng.uniform(0.02, 0.08))


async def models(load: Load, worker: int) -> None:
    while load.running():
        try:
            async with load.session.get(f"{load.url}/v1/models", timeout=REQUEST_TIMEOUT) as response:
                await response.read()
                outcome = str(response.status)
        except (aiohttp.ClientError, TimeoutError) as error:
            outcome = type(error).__name__
        load.tally.count("models", outcome)
        await asyncio.sleep(load.rng.uniform(0.02, 0.08))


async def disconnect(load: Load, worker: int) -> None:
    """A streaming client that hangs up after a few events (or before the first)."""
    while load.running():
        body = {"model": SLOW_MODEL, "messages": [SYSTEM, user_turn(f"d{worker}", 0)], "stream": True}
        outcome = "cut"
        try:
            async with load.session.post(f"{load.url}/v1/chat/completions", json=body,
                                         timeout=REQUEST_TIMEOUT) as response:
                if response.status != 200:
                    outcome = str(response.status)
                for _ in range(load.rng.randint(0, 5)):
                    await response.content.readany()
                response.close()  # drops the connection mid-stream
        except (aiohttp.ClientError, TimeoutError) as error:
            outcome = type(error).__name__
        load.tally.count("disconnect", outcome)
        await asyncio.sleep(load.rng.uniform(0.05, 0.2))


async def wait_for_close(reader: asyncio.StreamReader, limit: float) -> tuple[str, float]:
    """How the server ended a stalled request: its status line, or 'closed', and after how long."""
    started = time.monotonic()
    try:
        data = await asyncio.wait_for(reader.read(65536), limit)
    except TimeoutError:
        return "still-open", time.monotonic() - started
    except ConnectionError:
        data = b""
    elapsed = time.monotonic() - started
    if data.startswith(b"HTTP/1."):
        return data.split(b" ", 2)[1].decode("ascii", "replace"), elapsed
    return "closed", elapsed


async def slowloris(load: Load, worker: int, *, body: bool) -> None:
    """Half a request head (or a whole head and a trickle of its body), then silence."""
    kind = "slowloris-body" if body else "slowloris-head"
    limit = 3 * float(SERVER_LIMITS["body_timeout" if body else "header_timeout"]) + 5
    host, port = load.url.removeprefix("http://").split(":")
    while load.running():
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError as error:
            load.tally.count(kind, type(error).__name__)
            await asyncio.sleep(0.5)
            continue
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        writer.write(head + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"model\": "
                     if body else head + b"Content-Type: appl")
        outcome, elapsed = await wait_for_close(reader, limit)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        load.tally.count(kind, outcome)
        load.tally.close_seconds.setdefault(kind, []).append(elapsed)


def gzip_bomb(inflated: int = BOMB_INFLATED_BYTES) -> bytes:
    """`inflated` zero bytes gzip-compressed a MiB at a time, so building it never holds more than a MiB."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    parts = [compressor.compress(zeros) for _ in range(inflated // MIB)]
    return b"".join([*parts, compressor.flush()])


async def gzip_bombs(load: Load, worker: int) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    while load.running():
        try:
            async with load.session.post(f"{load.url}/v1/chat/completions", data=load.bomb, headers=headers,
                                         timeout=REQUEST_TIMEOUT) as response:
                await response.read()
                outcome = str(response.status)
        except (aiohttp.ClientError, TimeoutError) as error:
            outcome = type(error).__name__
        load.tally.count("gzip-bomb", outcome)
        await asyncio.sleep(load.rng.uniform(0.1, 0.3))


def worker_tasks(load: Load) -> list[Awaitable[None]]:
    makers: dict[str, Callable[[Load, int], Awaitable[None]]] = {
        "chat-json": lambda load, n: conversations(load, n, stream=False),
        "chat-stream": lambda load, n: conversations(load, n, stream=True),
        "reasoning": reasoning, "models": models, "disconnect": disconnect,
        "slowloris-head": lambda load, n: slowloris(load, n, body=False),
        "slowloris-body": lambda load, n: slowloris(load, n, body=True),
        "gzip-bomb": gzip_bombs,
    }
    return [makers[kind](load, index) for kind, count in WORKERS.items() for index in range(count)]


# --- watching the proxy ---------------------------------------------------------------------------------------

@dataclass
class Samples:
    """Resource samples of the proxy: (seconds since load start, RSS KiB, fds, threads, CPU s, run-queue wait s)."""

    rows: list[tuple[float, int, int, int, float, float]] = field(default_factory=list)

    def share(self, column: int, lower: float = 0.0, upper: float = float("inf")) -> float:
        """How fast a time column grew between two offsets, per second of wall time (1.0: all the time)."""
        rows = [row for row in self.rows if lower <= row[0] <= upper]
        if len(rows) < 2 or rows[-1][0] <= rows[0][0]:
            return float("nan")
        return (rows[-1][column] - rows[0][column]) / (rows[-1][0] - rows[0][0])


async def sample_resources(pid: int, samples: Samples, started: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        rss, fds, threads = proc_status(pid)
        samples.rows.append((time.monotonic() - started, rss, fds, threads, *cpu_times(pid)))
        await asyncio.sleep(0.5)


async def probe_health(port: int, seconds: float) -> list[list[Any]]:
    """The prober's samples [offset, latency ms | None, status | error name], from its own process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE_SCRIPT, "127.0.0.1", str(port), str(seconds), str(HEALTH_PERIOD),
        stdout=asyncio.subprocess.PIPE)
    output, _ = await asyncio.wait_for(process.communicate(), seconds + 30)
    samples: list[list[Any]] = json.loads(output)
    return samples


async def settle_fds(pid: int, target: int, limit: float) -> tuple[int, float]:
    """Wait (at most `limit` seconds) for the proxy's descriptors to fall to `target`; the count and the wait."""
    started = time.monotonic()
    fds = proc_status(pid)[1]
    while fds > target and time.monotonic() - started < limit:
        await asyncio.sleep(0.25)
        fds = proc_status(pid)[1]
    return fds, time.monotonic() - started


# --- the report -----------------------------------------------------------------------------------------------

def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


@dataclass
class Report:
    seconds: float
    limits: dict[str, Any]
    missing_limits: list[str]
    tally: Tally
    health: list[list[Any]]
    samples: Samples
    fds_baseline: int
    fds_end: int
    settle_seconds: float
    threads: tuple[int, int]
    upstream: Upstream
    log_lines: list[str]
    alive: bool
    load: tuple[float, float] = (0.0, 0.0)
    idle_health: list[list[Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def latencies(self, lower: float = 0.0, upper: float = float("inf")) -> list[float]:
        return [row[1] for row in self.health if row[1] is not None and lower <= row[0] < upper]

    def thirds(self) -> list[tuple[float, float]]:
        third = self.seconds / 3
        return [(index * third, (index + 1) * third) for index in range(3)]

    def starved(self, lower: float, upper: float) -> bool:
        """Whether the proxy waited for a CPU so much that /healthz latency measured the machine, not the proxy."""
        return self.samples.share(5, lower, upper) > STARVED_SHARE

    def rss_thirds(self) -> tuple[float, float]:
        first, _, last = self.thirds()
        rows = self.samples.rows
        return (statistics.median(row[1] for row in rows if first[0] <= row[0] < first[1]),
                statistics.median(row[1] for row in rows if last[0] <= row[0] <= last[1]))


def check(report: Report) -> list[str]:
    """Every invariant that failed, in words."""
    failures = []
    for (kind, outcome), count in sorted(report.tally.outcomes.items()):
        if outcome not in EXPECTED[kind]:
            failures.append(f"{count} {kind} request(s) ended {outcome!r}, expected {sorted(EXPECTED[kind])}")
    for kind in EXPECTED:
        if not report.tally.requests[kind]:
            failures.append(f"no {kind} request completed")
    for kind, limit_name in (("slowloris-head", "header_timeout"), ("slowloris-body", "body_timeout")):
        limit = report.limits.get(limit_name)
        slowest = max(report.tally.close_seconds.get(kind, [0.0]))
        if limit is not None and slowest > limit + 1.5:
            failures.append(f"a {kind} client stayed connected {slowest:.1f}s (server.{limit_name} is {limit}s)")
    if not any(value not in ("-", "none", "failed") for value in report.tally.compaction):
        failures.append(f"no request compacted (x-compaction seen: {dict(report.tally.compaction)})")
    if report.tally.compaction["failed"]:
        failures.append(f"{report.tally.compaction['failed']} compaction(s) failed; the fake summariser never fails")
    errors = [row for row in report.health if row[1] is None or row[2] != 200]
    if errors:
        failures.append(f"{len(errors)} /healthz probe(s) failed: {Counter(str(row[2]) for row in errors)}")
    if len(report.health) < 0.8 * report.seconds / HEALTH_PERIOD:
        failures.append(f"only {len(report.health)} /healthz probes ran in {report.seconds:.0f}s")
    for lower, upper in report.thirds():
        p99 = percentile(report.latencies(lower, upper), 0.99)
        if not p99 < HEALTH_P99_LIMIT_MS and not report.starved(lower, upper):
            failures.append(f"/healthz p99 {p99:.1f} ms in [{lower:.0f}s, {upper:.0f}s) "
                            f"(limit {HEALTH_P99_LIMIT_MS} ms)")
    first, last = report.rss_thirds()
    if last > first * (1 + RSS_GROWTH_LIMIT) + RSS_FLOOR_KIB:
        failures.append(f"RSS grew from {first / 1024:.1f} MiB (first third) to {last / 1024:.1f} MiB (last third)")
    if report.fds_end > report.fds_baseline + FD_MARGIN:
        failures.append(f"{report.fds_end} descriptors open after {report.settle_seconds:.0f}s of quiet, "
                        f"{report.fds_baseline} at baseline")
    if report.upstream.slow_started != report.upstream.slow_finished + report.upstream.slow_abandoned:
        failures.append(f"upstream streams still open: {report.upstream.slow_started} started, "
                        f"{report.upstream.slow_finished} finished, {report.upstream.slow_abandoned} abandoned")
    if not report.alive:
        failures.append("the proxy process died")
    crashes = [line for line in report.log_lines if "Traceback" in line or "unhandled error" in line]
    if crashes:
        failures.append(f"{len(crashes)} crash line(s) in the proxy's log, first: {crashes[0][:200]}")
    return failures


def log_kinds(lines: list[str]) -> Counter[str]:
    """Log lines without their timestamps and numbers, so repeats of one message count together."""
    kinds: Counter[str] = Counter()
    for line in lines:
        words = line.split(" ", 2)
        text = words[2] if len(words) == 3 and words[0][:1].isdigit() else line
        kinds[re.sub(r"\d+(\.\d+)?", "N", text)[:160]] += 1
    return kinds


def render(report: Report) -> str:
    lines = [f"soak: {report.seconds:.0f}s against python -m proxy (limits {report.limits}"
             + (f"; not in this version: {report.missing_limits}" if report.missing_limits else "") + ")"]
    # The machine's load says how much of a latency figure is the proxy's and how much its neighbours'.
    lines.append(f"load average (1 min) at start {report.load[0]:.2f}, at end {report.load[1]:.2f} "
                 f"on {os.cpu_count()} CPUs")
    lines.append("requests by kind: " + ", ".join(f"{kind} {count}" for kind, count in report.tally.requests.items()))
    lines.append("outcomes: " + ", ".join(f"{kind}:{outcome} {count}"
                                          for (kind, outcome), count in sorted(report.tally.outcomes.items())))
    lines.append("x-compaction: " + ", ".join(f"{value} {count}" for value, count in report.tally.compaction.items())
                 + f"; summariser calls {report.upstream.summaries}")
    for kind, seconds in sorted(report.tally.close_seconds.items()):
        lines.append(f"{kind}: dropped after median {statistics.median(seconds):.2f}s, max {max(seconds):.2f}s")
    lines.append(f"slow upstream streams: {report.upstream.slow_started} started, {report.upstream.slow_abandoned} "
                 f"let go after the client left, {report.upstream.slow_finished} ran to the end")
    every = report.latencies()
    starved = [f"[{lo:.0f}s, {hi:.0f}s)" for lo, hi in report.thirds() if report.starved(lo, hi)]
    lines.append(f"/healthz: {len(report.health)} probes, p50 {percentile(every, 0.5):.2f} ms, "
                 f"p99 {percentile(every, 0.99):.2f} ms, max {max(every, default=float('nan')):.2f} ms; p99 by third: "
                 + ", ".join(f"{percentile(report.latencies(lo, hi), 0.99):.2f}" for lo, hi in report.thirds()))
    idle = [row[1] for row in report.idle_health if row[1] is not None]
    lines.append(f"/healthz on the idle proxy before the load (the machine's floor): {len(idle)} probes, "
                 f"p50 {percentile(idle, 0.5):.2f} ms, p99 {percentile(idle, 0.99):.2f} ms, "
                 f"max {max(idle, default=float('nan')):.2f} ms")
    rows = report.samples.rows
    first, last = report.rss_thirds()
    lines.append(f"RSS: start {rows[0][1] / 1024:.1f} MiB, end {rows[-1][1] / 1024:.1f} MiB, max "
                 f"{max(row[1] for row in rows) / 1024:.1f} MiB; median first third {first / 1024:.1f} MiB, "
                 f"last third {last / 1024:.1f} MiB")
    samples = report.samples
    by_third = ", ".join(f"{samples.share(4, lo, hi):.0%}/{samples.share(5, lo, hi):.0%}" for lo, hi in report.thirds())
    lines.append(f"proxy CPU: ran {samples.share(4):.0%} and waited for a CPU {samples.share(5):.0%} of the "
                 f"time; by third ran/waited: {by_third}")
    if starved:
        lines.append(f"/healthz p99 not judged in {', '.join(starved)}: the proxy waited for a CPU over "
                     f"{STARVED_SHARE:.0%} of that time, so the latency there is the machine's")
    lines.append(f"fds: baseline {report.fds_baseline}, peak {max(row[2] for row in rows)}, end {report.fds_end} "
                 f"(after {report.settle_seconds:.1f}s of quiet); threads {report.threads[0]} -> {report.threads[1]}")
    lines.append(f"proxy log: {len(report.log_lines)} line(s) at WARNING or above")
    for line, count in log_kinds(report.log_lines).most_common(5):
        lines.append(f"  {count} x {line}")
    lines.append("PASS" if not report.failures else "FAIL:\n  " + "\n  ".join(report.failures))
    return "\n".join(lines)


# --- the run --------------------------------------------------------------------------------------------------

async def warm_up(url: str, session: aiohttp.ClientSession) -> None:
    """One request of each cheap kind, so lazy imports and caches are loaded before the baseline."""
    body = {"model": "fake-small", "messages": [SYSTEM, user_turn("warm", 0)]}
    for stream in (False, True):
        async with session.post(f"{url}/v1/chat/completions", json={**body, "stream": stream}) as response:
            await response.read()
    async with session.get(f"{url}/v1/models") as response:
        await response.read()


async def run_soak(seconds: float, seed: int = 1) -> Report:
    """The whole soak; the report carries the figures and the failed invariants."""
    seconds = min(seconds, MAX_SECONDS)
    limits, missing = server_limits()
    upstream = Upstream()
    upstream_runner = await serve_upstream(upstream)
    with tempfile.TemporaryDirectory(prefix="soak-") as workdir:
        proxy = await start_proxy(upstream.url, Path(workdir), limits)
        try:
            return await _drive(proxy, upstream, seconds, seed, limits, missing)
        finally:
            proxy.stop()
            await upstream_runner.cleanup()


async def _drive(proxy: ProxyProcess, upstream: Upstream, seconds: float, seed: int, limits: dict[str, Any],
                 missing: list[str]) -> Report:
    pid = proxy.process.pid
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        await warm_up(proxy.url, session)
    # The machine's noise floor: the same probe against the idle proxy, before any load.
    idle_health = await probe_health(proxy.port, IDLE_PROBE_SECONDS)
    fds_baseline, _ = await settle_fds(pid, 0, 2.0)   # the idle count once warm-up connections have closed
    threads_start = proc_status(pid)[2]
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    deadline = started + seconds
    tally, samples = Tally(), Samples()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        load = Load(proxy.url, session, tally, deadline, random.Random(seed), await asyncio.to_thread(gzip_bomb))
        janitor = asyncio.create_task(forget_periodically(upstream, deadline))
        prober = asyncio.create_task(probe_health(proxy.port, seconds))
        sampler = asyncio.create_task(sample_resources(pid, samples, started, deadline))
        await asyncio.gather(*worker_tasks(load))
        health = await prober
        await asyncio.gather(sampler, janitor)
    upstream.forget()
    fds_end, settle = await settle_fds(pid, fds_baseline, SETTLE_SECONDS)
    report = Report(seconds, limits, missing, tally, health, samples, fds_baseline, fds_end, settle,
                    (threads_start, proc_status(pid)[2]), upstream, [], proxy.process.poll() is None,
                    (load_start, os.getloadavg()[0]), idle_health)
    report.log_lines = [line for line in proxy.log.read_text(errors="replace").splitlines() if line.strip()]
    report.failures = check(report)
    return report


async def forget_periodically(upstream: Upstream, deadline: float) -> None:
    while time.monotonic() < deadline:
        upstream.forget()
        await asyncio.sleep(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help=f"load duration (at most {MAX_SECONDS})")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the fakes' own warnings are not the proxy's
    report = asyncio.run(run_soak(options.seconds, options.seed))
    print(render(report))
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
