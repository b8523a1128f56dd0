"""The sqlite store beside a locked, deleted, replaced or read-only file: bounded waits, misses, one log line each."""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest

from proxy.config import StoreConfig
from proxy.core.fingerprint import hash_chain
from proxy.core.tenants import tenant_namespace
from proxy.store.sqlite_store import SqliteStore, _create_private, _write_ahead
from proxy.store.store import CompactedPrefix, SummaryStore
from proxy.store.stores import open_store
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client
from tests.store.test_store import FakeClock

TTL = 100.0
TENANT = tenant_namespace("sk-one")
BOUND = 60.0  # seconds: every wait in these tests ends well within this, or the test fails
REPO = Path(__file__).resolve().parents[2]


def record(salt: str) -> CompactedPrefix:
    chain = hash_chain([{"role": "user", "content": salt}], TENANT)
    return CompactedPrefix(chain[0], 1, ({"role": "user", "content": f"summary of {salt}"},), 1000, 50, "m", 1.5)


def open_sqlite(path: Path, errors: list[str], timeout: float = 1.0) -> SummaryStore:
    config = StoreConfig(kind="sqlite", path=path, ttl_seconds=TTL, timeout_seconds=timeout)
    return open_store(config, on_error=errors.append)


def sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


@contextmanager
def locked(path: Path, *, readers_too: bool = False) -> Iterator[None]:
    """Another connection holding the file's write lock (WAL readers carry on beside it); with `readers_too`, an
    exclusive locking mode that shuts readers out as well (it can only be taken while nobody has the file open)."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        if readers_too:
            connection.execute("PRAGMA locking_mode=EXCLUSIVE")
        connection.execute("BEGIN EXCLUSIVE")
        connection.execute("INSERT OR REPLACE INTO health (id, checked_at) VALUES (7, 0)")
        yield
    finally:
        connection.execute("ROLLBACK")
        connection.close()


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [entry for entry in caplog.records if entry.levelno >= logging.WARNING]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert [entry.getMessage() for entry in caplog.records if entry.exc_info] == []


# --- a locked file: waits are bounded, and a waiting write holds up nothing else ------------------------------

async def test_reads_go_on_while_a_write_waits_for_the_lock(tmp_path: Path) -> None:
    path, errors = tmp_path / "summaries.sqlite3", []
    store = open_sqlite(path, errors, timeout=BOUND)   # the write waits as long as the lock is held
    await store.put(TENANT, record("a"))
    chain = [record("a").prefix_hash]
    with locked(path):
        waiting = asyncio.create_task(store.put(TENANT, record("b")))
        for _ in range(20):
            assert await store.get(TENANT, record("a").prefix_hash) == record("a")
            assert await store.longest_match(TENANT, chain) == record("a")
        assert not waiting.done(), "a read waited for the write to give up"
    await asyncio.wait_for(waiting, BOUND)
    assert await store.get(TENANT, record("b").prefix_hash) == record("b")
    assert errors == []
    await store.close()


async def test_store_work_leaves_the_default_thread_pool_free(tmp_path: Path) -> None:
    path, errors = tmp_path / "summaries.sqlite3", []
    store = open_sqlite(path, errors, timeout=BOUND)
    await store.put(TENANT, record("a"))
    with locked(path):
        # More waiting writes than the default pool has threads (at most 32), then other work for that pool.
        puts = [asyncio.create_task(store.put(TENANT, record(f"w{n}"))) for n in range(40)]
        other = asyncio.create_task(asyncio.to_thread(threading.get_ident))
        await asyncio.wait_for(other, BOUND)
        assert not any(put.done() for put in puts), "the other work waited for a store write"
    await asyncio.wait_for(asyncio.gather(*puts), BOUND)
    assert await store.get(TENANT, record("w39").prefix_hash) == record("w39")
    assert errors == []
    await store.close()


async def test_a_write_to_a_locked_file_is_dropped_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, errors = tmp_path / "summaries.sqlite3", []
    store = open_sqlite(path, errors, timeout=0.2)
    await store.put(TENANT, record("a"))
    with locked(path):
        for salt in ("b", "c", "d"):
            await store.put(TENANT, record(salt))       # neither raises nor waits past the timeout
    assert errors == ["put", "put", "put"]
    assert len(warnings_in(caplog)) == 1, [entry.getMessage() for entry in warnings_in(caplog)]
    assert_no_traceback(caplog)
    assert await store.get(TENANT, record("b").prefix_hash) is None
    await store.put(TENANT, record("e"))               # the lock is gone: writes are kept again
    assert await store.get(TENANT, record("e").prefix_hash) == record("e")
    await store.close()


async def test_a_read_shut_out_by_an_exclusive_lock_is_a_miss(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    path, errors = tmp_path / "summaries.sqlite3", []
    first = open_sqlite(path, [])
    await first.put(TENANT, record("a"))
    await first.close()
    store = open_sqlite(path, errors, timeout=0.2)
    with locked(path, readers_too=True):
        assert await store.get(TENANT, record("a").prefix_hash) is None
        assert await store.longest_match(TENANT, [record("a").prefix_hash]) is None
    assert errors == ["get", "lookup"]
    assert len(warnings_in(caplog)) == 1, [entry.getMessage() for entry in warnings_in(caplog)]
    assert_no_traceback(caplog)
    assert await store.get(TENANT, record("a").prefix_hash) == record("a")   # and read again once it is free
    await store.close()


async def test_close_stops_the_store_threads(tmp_path: Path) -> None:
    store = open_sqlite(tmp_path / "summaries.sqlite3", [])
    before = set(threading.enumerate())
    await store.put(TENANT, record("a"))
    assert await store.get(TENANT, record("a").prefix_hash) == record("a")
    own = [thread for thread in set(threading.enumerate()) - before if thread.name.startswith("sqlite-store")]
    assert own, "the store runs its work on threads of its own"
    await store.close()
    for thread in own:
        await asyncio.to_thread(thread.join, BOUND)
    assert not any(thread.is_alive() for thread in own)


# --- a deleted or replaced file is reopened ------------------------------------------------------------------

async def replace_with_a_copy_holding(path: Path, kept: CompactedPrefix) -> None:
    """What restoring a backup does: another database renamed over the path."""
    backup = path.with_name("backup.sqlite3")
    other = open_sqlite(backup, [])
    await other.put(TENANT, kept)
    await other.close()
    for sidecar in sidecars(path):
        sidecar.unlink(missing_ok=True)
    os.replace(backup, path)


def stored_hashes(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT prefix_hash FROM summaries")}


@pytest.mark.parametrize("change", ["deleted", "replaced"])
async def test_a_deleted_or_replaced_file_is_reopened_and_later_summaries_kept(
        change: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, errors = tmp_path / "summaries.sqlite3", []
    store = open_sqlite(path, errors)
    await store.put(TENANT, record("a"))
    assert await store.get(TENANT, record("a").prefix_hash) == record("a")
    if change == "deleted":
        for leftover in (path, *sidecars(path)):
            leftover.unlink(missing_ok=True)
    else:
        await replace_with_a_copy_holding(path, record("restored"))
    await store.put(TENANT, record("b"))
    assert await store.get(TENANT, record("b").prefix_hash) == record("b")
    assert await store.get(TENANT, record("a").prefix_hash) is None
    assert await store.ping() is True
    await store.close()
    expected = {record("b").prefix_hash} | ({record("restored").prefix_hash} if change == "replaced" else set())
    assert stored_hashes(path) == expected
    assert errors == ["reopen"]
    assert len(warnings_in(caplog)) == 1, [entry.getMessage() for entry in warnings_in(caplog)]
    assert_no_traceback(caplog)


# --- a read-only file is read, and not written ---------------------------------------------------------------

READ_ONLY_RUN = """
import asyncio, json, logging, sys
from proxy.config import StoreConfig
from proxy.store.store import CompactedPrefix
from proxy.store.stores import open_store

kept = []
class Keep(logging.Handler):
    def emit(self, entry):
        kept.append(entry)

logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.WARNING)

async def main(path, namespace, prefix_hash):
    errors = []
    store = open_store(StoreConfig(kind="sqlite", path=path, timeout_seconds=1), on_error=errors.append)
    found = await store.get(namespace, prefix_hash)
    matched = await store.longest_match(namespace, [prefix_hash])
    for number in range(3):
        await store.put(namespace, CompactedPrefix(f"new{number}", 1, ({"role": "user", "content": "x"},),
                                                   10, 5, "m", 1.0))
    ready = await store.ping()
    await store.close()
    print(json.dumps({"found": found is not None, "matched": matched is not None, "ready": ready, "errors": errors,
                      "warnings": [entry.getMessage() for entry in kept if entry.levelno >= logging.WARNING],
                      "tracebacks": sum(entry.exc_info is not None for entry in kept)}))

asyncio.run(main(*sys.argv[1:]))
"""


def without_permission_override() -> None:
    """In the child, before exec: root without CAP_DAC_OVERRIDE (and _READ_SEARCH) obeys mode bits like any user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP; refused (and not needed) when not root


def run_as_unprivileged(path: Path, prefix_hash: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", READ_ONLY_RUN, str(path), TENANT, prefix_hash], cwd=REPO,
                          preexec_fn=without_permission_override, capture_output=True, text=True, timeout=BOUND,
                          check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("read_only", ["file 0400", "directory 0500"])
async def test_a_read_only_store_is_read_and_its_writes_skipped_with_one_line(read_only: str, tmp_path: Path) -> None:
    directory = tmp_path / "state"
    path = directory / "summaries.sqlite3"
    writer = open_sqlite(path, [])
    await writer.put(TENANT, record("a"))
    await writer.close()
    (path if read_only == "file 0400" else directory).chmod(0o400 if read_only == "file 0400" else 0o500)
    try:
        result = run_as_unprivileged(path, record("a").prefix_hash)
    finally:
        directory.chmod(0o700)
        path.chmod(0o600)
    assert (result["found"], result["matched"]) == (True, True)
    assert result["ready"] is False                    # readiness still means the store takes a write
    assert result["errors"] == ["put", "put", "put"]
    assert len(result["warnings"]) == 1 and "read-only" in result["warnings"][0], result["warnings"]
    assert result["tracebacks"] == 0
    assert stored_hashes(path) == {record("a").prefix_hash}


# --- through the app: chat is served while another process holds the file ------------------------------------

WINDOW = 8192
SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}


def user_turn(index: int, topic: str) -> dict[str, Any]:
    filler = " ".join(f"{topic}{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{index}. {filler}"}


def big_history(turns: int, topic: str = "word") -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [SYSTEM]
    for index in range(turns):
        history += [user_turn(index, topic), {"role": "assistant", "content": f"Noted FACT-{index}. " + "ok " * 60}]
    return [*history, user_turn(turns, topic)]


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


async def store_errors(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    prefix = 'compaction_proxy_store_errors_total{operation="'
    return {line[len(prefix):].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


@pytest.mark.parametrize("readers_too", [False, True], ids=["writers shut out", "readers shut out too"])
async def test_chat_is_served_while_another_connection_holds_the_store_file(
        readers_too: bool, model: WindowedModel, make_proxy: ProxyFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "summaries.sqlite3"
    overrides = {"models": {"default": {"context_window": WINDOW}},
                 "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, "background": False},
                 "store": {"kind": "sqlite", "path": str(path), "timeout_seconds": 0.5}}
    proxy = await make_proxy(overrides)
    client = async_client(proxy.url)
    await client.chat.completions.create(model="fake-small", messages=big_history(1))   # calibrates
    history = big_history(20)
    first = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
    assert first.headers["x-compaction"] == "proactive"
    history += [first.parse().choices[0].message.model_dump(exclude_none=True), user_turn(21, "word")]
    if readers_too:   # the lock can only be taken while nobody has the file open: the next proxy opens it after
        await proxy.stop()
    with locked(path, readers_too=readers_too):
        if readers_too:
            proxy = await make_proxy(overrides)
            client = async_client(proxy.url)
        started = time.perf_counter()
        next_turn = await client.chat.completions.with_raw_response.create(model="fake-small", messages=history)
        other = await client.chat.completions.with_raw_response.create(model="fake-small",
                                                                       messages=big_history(20, "other"))
        print(f"\n[{'readers' if readers_too else 'writers'} shut out] two chat turns with the store file locked: "
              f"{time.perf_counter() - started:.2f} s")
    # WAL readers carry on beside a writer, so reuse still works; shut out, it degrades to a miss.
    assert next_turn.headers["x-compaction"] == ("proactive" if readers_too else "reused")
    assert other.headers["x-compaction"] == "proactive"    # served, though its summary could not be kept
    errors = await store_errors(proxy.url)
    assert errors.get("put", 0) >= 1 and (errors.get("lookup", 0) >= 1) == readers_too, errors
    assert_no_traceback(caplog)


def test_wal_mode_is_asked_again_while_another_connection_holds_the_file(tmp_path: Path) -> None:
    # Two journals opening one new file at once: the second's PRAGMA journal_mode=WAL was refused at once
    # (SQLITE_BUSY, no busy handler) and its first write dropped, about one run in twenty.
    path = tmp_path / "store.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    waiting = sqlite3.connect(path, timeout=0.0, isolation_level=None, check_same_thread=False)
    with pytest.raises(sqlite3.OperationalError):
        _write_ahead(waiting, 0.05)  # held past the wait: refused, as before
    release = threading.Timer(0.2, holder.execute, ("COMMIT",))
    release.start()
    started = time.monotonic()
    _write_ahead(waiting, 5.0)
    release.join()
    assert 0.1 < time.monotonic() - started < 5.0
    assert waiting.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    waiting.close()
    holder.close()


def test_a_sidecar_removed_while_the_file_is_opened_is_passed_over(tmp_path: Path) -> None:
    # SQLite deletes a rollback journal when its transaction ends. A second journal opening the file in that moment
    # saw the -journal, then failed to stat it (FileNotFoundError), and its first point was dropped.
    path = tmp_path / "store.sqlite3"
    churn = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        "names = [sys.argv[1] + suffix for suffix in ('-wal', '-shm', '-journal')]\n"
        "while True:\n"
        "    for name in names:\n"
        "        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))\n"
        "        os.unlink(name)\n"), str(path)])
    try:
        deadline = time.monotonic() + 10.0
        while not any(sidecar.exists() for sidecar in sidecars(path)):  # the churn has started
            assert time.monotonic() < deadline
        opened = 0
        while opened < 2000:  # before the fix: a FileNotFoundError within about ten
            assert _create_private(path) == (path.stat().st_dev, path.stat().st_ino)
            opened += 1
    finally:
        churn.kill()
        churn.wait()
    assert churn.returncode is not None and opened == 2000
    for sidecar in sidecars(path):
        sidecar.unlink(missing_ok=True)
    os.close(os.open(sidecars(path)[2], os.O_CREAT | os.O_WRONLY, 0o644))
    _create_private(path)
    assert stat.S_IMODE(sidecars(path)[2].stat().st_mode) == 0o600  # a lax one left behind is still tightened


class _CountingConnection(sqlite3.Connection):
    """Counts the prefix hashes each lookup query binds."""

    asked: ClassVar[list[int]] = []

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if "prefix_hash IN" in sql:
            _CountingConnection.asked.append(len(parameters) - 2)  # the namespace and the clock
        return super().execute(sql, parameters)


async def test_a_known_record_is_decoded_once_asked_from_its_link_and_its_expiry_falls_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *args, **kw: real_connect(*args, **kw,
                                                                             factory=_CountingConnection))
    _CountingConnection.asked = []
    clock = FakeClock()
    store = SqliteStore(tmp_path / "known.sqlite3", ttl_seconds=100, clock=clock)
    chain = hash_chain([{"role": "user", "content": f"m{i}"} for i in range(50)], "ns")
    long = CompactedPrefix(chain[39], 40, ({"role": "user", "content": "long"},), 1, 1, "m", 1.0)
    short = CompactedPrefix(chain[9], 10, ({"role": "user", "content": "short"},), 1, 1, "m", 1.0)
    await store.put("ns", long)
    first = await store.longest_match("ns", chain)
    second = await store.longest_match("ns", chain)
    assert first == long and second is first
    clock.now += 60
    await store.put("ns", short)  # outlives the long one by 60 s
    clock.now += 50
    assert await store.longest_match("ns", chain) == short
    assert _CountingConnection.asked == [50, 11, 11, 39]
    await store.close()
