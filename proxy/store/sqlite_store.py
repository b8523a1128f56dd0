"""Summary records in one SQLite file on threads of its own: bounded waits, lost files reopened, read-only ones read."""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from proxy.store.known_records import KnownRecords, lookup
from proxy.store.store import CompactedPrefix, longest_verified
from proxy.store.store_health import FailureReports

log = logging.getLogger("proxy.sqlite_store")

T = TypeVar("T")
Clock = Callable[[], float]
ErrorCounter = Callable[[str], None]
Identity = tuple[int, int]  # (device, inode): a deleted or replaced file has another, or none

# Older SQLite builds cap bound parameters at 999; one slot goes to the namespace, one to the clock.
_SQLITE_CHUNK = 900
_PURGE_INTERVAL_SECONDS = 60.0
# Records hold system prompts verbatim: only the proxy's own user may read them.
_PRIVATE_FILE, _PRIVATE_DIRECTORY = 0o600, 0o700
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
# A store opened read-only tries for writing again this often: someone may have fixed the permissions.
_RETRY_WRITABLE_SECONDS = 30.0
# How much longer than SQLite's own lock wait a caller waits for the store's thread: past that, the disk itself is
# stuck and the caller goes on without the store (the thread finishes on its own, holding up only store work).
_GRACE_SECONDS = 0.25
_WAL_RETRY_SECONDS = 0.01  # between asks for WAL mode while another connection sets it up
# Failures to open for writing that mean "read-only here" (a read-only mount, a file or directory we may not write).
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_READ_ONLY_SQLITE = ("SQLITE_READONLY", "SQLITE_CANTOPEN")
_STORE_ERRORS = (sqlite3.Error, OSError)  # OSError includes TimeoutError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS summaries (
    namespace TEXT NOT NULL,
    prefix_hash TEXT NOT NULL,
    prefix_len INTEGER NOT NULL,
    record TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, prefix_hash)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS summaries_expiry ON summaries (expires_at);
CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, checked_at REAL NOT NULL);
"""


def _identity(path: Path) -> Identity | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _create_private(path: Path) -> Identity:
    """Create the store file and its missing directories for the owner only, tighten an existing file, and return
    the file's identity so a deleted or replaced file is noticed later."""
    for directory in reversed([parent for parent in path.parents if not parent.exists()]):
        directory.mkdir(mode=_PRIVATE_DIRECTORY, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, _PRIVATE_FILE)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise IsADirectoryError(f"{path} is not a regular file")
        if stat.S_IMODE(status.st_mode) & ~_PRIVATE_FILE:
            os.fchmod(descriptor, _PRIVATE_FILE)
        identity = (status.st_dev, status.st_ino)
    finally:
        os.close(descriptor)
    for suffix in _SQLITE_SIDECARS:
        _tighten(path.with_name(path.name + suffix))
    return identity


def _tighten(sidecar: Path) -> None:
    """SQLite gives new sidecars the database's mode; one left by an older, laxer run is tightened. Another
    connection's rollback journal is deleted when its transaction ends, so a sidecar may be gone at any moment."""
    try:
        if stat.S_IMODE(sidecar.stat().st_mode) & ~_PRIVATE_FILE:
            sidecar.chmod(_PRIVATE_FILE)
    except FileNotFoundError:
        pass


@dataclass
class _Handle:
    connection: sqlite3.Connection
    identity: Identity
    writable: bool
    opened_at: float  # time.monotonic()


def _open_writable(path: Path, busy_seconds: float) -> _Handle:
    identity = _create_private(path)
    connection = sqlite3.connect(path, timeout=busy_seconds, check_same_thread=False, isolation_level=None)
    try:
        _write_ahead(connection, busy_seconds)
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.executescript(_SCHEMA)
    except sqlite3.Error:
        connection.close()
        raise
    return _Handle(connection, identity, True, time.monotonic())


def _write_ahead(connection: sqlite3.Connection, busy_seconds: float) -> None:
    """WAL mode. Two connections opening a new file at once both ask for it, and SQLite refuses the second at once
    (SQLITE_BUSY, no busy handler): it is asked again until `busy_seconds` have passed. Runs on a store's thread."""
    deadline = time.monotonic() + busy_seconds
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() >= deadline:
                raise
            time.sleep(_WAL_RETRY_SECONDS)


def _open_read_only(path: Path, busy_seconds: float) -> _Handle:
    """Read-only; `immutable` as a last resort, for a WAL file in a directory where its -shm cannot be made."""
    identity = _identity(path)
    if identity is None:
        raise FileNotFoundError(f"{path} does not exist")
    for mode in ("mode=ro", "mode=ro&immutable=1"):
        connection = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True, timeout=busy_seconds,
                                     check_same_thread=False, isolation_level=None)
        try:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as error:
            connection.close()
            if not error.sqlite_errorname.startswith(_READ_ONLY_SQLITE):  # no -shm, and none can be made
                raise
            continue
        return _Handle(connection, identity, False, time.monotonic())
    raise sqlite3.OperationalError(f"cannot open {path} even read-only")


def _open(path: Path, busy_seconds: float) -> _Handle:
    """For writing, creating the file; a file this process may only read is opened read-only instead."""
    try:
        return _open_writable(path, busy_seconds)
    except OSError as error:
        if error.errno not in _READ_ONLY_ERRNOS:
            raise
        cause: Exception = error
    except sqlite3.OperationalError as error:
        if not error.sqlite_errorname.startswith(_READ_ONLY_SQLITE):
            raise
        cause = error
    try:
        return _open_read_only(path, busy_seconds)
    except _STORE_ERRORS:
        raise cause from None


def _describe(error: BaseException) -> str:
    # SQLite's and the OS's messages name the file or the condition, never a record's contents.
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class _Lane:
    """One thread and the one connection it owns: no SQLite call waits on a Python lock, and a write waiting for
    the file's lock holds up only the writes queued behind it."""

    def __init__(self, name: str) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-store-{name}")
        self.handle: _Handle | None = None

    def drop(self) -> None:
        """Close the connection (on the lane's thread); the next call opens the file again."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.connection.close()


class SqliteStore:
    """Records in one SQLite file (WAL), so they survive restarts.

    Reads and writes run on two threads of the store's own, each with its own connection: WAL readers go on beside
    a writer, and nothing here occupies the default thread pool. Every call is bounded by `timeout_seconds`; a
    failed or late read is a miss and a failed write is dropped, both counted through `on_error` (called on the
    store's threads or the loop) and logged at most once per 30 s, without a traceback.
    """

    def __init__(self, path: str | Path, ttl_seconds: float, clock: Clock = time.time, *,
                 timeout_seconds: float = 1.0, on_error: ErrorCounter | None = None) -> None:
        if ttl_seconds <= 0 or timeout_seconds <= 0:
            raise ValueError("ttl_seconds and timeout_seconds must be positive")
        self._path = Path(path)
        self._ttl = ttl_seconds
        self._clock = clock
        self._timeout = timeout_seconds
        self._reader, self._writer = _Lane("read"), _Lane("write")
        self._failures = FailureReports(log, on_error, time.monotonic)
        # Both lanes may notice one lost file, or open one read-only file: it is reported once.
        self._reports = threading.Lock()
        self._lost: Identity | None = None
        self._read_only_noted = False
        self._closed = False
        self._last_purge = float("-inf")
        self._writable = True
        self._known = KnownRecords()

    # --- on a lane's thread ------------------------------------------------------------------------------------

    def _handle(self, lane: _Lane) -> _Handle:
        """The lane's connection, reopened when the file was deleted or replaced, or (read-only) now and then."""
        if self._closed:
            raise RuntimeError("the summary store is closed")
        handle = lane.handle
        if handle is not None:
            current = _identity(self._path)
            if current != handle.identity:
                self._file_lost(handle.identity, current)
                lane.drop()
            elif not handle.writable and time.monotonic() - handle.opened_at >= _RETRY_WRITABLE_SECONDS:
                lane.drop()
        if lane.handle is None:
            lane.handle = _open(self._path, self._timeout)
            self._opened(lane.handle.writable)
        return lane.handle

    def _file_lost(self, lost: Identity, current: Identity | None) -> None:
        with self._reports:
            if self._lost == lost:
                return
            self._lost = lost
        self._failures.count("reopen")
        log.warning("the summary store file %s was %s while open: opening it again, so summaries are kept from now",
                    self._path, "deleted" if current is None else "replaced")

    def _opened(self, writable: bool) -> None:
        with self._reports:
            first, self._read_only_noted = not writable and not self._read_only_noted, not writable
        if first:
            log.warning("the summary store file %s is read-only here: stored summaries are reused, new ones are not "
                        "kept (store_errors_total{operation=\"put\"} counts them)", self._path)

    # --- on the loop -------------------------------------------------------------------------------------------

    async def _run(self, lane: _Lane, work: Callable[[_Handle], T]) -> T:
        """`work` on the lane's thread; TimeoutError when it takes longer than a caller waits for the store."""
        if self._closed:
            raise RuntimeError("the summary store is closed")
        future = asyncio.get_running_loop().run_in_executor(lane.executor, lambda: work(self._handle(lane)))
        # On timeout a call still queued is cancelled; one running finishes on the lane's thread, unawaited.
        return await asyncio.wait_for(future, self._timeout + _GRACE_SECONDS)

    async def _quietly(self, operation: str, lane: _Lane, work: Callable[[_Handle], T]) -> T | None:
        """`work`'s result, or None when the store failed or was too slow (counted and logged)."""
        try:
            return await self._run(lane, work)
        except _STORE_ERRORS as error:
            self._failures.count(operation)
            self._failures.warn("failed", "summary store %s failed on %s (%s); going on without it", operation,
                                self._path, _describe(error))
            return None


    @staticmethod
    def _decode(text: str | bytes) -> CompactedPrefix | None:
        try:
            return CompactedPrefix.from_json(text)
        except ValueError:
            log.warning("ignoring an unreadable summary record")
            return None

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        def select(handle: _Handle) -> str | None:
            row = handle.connection.execute(
                "SELECT record FROM summaries WHERE namespace = ? AND prefix_hash = ? AND expires_at > ?",
                (namespace, prefix_hash, self._clock()),
            ).fetchone()
            return None if row is None else str(row[0])

        text = await self._quietly("get", self._reader, select)
        return None if text is None else self._known.decoded(namespace, prefix_hash, text, self._decode)

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        def upsert(handle: _Handle) -> bool:
            if not handle.writable:
                return False
            now = self._clock()
            handle.connection.execute(
                "INSERT OR REPLACE INTO summaries (namespace, prefix_hash, prefix_len, record, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (namespace, record.prefix_hash, record.prefix_len, record.to_json(), now + self._ttl),
            )
            if now - self._last_purge >= _PURGE_INTERVAL_SECONDS:
                self._last_purge = now
                handle.connection.execute("DELETE FROM summaries WHERE expires_at <= ?", (now,))
            return True

        if await self._quietly("put", self._writer, upsert) is False:
            self._failures.count("put")  # read-only: logged once, when the file was opened so

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        """The chain's links from its longest known record on first (KnownRecords), then the rest only if none of
        those holds one any more; each as one IN query per chunk, longest prefixes first."""

        def select(handle: _Handle, hashes: Sequence[str]) -> list[tuple[str, str]]:
            placeholders = ",".join("?" * len(hashes))
            rows = handle.connection.execute(
                f"SELECT prefix_hash, record FROM summaries WHERE namespace = ? AND expires_at > ?"
                f" AND prefix_hash IN ({placeholders})",
                (namespace, self._clock(), *hashes),
            ).fetchall()
            return [(str(row[0]), str(row[1])) for row in rows]

        async def fetch(hashes: Sequence[str]) -> list[CompactedPrefix] | None:
            for end in range(len(hashes), 0, -_SQLITE_CHUNK):
                part = hashes[max(0, end - _SQLITE_CHUNK) : end]
                rows = await self._quietly("lookup", self._reader, functools.partial(select, hashes=part))
                if rows is None:
                    return None
                decoded = (self._known.decoded(namespace, prefix_hash, text, self._decode)
                           for prefix_hash, text in rows)
                # A later chunk's record is longer than any before it: the first one found is the answer.
                best = longest_verified((record for record in decoded if record is not None), chain)
                if best is not None:
                    return [best]
            return []

        return await lookup(self._known, namespace, chain, fetch)

    def _probe(self, handle: _Handle) -> bool:
        """Whether the store would keep a record now: a committed write, not a read or a rolled-back one (only a
        commit meets a full disk or a read-only mount). A deleted or replaced file was reopened on the way here."""
        if not handle.writable:
            return False
        handle.connection.execute("INSERT OR REPLACE INTO health (id, checked_at) VALUES (1, ?)", (self._clock(),))
        return True

    async def ping(self) -> bool:
        try:
            writable = await self._run(self._writer, self._probe)
        except (RuntimeError, *_STORE_ERRORS) as error:
            if self._writable:
                log.warning("the summary store at %s cannot take writes: %s", self._path, _describe(error))
            self._writable = False
            return False
        self._writable = writable  # read-only: said once already, when the file was opened so
        return writable

    async def close(self) -> None:
        """Close both connections on their threads and let the threads end; a call still stuck on the disk is not
        waited for beyond one timeout (its thread closes its connection and ends once it returns)."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        lanes = (self._reader, self._writer)
        closing = [loop.run_in_executor(lane.executor, lane.drop) for lane in lanes]
        for lane in lanes:
            lane.executor.shutdown(wait=False)
        await asyncio.wait(closing, timeout=self._timeout + _GRACE_SECONDS)
