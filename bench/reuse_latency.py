"""Latency of a reuse hit (a stored summary spliced into the request) through the memory store vs through Redis.

Usage: python bench/reuse_latency.py [--requests N]

Everything runs on 127.0.0.1 in this process, on one event loop: a fast fake upstream (canned chat answers, the
windowed fake's summariser for the one summary built up front), the proxy (proxy.app.start_server) once with
`store: memory` and once with `store: redis` against a redis-server this script starts on a free port, and the
client. For each store, one over-threshold conversation is compacted (its summary stored), then its next turn is
sent N times, one at a time: every one is a reuse hit (checked: `x-compaction: reused`). The rounds of the four
paths are interleaved so drift hits them alike. Baselines: the same client body straight to the fake upstream, and
the body the proxy forwards (the summary spliced in) straight to it. Redis round trips per request are counted
client-side (every command redis-py sends) and server-side (INFO commandstats deltas, which also count the commands
a Lua script runs inside Redis). Bounded: at most MAX_REQUESTS per path and MAX_SECONDS in all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.app import RunningServer, start_server
from proxy.config import settings_from_mapping
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.redis_process import RedisServer
from tests.fakes.serving import serve_app
from tests.fakes.summariser_requests import is_summarizer_request
from tests.fakes.windowed import WindowedModel

WINDOW = 8192
TURNS = 20
ROUNDS = 4
WARM_UP = 20
MAX_REQUESTS = 20_000
MAX_SECONDS = 600.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)
SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}
ANSWER = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "fake-small",
          # No usage: the proxy's calibration stays at 1, so the compaction decision is the same in every run.
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "Noted."}, "finish_reason": "stop"}]}


def turn(index: int) -> dict[str, Any]:
    filler = " ".join(f"word{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{index}. {filler}"}


def conversation(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [SYSTEM]
    for index in range(turns):
        history += [turn(index), {"role": "assistant", "content": f"Noted FACT-{index}. " + "ok " * 60}]
    return [*history, turn(turns)]


class FastUpstream:
    """Chat turns get a canned answer at once; summariser requests go to the windowed fake (a parsable summary).
    Remembers the last chat body it was sent: what the proxy forwarded."""

    def __init__(self) -> None:
        self.summariser = WindowedModel(window=10 * WINDOW)
        self.summaries = 0
        self.last_body: dict[str, Any] | None = None

    async def __call__(self, request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        if is_summarizer_request(body.get("messages") or []):
            self.summaries += 1
            return await self.summariser(request, body, state)
        self.last_body = body
        return web.json_response(ANSWER)


class _Discard(list):  # type: ignore[type-arg]
    """Keeps the fake from accumulating every request."""

    def append(self, item: object) -> None:
        pass


class RoundTrips:
    """Every command redis-py sends from this process (one round trip each: the store pipelines nothing)."""

    def __init__(self) -> None:
        self.count = 0
        original = aioredis.Redis.execute_command

        async def counted(client: aioredis.Redis, *args: Any, **options: Any) -> Any:
            self.count += 1
            return await original(client, *args, **options)

        aioredis.Redis.execute_command = counted  # type: ignore[method-assign]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def commandstats(client: aioredis.Redis) -> Counter[str]:
    """Calls per command so far, and redis-server's CPU time so far in microseconds (as "cpu_us")."""
    info = await client.info("commandstats")
    calls = Counter({name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in info.items()})
    cpu = await client.info("cpu")
    calls["cpu_us"] = round((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1_000_000)
    return calls


def proxy_settings(upstream: str, store: dict[str, Any]) -> Any:
    return settings_from_mapping({
        "upstream": {"base_url": f"{upstream}/v1", "discover_windows": False},
        "models": {"default": {"context_window": WINDOW}},
        "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, "background": False},
        "store": store, "logging": {"level": "WARNING"}}, env={})


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str]:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        await response.read()
        return response.status, response.headers.get("x-compaction", "")


async def prepare(session: aiohttp.ClientSession, proxy: RunningServer, fake: FastUpstream) -> tuple[bytes, bytes]:
    """Compact the conversation through this proxy; its next turn's body, and the body the proxy forwards for it."""
    url = f"{proxy.url}/v1/chat/completions"
    history = conversation(TURNS)
    built = await post(session, url, json.dumps({"model": "fake-small", "messages": history}).encode())
    if built != (200, "proactive"):
        raise RuntimeError(f"the conversation was not compacted: {built}")
    follow_up = [*history, ANSWER["choices"][0]["message"], turn(TURNS + 1)]
    body = json.dumps({"model": "fake-small", "messages": follow_up}).encode()
    for _ in range(WARM_UP):
        hit = await post(session, url, body)
        if hit != (200, "reused"):
            raise RuntimeError(f"not a reuse hit: {hit}")
    assert fake.last_body is not None
    return body, json.dumps(fake.last_body).encode()


async def measure(session: aiohttp.ClientSession, url: str, body: bytes, count: int, expect: str) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        status, compaction = await post(session, url, body)
        samples.append(time.perf_counter() - started)
        if status != 200 or (expect and compaction != expect):
            raise RuntimeError(f"{url}: {status} {compaction!r}, expected 200 {expect!r}")
    return samples


async def run(count: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    trips = RoundTrips()
    fake = FastUpstream()
    state = FakeUpstream(chat_hook=fake)
    state.requests = _Discard()
    upstream_runner, upstream_url = await serve_app(FakeUpstreamApp(state).build())
    directory = Path(tempfile.mkdtemp(prefix="reuse-bench-"))
    redis = RedisServer(directory) if shutil.which("redis-server") else None
    proxies: dict[str, RunningServer] = {}
    try:
        proxies["memory"] = await start_server(proxy_settings(upstream_url, {"kind": "memory"}), host="127.0.0.1",
                                               port=0)
        if redis is not None:
            redis.start()
            proxies["redis"] = await start_server(proxy_settings(upstream_url, {"kind": "redis", "url": redis.url}),
                                                  host="127.0.0.1", port=0)
        else:
            print("redis-server is not installed: the redis row is skipped")
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
            bodies = {name: await prepare(session, proxy, fake) for name, proxy in proxies.items()}
            client_body, forwarded = bodies["memory"]
            if "redis" in bodies and bodies["redis"][1] != forwarded:
                raise RuntimeError("the two stores forwarded different bodies for the same turn")
            direct = f"{upstream_url}/v1/chat/completions"
            paths = {"direct, forwarded body": (direct, forwarded, ""),
                     "direct, client's body": (direct, client_body, ""),
                     **{f"proxy, store {name}": (f"{proxy.url}/v1/chat/completions", client_body, "reused")
                        for name, proxy in proxies.items()}}
            samples: dict[str, list[float]] = {name: [] for name in paths}
            cpu: Counter[str] = Counter()  # this process's CPU seconds per path: client, proxy and fake alike
            raw = aioredis.from_url(redis.url) if redis is not None else None
            commands: Counter[str] = Counter()
            client_trips = 0
            summaries_before = fake.summaries
            for round_index in range(ROUNDS):
                share = count // ROUNDS + (1 if round_index < count % ROUNDS else 0)
                for name, (url, body, expect) in paths.items():
                    before = await commandstats(raw) if raw is not None and name.endswith("redis") else None
                    trips_before, cpu_before = trips.count, time.process_time()
                    samples[name] += await measure(session, url, body, share, expect)
                    cpu[name] += time.process_time() - cpu_before
                    if before is not None and raw is not None:
                        client_trips += trips.count - trips_before
                        after = await commandstats(raw)
                        commands += after - before
            commands.pop("info", None)  # the bench's own snapshots
            if fake.summaries != summaries_before:
                raise RuntimeError("a reuse hit called the summariser")
            if raw is not None:
                await raw.aclose()
    finally:
        for proxy in proxies.values():
            await proxy.stop()
        if redis is not None:
            redis.stop()
        await upstream_runner.cleanup()
        shutil.rmtree(directory, ignore_errors=True)

    messages = len(json.loads(client_body)["messages"])
    print(f"reuse hits: {count} sequential requests per path in {ROUNDS} interleaved rounds, after {WARM_UP} "
          f"warm-up hits per proxy; the client sends {messages} messages ({len(client_body)} bytes), the proxy "
          f"forwards {len(json.loads(forwarded)['messages'])} ({len(forwarded)} bytes)")
    print(f"  {'path':26s} {'median ms':>10s} {'p99 ms':>10s} {'cpu ms/req':>11s} {'redis round trips/req':>22s}")
    for name, values in samples.items():
        per_request = f"{client_trips / count:.2f}" if name.endswith("redis") else "-"
        print(f"  {name:26s} {statistics.median(values) * 1000:10.3f} {percentile(values, 0.99) * 1000:10.3f} "
              f"{cpu[name] / count * 1000:11.3f} {per_request:>22s}")
    print("  (cpu ms/req: this process's CPU time, the client's and the fake's included, redis-server's not; a median "
          "far above it is time spent waiting for a CPU or for Redis)")
    if "proxy, store redis" in samples:
        baseline = statistics.median(samples["direct, client's body"])
        for name in ("proxy, store memory", "proxy, store redis"):
            print(f"  {name} adds {(statistics.median(samples[name]) - baseline) * 1000:.3f} ms (median) over "
                  "the direct client's body")
        server_cpu = commands.pop("cpu_us", 0)
        served = {name: calls for name, calls in commands.items() if calls}
        print(f"  redis-server CPU per request: {server_cpu / count / 1000:.3f} ms")
        print("  redis commands per request, server side (INFO commandstats; Lua-internal calls included): "
              + ", ".join(f"{name} {calls / count:.2f}" for name, calls in sorted(served.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="reuse hits per path (default 300)")
    options = parser.parse_args()
    if not 1 <= options.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be between 1 and {MAX_REQUESTS}")
    asyncio.run(asyncio.wait_for(run(options.requests), MAX_SECONDS))


if __name__ == "__main__":
    main()
