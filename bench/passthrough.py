"""Latency of a non-streaming chat completion, direct to a local fake upstream vs through the proxy.

Usage: python bench/passthrough.py [--requests N] [--concurrency C]
Prints median and p99 for both paths, measured in the same run, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import serve_app  # noqa: E402
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp  # noqa: E402

BODY = {"model": "fake-small", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "hello " * 200}]}


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(session: aiohttp.ClientSession, url: str, count: int, concurrency: int) -> list[float]:
    samples: list[float] = []
    queue = iter(range(count))

    async def worker() -> None:
        for _ in queue:
            started = time.perf_counter()
            async with session.post(url, json=BODY) as response:
                await response.read()
                assert response.status == 200
            samples.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def main(count: int, concurrency: int) -> None:
    fake = FakeUpstream()
    fake.requests = _Discard()
    upstream_runner, upstream_url = await serve_app(FakeUpstreamApp(fake).build())
    proxy_process, proxy_url = await start_proxy_process(upstream_url)
    targets = {"direct": f"{upstream_url}/v1/chat/completions", "proxy": f"{proxy_url}/v1/chat/completions"}
    results: dict[str, list[float]] = {name: [] for name in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        for name, url in targets.items():
            await measure(session, url, 50, concurrency)      # warm-up
        for _ in range(4):                                     # interleave rounds so drift hits both alike
            for name, url in targets.items():
                results[name] += await measure(session, url, count // 4, concurrency)
    proxy_process.terminate()
    proxy_process.wait(10)
    await upstream_runner.cleanup()
    print(f"non-streaming chat completion, {count} requests per path, concurrency {concurrency}")
    for name, samples in results.items():
        print(f"  {name:6s} median {statistics.median(samples) * 1000:7.3f} ms"
              f"   p99 {percentile(samples, 0.99) * 1000:7.3f} ms")
    median_ratio = statistics.median(results["proxy"]) / statistics.median(results["direct"])
    p99_ratio = percentile(results["proxy"], 0.99) / percentile(results["direct"], 0.99)
    print(f"  ratio proxy/direct: median {median_ratio:.2f}x, p99 {p99_ratio:.2f}x")


async def start_proxy_process(upstream_url: str) -> tuple[subprocess.Popen[bytes], str]:
    """The real program in its own process, as deployed, so its CPU is not shared with the load generator."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Path(tempfile.mkdtemp()) / "bench.yaml"
    config.write_text(json.dumps({"server": {"port": port}, "upstream": {"base_url": f"{upstream_url}/v1"},
                                  "logging": {"level": "WARNING"}}))
    process = subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(config)])
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            try:
                async with session.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return process, url
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise RuntimeError("the proxy did not start")


class _Discard(list):  # type: ignore[type-arg]
    """Keeps the fake from accumulating every request during a long run."""

    def append(self, item: object) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1)
    options = parser.parse_args()
    asyncio.run(main(options.requests, options.concurrency))
