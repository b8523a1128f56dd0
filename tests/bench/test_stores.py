"""bench.stores: each proxy's store section, and the one redis-server the proxies share while the bench runs."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from bench.stores import STORES, shared_store, store_section
from bench.targets import proxy_config
from proxy.config import settings_from_mapping


@pytest.mark.parametrize("kind, expected", [
    ("memory", None),
    ("sqlite", {"kind": "sqlite", "path": "DIR/proxy-1-on.sqlite3"}),
    ("redis", {"kind": "redis", "url": "redis://127.0.0.1:1/0", "key_prefix": "bench-proxy-1-on:"}),
])
def test_each_proxy_gets_a_store_of_its_own(kind: str, expected: dict[str, str] | None, tmp_path: Path) -> None:
    section = store_section(kind, tmp_path, "proxy-1-on", "redis://127.0.0.1:1/0")
    if expected is not None and "path" in expected:
        expected = {**expected, "path": str(tmp_path / "proxy-1-on.sqlite3")}
    assert section == expected
    config = json.loads(proxy_config(9, 8, compaction=True, store=section))
    settings = settings_from_mapping(config, env={})  # the proxy reads it as it is
    assert settings.store.kind == kind


def test_a_redis_section_without_a_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="url"):
        store_section("redis", tmp_path, "proxy-0-on", None)


def test_an_unknown_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="memory, sqlite, redis"), shared_store("postgres", tmp_path):
        pass
    assert STORES == ("memory", "sqlite", "redis")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_only_redis_starts_a_server(kind: str, tmp_path: Path) -> None:
    with shared_store(kind, tmp_path) as url:
        assert url is None


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_redis_runs_while_the_bench_does_and_stops_after(tmp_path: Path) -> None:
    with shared_store("redis", tmp_path) as url:
        assert url is not None
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert _pong(port)
    assert not _pong(port)
