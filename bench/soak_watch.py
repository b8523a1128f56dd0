"""Watching the soaked proxy from outside: RSS, descriptors, threads and CPU from /proc, /healthz from a prober."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEALTH_PERIOD = 0.1

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
