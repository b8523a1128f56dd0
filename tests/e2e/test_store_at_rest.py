"""Storage at rest: private store files, readiness that means writable, and a memory store bounded in bytes."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config import MIB, StoreConfig, settings_from_mapping
from proxy.core.fingerprint import hash_chain
from proxy.core.tenants import tenant_namespace
from proxy.store.sqlite_store import SqliteStore
from proxy.store.store import CompactedPrefix, MemoryStore
from proxy.store.stores import open_store
from tests.conftest import ProxyFactory

TTL = 100.0
TENANT = tenant_namespace("sk-one")


def record(salt: str, size: int = 100) -> CompactedPrefix:
    chain = hash_chain([{"role": "user", "content": salt}], TENANT)
    return CompactedPrefix(chain[0], 1, ({"role": "user", "content": "x" * size},), 1000, 50, "m", 1.5)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common default umask: without care, files come out 0644 and directories 0755."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


# --- private files ---------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("open_umask")
async def test_store_file_and_new_directories_are_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "nested" / "summaries.sqlite3"
    existing = mode(tmp_path)
    store = SqliteStore(path, ttl_seconds=TTL)
    await store.put(TENANT, record("a"))
    try:
        assert mode(path) == 0o600
        assert mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700
        assert mode(tmp_path) == existing                  # a directory the proxy did not create is left alone
        for sidecar in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            assert mode(sidecar) == 0o600, f"{sidecar.name} is readable by others"    # SQLite copies the mode
    finally:
        await store.close()


@pytest.mark.usefixtures("open_umask")
async def test_an_existing_readable_store_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "summaries.sqlite3"
    first = SqliteStore(path, ttl_seconds=TTL)
    await first.put(TENANT, record("a"))
    await first.close()
    path.chmod(0o644)
    second = SqliteStore(path, ttl_seconds=TTL)
    assert await second.get(TENANT, record("a").prefix_hash) == record("a")
    assert mode(path) == 0o600
    await second.close()


# --- readiness means writable ----------------------------------------------------------------------------------

async def readyz(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as response:
        return response.status, await response.json()


async def sqlite_proxy(make_proxy: ProxyFactory, path: Path) -> str:
    proxy = await make_proxy({"store": {"kind": "sqlite", "path": str(path)}})
    status, body = await readyz(proxy.url)
    assert (status, body["store"]) == (200, "ok")
    return proxy.url


async def test_readyz_recovers_when_the_store_file_is_deleted(make_proxy: ProxyFactory, tmp_path: Path) -> None:
    path = tmp_path / "summaries.sqlite3"
    url = await sqlite_proxy(make_proxy, path)
    for leftover in tmp_path.glob("summaries.sqlite3*"):
        leftover.unlink()
    for _ in range(2):                                   # noticed (and counted) once, then simply used
        status, body = await readyz(url)
        assert (status, body["store"]) == (200, "ok")
    assert mode(path) == 0o600                           # created anew, private as the first one
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert 'compaction_proxy_store_errors_total{operation="reopen"} 1.0' in await response.text()


async def test_readyz_is_503_when_the_store_path_becomes_a_directory(make_proxy: ProxyFactory,
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "summaries.sqlite3"
    url = await sqlite_proxy(make_proxy, path)
    for leftover in tmp_path.glob("summaries.sqlite3*"):
        leftover.unlink()
    path.mkdir()
    assert (await readyz(url))[0] == 503


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, so "disk full" and "read-only" are real (root ignores permission bits)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mount_point)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_ping_fails_on_a_full_disk(small_filesystem: Path) -> None:
    store = SqliteStore(small_filesystem / "summaries.sqlite3", ttl_seconds=TTL)
    try:
        assert await store.ping() is True
        with (small_filesystem / "filler").open("wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass                                          # the disk is full
        assert shutil.disk_usage(small_filesystem).free < 8192
        assert await store.ping() is False
    finally:
        await store.close()


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A directory and a read-only bind mount of it: writes through the view fail even for root."""
    writable, view = tmp_path / "writable", tmp_path / "view"
    writable.mkdir()
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(writable), str(view)], capture_output=True, check=False).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True,
                          check=False).returncode:
            pytest.skip("cannot make a bind mount read-only here")
        yield writable, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


async def test_ping_fails_on_a_read_only_filesystem(read_only_view: tuple[Path, Path]) -> None:
    writable, view = read_only_view
    store = SqliteStore(writable / "summaries.sqlite3", ttl_seconds=TTL)
    await store.put(TENANT, record("a"))
    await store.close()
    read_only = SqliteStore(view / "summaries.sqlite3", ttl_seconds=TTL)
    try:
        assert await read_only.ping() is False
    finally:
        await read_only.close()


# --- the memory store is bounded in bytes ----------------------------------------------------------------------

async def test_memory_store_evicts_least_recently_used_by_bytes() -> None:
    one = MemoryStore.size_of(TENANT, record("a", 1000))
    store = MemoryStore(max_entries=1000, ttl_seconds=TTL, max_bytes=3 * one + one // 2)
    for salt in "abc":
        await store.put(TENANT, record(salt, 1000))
    assert await store.get(TENANT, record("a").prefix_hash) is not None      # "a" is now the most recent
    await store.put(TENANT, record("d", 1000))
    assert len(store) == 3 and store.total_bytes <= 3 * one + one // 2
    assert await store.get(TENANT, record("b").prefix_hash) is None
    for salt in "acd":
        assert await store.get(TENANT, record(salt).prefix_hash) is not None


async def test_memory_store_bytes_stay_bounded_under_many_puts() -> None:
    limit = 50_000
    store = MemoryStore(max_entries=10_000, ttl_seconds=TTL, max_bytes=limit)
    for index in range(500):
        await store.put(TENANT, record(f"r{index}", 100 + index * 7))
        assert store.total_bytes <= limit
    before, replaced = store.total_bytes, record("r499", 10)
    await store.put(TENANT, replaced)                        # replacing a record releases its old size
    assert await store.get(TENANT, replaced.prefix_hash) == replaced
    assert store.total_bytes == before - MemoryStore.size_of(TENANT, record("r499", 100 + 499 * 7)) \
        + MemoryStore.size_of(TENANT, replaced)


async def test_a_record_larger_than_the_whole_budget_is_not_kept() -> None:
    store = MemoryStore(max_entries=10, ttl_seconds=TTL, max_bytes=2000)
    await store.put(TENANT, record("small", 10))
    await store.put(TENANT, record("huge", 5000))
    assert await store.get(TENANT, record("huge").prefix_hash) is None
    assert await store.get(TENANT, record("small").prefix_hash) is not None


def test_memory_store_rejects_a_bad_byte_limit() -> None:
    with pytest.raises(ValueError):
        MemoryStore(max_entries=10, ttl_seconds=TTL, max_bytes=0)


def test_store_max_bytes_is_configured_and_used() -> None:
    assert StoreConfig().max_bytes == 64 * MIB
    settings = settings_from_mapping({"store": {"max_bytes": 4096}}, env={})
    store = open_store(settings.store)
    assert isinstance(store, MemoryStore) and store.max_bytes == 4096
