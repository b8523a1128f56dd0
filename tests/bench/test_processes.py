"""The benchmark's children: glibc's malloc kept steady in every one of them, so a small heap's page faults (which
move the floor's CPU on a large body from 0.5 to 1.3 ms) stay out of the figures; a caller's own setting kept; a
proxy's port read from what it says once it listens, never picked beforehand."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from bench.processes import (
    BENCH_ROOT,
    STEADY_MALLOC,
    StartFailed,
    bench_env,
    spawn,
    start_proxy,
    stop,
    wait_proxy,
)
from tests.ports import said_port

# A body and its copy made and freed 200 times, as a relay does with each large request: the page faults the last
# 200 rounds took, per round.
CHURN = """
def faults():
    return int(open("/proc/self/stat").read().rpartition(")")[2].split()[7])
for _ in range(20):
    body = b"x" * 500_000
before = faults()
for _ in range(200):
    body = b"x" * 500_000
    copy = bytes(body) + b"y"
    del body, copy
print((faults() - before) / 200)
"""


def faults_per_round(tmp_path: Path) -> float:
    child = spawn("churn", [sys.executable, "-c", CHURN], cwd=BENCH_ROOT, log=tmp_path / "churn.log")
    assert child.process.wait(60) == 0, child.output()
    return float(child.output().strip())


def test_children_get_a_steady_malloc_unless_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert bench_env()["GLIBC_TUNABLES"] == STEADY_MALLOC
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")
    assert bench_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=1"


def test_a_child_churning_large_buffers_takes_no_page_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert faults_per_round(tmp_path) < 10
    monkeypatch.setenv("GLIBC_TUNABLES", "")  # glibc's defaults: the memory goes back and is faulted in again
    assert faults_per_round(tmp_path) > 50


@pytest.mark.parametrize(("log", "port"), [
    ("2026-12-07 19:05:35,983 INFO proxy compaction-proxy 0.1.0 listening on http://127.0.0.1:41234, upstream "
     "https://api.openai.com/v1, event loop uvloop\n", 41234),
    (json.dumps({"time": "t", "level": "INFO", "logger": "proxy", "message": "compaction-proxy 0.1.0 listening on "
                 "http://127.0.0.1:8080, upstream http://127.0.0.1:9/v1, event loop asyncio"}) + "\n", 8080),
    ("==123== Callgrind, a call-graph generating cache profiler\n==123== Command: python -m proxy\n"
     "INFO proxy compaction-proxy 0.1.0 listening on http://[::1]:5000, upstream x\n", 5000),
    ("INFO proxy open files limit 1024 (hard limit 4096)\n", None),  # not listening yet
    ("INFO proxy.upstream upstream http://127.0.0.1:9/v1 failed before answering\n", None),  # another URL
    ("", None),
])
def test_the_port_is_read_from_the_line_the_proxy_logs_once_it_listens(tmp_path: Path, log: str,
                                                                        port: int | None) -> None:
    (tmp_path / "proxy.log").write_text(log)
    assert said_port(tmp_path / "proxy.log") == port


def test_a_restarted_proxy_is_found_where_its_new_start_says(tmp_path: Path) -> None:
    log = tmp_path / "replica.log"
    first = "INFO proxy compaction-proxy 0.1.0 listening on http://127.0.0.1:41234, upstream x\nINFO proxy stopped\n"
    log.write_text(first)
    assert said_port(log, len(first)) is None  # the restart has not said where it listens yet
    with log.open("a") as appended:
        appended.write("INFO proxy compaction-proxy 0.1.0 listening on http://127.0.0.1:5000, upstream x\n")
    assert (said_port(log), said_port(log, len(first))) == (41234, 5000)
    assert said_port(tmp_path / "never-written.log") is None


def test_a_proxy_on_port_zero_is_found_where_it_listens(tmp_path: Path) -> None:
    config = tmp_path / "proxy.json"
    config.write_text(json.dumps({"server": {"host": "127.0.0.1", "port": 0},
                                  "upstream": {"base_url": "http://127.0.0.1:9/v1"}}))
    child = start_proxy("proxy", BENCH_ROOT, config, tmp_path / "proxy.log")
    try:
        port = wait_proxy(child)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        stop(child)


class Healthy(http.server.BaseHTTPRequestHandler):
    """Answers 200 to anything, as another suite's proxy answers /healthz."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_proxy_that_cannot_listen_is_not_taken_for_what_answers_on_its_port(tmp_path: Path) -> None:
    """The race the bench had: the proxy's port taken by another process that answers /healthz. The proxy says it
    cannot listen and exits, and that is what is told; the other process's answer is not taken for the proxy's."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    serving = threading.Thread(target=other.serve_forever, daemon=True)
    serving.start()
    config = tmp_path / "proxy.json"
    config.write_text(json.dumps({"server": {"host": "127.0.0.1", "port": other.server_address[1]},
                                  "upstream": {"base_url": "http://127.0.0.1:9/v1"}}))
    child = start_proxy("proxy", BENCH_ROOT, config, tmp_path / "proxy.log")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{other.server_address[1]}/healthz", timeout=5) as response:
            assert response.status == 200  # what a wait on the port alone would have taken for the proxy
        with pytest.raises(StartFailed, match="cannot listen"):
            wait_proxy(child)
    finally:
        stop(child)
        other.shutdown()
        other.server_close()
