"""The columns measured: the fake upstream direct, the aiohttp floor, nginx, and per proxy root a proxy with compaction
off and one with it on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bodies import SHAPES
from bench.machine import commit
from bench.nginx import start_nginx
from bench.processes import (
    Child,
    cpu_seconds,
    minor_faults,
    rss_bytes,
    start_floor,
    start_proxy,
    start_upstream,
    stop,
    wait_proxy,
)
from bench.stores import shared_store, store_section

# Context windows by model (each shape of request has its own model): 128k for the small requests, room for the
# ~95k-token history without compaction, and a window the same history passes 0.8 of, so it compacts.
WINDOWS = {"bench-small": 128_000, "bench-stream": 128_000, "bench-long": 400_000, "bench-reuse": 64_000}
KINDS = ("direct", "floor", "off", "on", "nginx")
FLOOR = "floor"


@dataclass
class Target:
    column: str
    kind: str          # one of KINDS
    port: int
    child: Child       # whose CPU and RSS are the target's (the upstream itself for direct)

    @property
    def url(self) -> str:
        return self.url_for("small")

    def url_for(self, shape: str) -> str:
        """Where a request of `shape` goes: its API's path on this target."""
        return f"http://127.0.0.1:{self.port}{SHAPES[shape].path}"

    def cpu(self) -> float:
        return cpu_seconds(self.child.pid)

    def rss(self) -> int:
        return rss_bytes(self.child.pid)

    def faults(self) -> int:
        return minor_faults(self.child.pid)


def proxy_config(upstream_port: int, port: int, compaction: bool, store: dict[str, Any] | None = None) -> str:
    """Only keys every version of the proxy knows; the rest default (memory store unless `store`, JSON access log
    on, INFO)."""
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "upstream": {"base_url": f"http://127.0.0.1:{upstream_port}/v1"},
        "compaction": {"enabled": compaction},
        "models": {model: {"context_window": window} for model, window in WINDOWS.items()},
    }
    if store is not None:
        config["store"] = store
    return json.dumps(config, indent=2)


def column(kind: str, root: Path, several: bool) -> str:
    name = f"proxy {kind}"
    return f"{name} {root.name}@{commit(root).replace(' dirty', '+')}" if several else name


def start_proxies(directory: Path, roots: list[Path], upstream_port: int, children: list[Child],
                  store: str = "memory", redis_url: str | None = None) -> list[Target]:
    """Two proxies per root, started together (each added to `children` at once), then waited for; each keeps its
    summaries in its own `store` (bench.stores)."""
    started = []
    for number, root in enumerate(roots):
        for kind in ("off", "on"):
            config = directory / f"proxy-{number}-{kind}.yaml"
            section = store_section(store, directory, f"proxy-{number}-{kind}", redis_url)
            config.write_text(proxy_config(upstream_port, 0, compaction=kind == "on", store=section))
            label = column(kind, root, len(roots) > 1)
            child = start_proxy(label, root, config, directory / f"proxy-{number}-{kind}.log")
            children.append(child)
            started.append((label, kind, child))
    return [Target(label, kind, wait_proxy(child), child) for label, kind, child in started]


@contextmanager
def fleet(directory: Path, roots: list[Path], with_nginx: bool = True, store: str = "memory") -> Iterator[list[Target]]:
    """Every target running, in measuring order (direct, floor, each root's off and on, nginx); all stopped after."""
    with shared_store(store, directory) as redis_url:
        yield from _fleet(directory, roots, with_nginx, store, redis_url)


def _fleet(directory: Path, roots: list[Path], with_nginx: bool, store: str,
           redis_url: str | None) -> Iterator[list[Target]]:
    children: list[Child] = []
    try:
        upstream, upstream_port = start_upstream(directory)
        children.append(upstream)
        targets = [Target("direct", "direct", upstream_port, upstream)]
        floor, floor_port = start_floor(directory, upstream_port)
        children.append(floor)
        targets.append(Target(FLOOR, FLOOR, floor_port, floor))
        targets += start_proxies(directory, roots, upstream_port, children, store, redis_url)
        nginx = start_nginx(directory, upstream_port) if with_nginx else None
        if nginx is not None:
            children.append(nginx[0])
            targets.append(Target("nginx", "nginx", nginx[1], nginx[0]))
        yield targets
    finally:
        for child in reversed(children):
            stop(child)
