"""What the figures were measured on: date, machine, Python, and each proxy root's commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.processes import bench_env


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def commit(root: Path) -> str:
    """`git rev-parse --short HEAD` of root, "+dirty" when `git status --porcelain` lists anything."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "no git"
    return f"{head} dirty" if git("status", "--porcelain") else head


def header(roots: list[Path]) -> list[str]:
    """The lines printed above the table."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {cpu_model()}, {os.cpu_count()} cores"
    lines = [f"date: {now}", f"machine: {machine}", f"python: {sys.version.split()[0]}",
             f"children's GLIBC_TUNABLES: {bench_env()['GLIBC_TUNABLES'] or '(none)'}"]
    lines += [f"proxy root {root}: {commit(root)}" for root in roots]
    return lines
