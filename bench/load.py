"""The load generator: its own process (so its CPU is not the proxy's), closed-loop aiohttp workers.

Driven by one JSON command per line on stdin, answering one JSON line on stdout (bench.load_client speaks it):
  {"op": "run", "url": ..., "shape": "small", "concurrency": 32, "max_requests": N, "max_seconds": S,
   "first_index": I, "expect": ["x-compaction", "reused"] | null}
  {"op": "hold", "url": ..., "streams": 1000, "max_seconds": S, "pids": [...]}   (RSS with streams held open)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.bodies import SHAPES, Bodies
from bench.processes import raise_open_files, rss_bytes

OPENING_AT_ONCE = 100       # held streams being connected at the same moment
_bodies: dict[str, Bodies] = {}


def bodies(shape: str) -> Bodies:
    if shape not in _bodies:
        _bodies[shape] = Bodies(SHAPES[shape])
    return _bodies[shape]


def percentile(samples: list[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


@dataclass
class Tally:
    """What the workers of one run saw."""

    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    errors: int = 0
    bad_streams: int = 0
    mismatches: int = 0
    samples: list[str] = field(default_factory=list)   # the first few problems, verbatim
    received_bytes: list[int] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.samples) < 3:
            self.samples.append(text[:500])


async def one_request(session: aiohttp.ClientSession, url: str, made: Bodies, index: int, tally: Tally,
                      expect: list[str] | None) -> None:
    body, shape = made.body(index), made.shape
    started = time.perf_counter()
    async with session.post(url, data=body, headers=made.headers()) as response:
        if response.status != 200:
            tally.errors += 1
            tally.problem(f"status {response.status}: {(await response.read())[:300]!r}")
            return
        if shape.stream:
            await read_stream(response, started, tally, shape.chunks + 1)
        else:
            await response.read()
    tally.latencies.append(time.perf_counter() - started)
    if expect is not None and response.headers.get(expect[0]) != expect[1]:
        tally.mismatches += 1
        tally.problem(f"{expect[0]}: {response.headers.get(expect[0])!r}, expected {expect[1]!r}")
    if (received := response.headers.get("x-bench-received-bytes")) is not None:
        tally.received_bytes.append(int(received))


async def read_stream(response: aiohttp.ClientResponse, started: float, tally: Tally, events: int) -> None:
    """Time to the first body chunk and the gaps between chunks; the stream must hold `events` data events."""
    content, last = bytearray(), None
    async for piece in response.content.iter_any():
        now = time.perf_counter()
        if last is None:
            tally.first_bytes.append(now - started)
        else:
            tally.gaps.append(now - last)
        last = now
        content += piece
    if content.count(b"data: ") != events:
        tally.bad_streams += 1
        tally.problem(f"stream of {content.count(b'data: ')} events, expected {events}: {bytes(content[:200])!r}")


async def run(command: dict[str, Any]) -> dict[str, Any]:
    """Closed loop: `concurrency` workers, each sending its next request as soon as its last one is answered,
    until max_requests were started or max_seconds passed."""
    made, concurrency = bodies(command["shape"]), int(command["concurrency"])
    made.headers()  # the token count behind bytes_per_token is not timed
    first = int(command.get("first_index", 0))  # every run gets fresh bodies: nothing is resent verbatim
    tally, counter = Tally(), iter(range(first, first + int(command["max_requests"])))
    deadline = time.perf_counter() + float(command["max_seconds"])
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=float(command["max_seconds"]) + 60)

    async def worker(session: aiohttp.ClientSession) -> None:
        for index in counter:
            if time.perf_counter() > deadline:
                return
            try:
                await one_request(session, command["url"], made, index, tally, command.get("expect"))
            except (aiohttp.ClientError, TimeoutError) as error:
                tally.errors += 1
                tally.problem(f"{type(error).__name__}: {error}")

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return summary(tally, seconds, len(made.body(0)))


def summary(tally: Tally, seconds: float, body_bytes: int) -> dict[str, Any]:
    done = len(tally.latencies)
    return {"requests": done, "seconds": seconds, "rps": done / seconds if seconds else None,
            "p50_ms": ms(percentile(tally.latencies, 0.5)), "p99_ms": ms(percentile(tally.latencies, 0.99)),
            "ttfb_p50_ms": ms(percentile(tally.first_bytes, 0.5)), "gap_p50_ms": ms(percentile(tally.gaps, 0.5)),
            "errors": tally.errors, "bad_streams": tally.bad_streams, "mismatches": tally.mismatches,
            "problems": tally.samples, "body_bytes": body_bytes,
            "received_bytes": statistics.median(tally.received_bytes) if tally.received_bytes else None}


async def hold(command: dict[str, Any]) -> dict[str, Any]:
    """Open `streams` streams at once, sample the RSS of `pids` once every one has its first chunk, close all."""
    made, streams = bodies("hold"), int(command["streams"])
    opened, failures, gate = [0], [0], asyncio.Semaphore(OPENING_AT_ONCE)
    all_open, release = asyncio.Event(), asyncio.Event()
    connector = aiohttp.TCPConnector(limit=streams, limit_per_host=streams)

    async def one(session: aiohttp.ClientSession, index: int) -> None:
        response = None
        try:
            async with gate:
                response = await session.post(command["url"], data=made.body(index), headers=made.headers())
                if response.status != 200 or not await response.content.readany():
                    raise aiohttp.ClientPayloadError(f"status {response.status}, or no first chunk")
            opened[0] += 1
        except (aiohttp.ClientError, TimeoutError):
            failures[0] += 1
        if opened[0] + failures[0] == streams:
            all_open.set()
        await release.wait()
        if response is not None:
            response.close()

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(one(session, index)) for index in range(streams)]
        try:
            await asyncio.wait_for(all_open.wait(), float(command["max_seconds"]))
        except TimeoutError:
            pass
        rss = {str(pid): rss_bytes(pid) for pid in command["pids"]}
        seconds = time.perf_counter() - started
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"opened": opened[0], "failures": failures[0], "seconds_to_open": seconds, "rss_bytes": rss}


async def serve() -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = json.loads(line)
        try:
            answer = await (hold(command) if command["op"] == "hold" else run(command))
        except Exception:  # noqa: BLE001  # reported to the orchestrator, which fails loudly
            answer = {"crash": traceback.format_exc()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def main() -> None:
    raise_open_files()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


if __name__ == "__main__":
    main()
