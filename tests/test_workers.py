"""`--workers N` through the real program: both workers serve one port, /metrics sums every worker's counts
whichever worker answers the scrape, SIGHUP reaches them all, and SIGTERM stops them all with exit 0."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from proxy.workers import CANNOT_LISTEN, START_SECONDS, Supervisor
from tests.fakes.openai_upstream import FakeUpstream
from tests.ports import free_port
from tests.proxy_process import ProxyProcess, clean_env, proxy_process

REQUESTS = 20
KEY_A, KEY_B = "workers-key-alpha-51c0", "workers-key-bravo-e2a7"


def config_file(tmp_path: Path, fake: FakeUpstream, **server: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"upstream": {"base_url": f"{fake.url}/v1"},
                                    "server": {"reload_poll_seconds": 0, **server}}), encoding="utf-8")
    return path


def fresh_session() -> aiohttp.ClientSession:
    # A new connection per request: SO_REUSEPORT spreads connections, not requests, over the workers.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def chat(session: aiohttp.ClientSession, proxy: ProxyProcess, index: int, key: str | None = None) -> int:
    headers = {"x-proxy-api-key": key} if key else {}
    async with session.post(f"{proxy.base}/v1/chat/completions", headers=headers, json={
            "model": "fake-small", "messages": [{"role": "user", "content": f"hello {index}"}]}) as answer:
        await answer.read()
        return answer.status


async def scraped_chat_requests(session: aiohttp.ClientSession, proxy: ProxyProcess) -> float:
    async with session.get(f"{proxy.base}/metrics") as answer:
        text = await answer.text()
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "compaction_proxy_requests" for sample in family.samples
               if sample.name == "compaction_proxy_requests_total" and sample.labels["route"] == "chat")


def per_worker_chat_requests(metrics_dir: Path) -> dict[int, float]:
    """What each worker counted, read from its own file: proof that both served, not one."""
    counts: dict[int, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(re.fullmatch(r"counter_(\d+)\.db", path.name).group(1))  # type: ignore[union-attr]
        values = MmapedDict.read_all_values_from_file(str(path))  # type: ignore[no-untyped-call]
        counts[pid] = sum(value for key, value, _, _ in values
                          if '"compaction_proxy_requests_total"' in key and '"route": "chat"' in key)
    return counts


def worker_pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"worker-\d+ started, pid (\d+)", output)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_workers_serve_and_metrics_sum_over_them(tmp_path: Path, fake: FakeUpstream) -> None:
    metrics_dir = tmp_path / "metrics"
    env = clean_env(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    async with proxy_process(tmp_path, config_file(tmp_path, fake), args=["--workers", "2"], env=env) as proxy:
        output = await proxy.wait_for_log("listening on", count=2)
        pids = worker_pids(output)
        assert len(pids) == 2
        async with fresh_session() as session:
            statuses = await asyncio.gather(*(chat(session, proxy, index) for index in range(REQUESTS)))
            assert statuses == [200] * REQUESTS
            # Several scrapes, each on a new connection, so both workers answer some: every one sees the sum.
            scraped = [await scraped_chat_requests(session, proxy) for _ in range(8)]
        assert scraped == [REQUESTS] * 8
        counts = per_worker_chat_requests(metrics_dir)
        assert set(counts) == set(pids) and sum(counts.values()) == REQUESTS
        assert all(count > 0 for count in counts.values()), counts  # both served (chance of not: 2 in a million)

        proxy.signal(signal.SIGTERM)
        assert await proxy.exit_code(timeout=20) == 0, proxy.output()
    output = proxy.output()
    assert not any(alive(pid) for pid in pids)
    assert output.count("stopped in") == 2 and "supervisor stopped" in output and "Traceback" not in output
    print(f"per-worker chat requests: {counts}")


async def test_sighup_reaches_every_worker(tmp_path: Path, fake: FakeUpstream) -> None:
    config = config_file(tmp_path, fake, api_keys=[KEY_A])
    async with proxy_process(tmp_path, config, args=["--workers", "2"]) as proxy:
        await proxy.wait_for_log("listening on", count=2)
        config.write_text(config.read_text().replace(KEY_A, KEY_B), encoding="utf-8")
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reloaded (SIGHUP)", count=2)
        assert "worker-0 proxy.reload" in output and "worker-1 proxy.reload" in output
        async with fresh_session() as session:
            statuses = await asyncio.gather(*(chat(session, proxy, index, KEY_B) for index in range(10)),
                                            *(chat(session, proxy, index, KEY_A) for index in range(10)))
        assert statuses == [200] * 10 + [401] * 10
        proxy.signal(signal.SIGTERM)
        assert await proxy.exit_code(timeout=20) == 0


async def test_a_killed_worker_is_replaced(tmp_path: Path, fake: FakeUpstream) -> None:
    async with proxy_process(tmp_path, config_file(tmp_path, fake), args=["--workers", "2"]) as proxy:
        output = await proxy.wait_for_log("listening on", count=2)
        victim = worker_pids(output)[0]
        await asyncio.sleep(5.5)  # past the start-up window, in which a death means "cannot start"
        os.kill(victim, signal.SIGKILL)
        output = await proxy.wait_for_log("listening on", count=3, timeout=20)
        assert "starting a new one" in output and len(worker_pids(output)) == 3
        async with fresh_session() as session:
            assert await asyncio.gather(*(chat(session, proxy, index) for index in range(6))) == [200] * 6
        proxy.signal(signal.SIGTERM)
        assert await proxy.exit_code(timeout=20) == 0


async def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path, fake: FakeUpstream) -> None:
    async with proxy_process(tmp_path, config_file(tmp_path, fake), args=["--workers", "2"]) as proxy:
        pids = worker_pids(await proxy.wait_for_log("listening on", count=2))
        proxy.process.kill()  # no chance to forward anything
        await proxy.process.wait()
        for _ in range(100):
            if not any(alive(pid) for pid in pids):
                break
            await asyncio.sleep(0.1)
    assert not any(alive(pid) for pid in pids), proxy.output()
    assert proxy.output().count("is gone: shutting down") == 2


async def test_workers_that_cannot_start_stop_the_supervisor(tmp_path: Path, fake: FakeUpstream) -> None:
    with socket.socket() as taken:  # another program's port, bound without SO_REUSEPORT: no worker can share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with proxy_process(tmp_path, config_file(tmp_path, fake), args=["--workers", "2"], port=port,
                                 healthy=False) as proxy:
            # Generous: two interpreters start and fail to listen, then the supervisor stops the rest; beside three
            # model servers on two cores (load 7.5) that took past 30 s. A passing run returns when it exits.
            code = await proxy.exit_code(timeout=90)
    assert code == 1, proxy.output()
    output = proxy.output()
    assert "after it started: stopping" in output and "cannot listen" in output and "Traceback" not in output


@pytest.mark.parametrize(("supervised", "code"), [(True, CANNOT_LISTEN), (False, 1)], ids=["a worker", "alone"])
def test_a_port_that_cannot_be_opened_has_its_own_exit_code_for_the_supervisor(
        tmp_path: Path, supervised: bool, code: int) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--supervisor-pid", str(os.getpid())] if supervised else []
        result = subprocess.run([sys.executable, "-m", "proxy", "--host", "127.0.0.1", "--port", str(port), *extra],
                                capture_output=True, text=True, timeout=120, env=clean_env(), check=False)
    assert result.returncode == code and "cannot listen" in result.stderr, result.stderr


@pytest.mark.parametrize(("exit_code", "lived"), [
    pytest.param(CANNOT_LISTEN, START_SECONDS * 12, id="could not listen, however long it took to start (busy)"),
    pytest.param(1, START_SECONDS / 10, id="any failure within its first seconds"),
])
async def test_a_worker_that_never_started_stops_the_supervisor(tmp_path: Path, exit_code: int, lived: float) -> None:
    """Under load an interpreter takes more than START_SECONDS to import and find its port taken: before its own
    exit code, the supervisor took it for a worker that had run, and started another, and another."""
    args = argparse.Namespace(workers=1, config=None)
    supervisor = Supervisor(args, free_port(), tmp_path, 1.0)
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", f"raise SystemExit({exit_code})")
    await process.wait()
    supervisor._workers[0], supervisor._started[0] = process, time.monotonic() - lived
    assert await supervisor._replace(0) is False  # stop: no worker is started in its place


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--workers", "2", "--port", "0"], 1, "--workers needs a fixed port"),
    (["--workers", "0"], 2, "must be at least 1"),
    (["--workers", "two"], 2, "invalid"),
])
def test_bad_worker_arguments(args: list[str], code: int, message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=60,
                            env=clean_env(), check=False)
    assert result.returncode == code and message in result.stderr, result.stderr


def test_one_worker_keeps_single_process_metrics(tmp_path: Path) -> None:
    # Without --workers no directory is set and each app keeps its own registry (the in-process tests rely on it).
    from proxy.metrics import Metrics
    first, second = Metrics(), Metrics()
    first.requests.labels("chat", "200", "none").inc()
    assert b'route="chat"' in first.exposition() and b'route="chat"' not in second.exposition()
    assert free_port() > 0
