"""The compaction journal in the summary store's SQLite file, on its own thread: bounded waits, writes never raise."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from proxy.store.flights import ErrorCounter, StoreUnavailable
from proxy.store.journal import (
    Clock,
    ConversationDetail,
    ConversationInfo,
    Event,
    JournalBounds,
    Point,
    counts_as_compaction,
    detail_of,
    parse_entry,
)
from proxy.store.sqlite_store import _GRACE_SECONDS, _STORE_ERRORS, _describe, _Handle, _identity, _open
from proxy.store.store_health import FailureReports

log = logging.getLogger("proxy.sqlite_journal")

T = TypeVar("T")
_PURGE_INTERVAL_SECONDS = 60.0

# `seq` and `touched` grow with every write (max + 1), so "oldest" and "least recently touched" are the order of
# writing across every process sharing the file, as in MemoryJournal. `listed_in` names the conversation whose
# list of events shows the event; it is cleared when that conversation goes (the event stays readable by id).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal_events (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    listed_in TEXT,
    at REAL NOT NULL,
    entry TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_events_listed ON journal_events (listed_in, seq);
CREATE INDEX IF NOT EXISTS journal_events_at ON journal_events (at);
CREATE TABLE IF NOT EXISTS journal_conversations (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    touched INTEGER NOT NULL,
    last_at REAL NOT NULL,
    entry TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_conversations_touched ON journal_conversations (touched);
CREATE INDEX IF NOT EXISTS journal_conversations_owner ON journal_conversations (owner, touched);
CREATE TABLE IF NOT EXISTS journal_points (
    seq INTEGER PRIMARY KEY,
    conversation TEXT NOT NULL,
    at REAL NOT NULL,
    entry TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_points_conversation ON journal_points (conversation, seq);
CREATE INDEX IF NOT EXISTS journal_points_at ON journal_points (at);
"""


class SqliteJournal:
    """Journal in SQLite tables of its own (`journal_*`) beside the summary store's, on one thread with its own
    connection: every call waits at most `timeout_seconds` (plus a grace). A failed write is dropped, counted
    through `on_error(operation)` and logged at most once per 30 s; a failed read raises StoreUnavailable."""

    def __init__(self, path: str | Path, bounds: JournalBounds, *, timeout_seconds: float = 1.0,
                 on_error: ErrorCounter | None = None, clock: Clock = time.time) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.bounds = bounds
        self._path = Path(path)
        self._timeout = timeout_seconds
        self._clock = clock
        self._failures = FailureReports(log, on_error, time.monotonic)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-journal")
        self._handle: _Handle | None = None  # touched on the executor's thread only
        self._closed = False
        self._last_purge = float("-inf")

    def __repr__(self) -> str:
        return f"SqliteJournal({str(self._path)!r})"

    # --- on the journal's thread -------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """The connection, (re)opened when there is none or the file was deleted or replaced under it."""
        if self._handle is not None and _identity(self._path) != self._handle.identity:
            self._drop()
        if self._handle is None:
            handle = _open(self._path, self._timeout)  # creates the file 0600, WAL, as the summary store does
            try:
                if handle.writable:
                    handle.connection.executescript(_SCHEMA)
            except sqlite3.Error:
                handle.connection.close()
                raise
            self._handle = handle
        return self._handle.connection

    def _drop(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.connection.close()

    def _transaction(self, work: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """`work` in one transaction; a write takes the file's write lock up front (no deadlocked upgrade)."""
        connection = self._connection()
        try:
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = work(connection)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        except _STORE_ERRORS:
            self._drop()  # the next call starts on a fresh connection (a lost file, a broken one)
            raise
        return result

    def _touch(self, connection: sqlite3.Connection, owner: str, conversation: str, dialect: str, model: str,
               at: float) -> ConversationInfo:
        """The conversation as `owner` sees it after this touch (not yet saved); another owner's, or an unreadable
        row, starts over with its points and its list of events dropped."""
        row = connection.execute("SELECT entry FROM journal_conversations WHERE id = ?", (conversation,)).fetchone()
        held = None if row is None else parse_entry(ConversationInfo, row[0])
        if held is not None and held.owner == owner and held.id == conversation:
            return held.model_copy(update={"last_at": max(at, held.last_at), "model": model})
        if row is not None:
            self._forget(connection, [conversation])
        return ConversationInfo(id=conversation, owner=owner, dialect=dialect, model=model, first_at=at, last_at=at,
                                requests=0, compactions=0)

    @staticmethod
    def _forget(connection: sqlite3.Connection, conversations: list[str]) -> None:
        for conversation in conversations:
            connection.execute("DELETE FROM journal_conversations WHERE id = ?", (conversation,))
            connection.execute("DELETE FROM journal_points WHERE conversation = ?", (conversation,))
            connection.execute("UPDATE journal_events SET listed_in = NULL WHERE listed_in = ?", (conversation,))

    def _save(self, connection: sqlite3.Connection, info: ConversationInfo) -> None:
        connection.execute(
            "INSERT OR REPLACE INTO journal_conversations (id, owner, touched, last_at, entry) VALUES"
            " (?, ?, (SELECT COALESCE(MAX(touched), 0) + 1 FROM journal_conversations), ?, ?)",
            (info.id, info.owner, info.last_at, info.model_dump_json()))
        # The least recently touched beyond the bound go, with their points.
        evicted = connection.execute(
            "SELECT id FROM journal_conversations WHERE touched <= (SELECT touched FROM journal_conversations"
            " ORDER BY touched DESC LIMIT 1 OFFSET ?)", (self.bounds.max_conversations,)).fetchall()
        self._forget(connection, [str(row[0]) for row in evicted])
        self._purge(connection)

    def _purge(self, connection: sqlite3.Connection) -> None:
        """Now and then, what the TTL has already hidden from reads leaves the file."""
        now = self._clock()
        if now - self._last_purge < _PURGE_INTERVAL_SECONDS:
            return
        self._last_purge = now
        cutoff = now - self.bounds.ttl_seconds
        connection.execute("DELETE FROM journal_events WHERE at <= ?", (cutoff,))
        connection.execute("DELETE FROM journal_points WHERE at <= ?", (cutoff,))
        connection.execute("DELETE FROM journal_conversations WHERE last_at <= ?", (cutoff,))

    # --- on the loop -------------------------------------------------------------------------------------------

    async def _run(self, work: Callable[[], T]) -> T:
        if self._closed:
            raise RuntimeError("the journal is closed")
        future = asyncio.get_running_loop().run_in_executor(self._executor, work)
        # On timeout a call still queued is cancelled; one running finishes on the thread, unawaited.
        return await asyncio.wait_for(future, self._timeout + _GRACE_SECONDS)

    async def _write(self, operation: str, work: Callable[[sqlite3.Connection], None]) -> None:
        if self._closed:
            return  # shutting down: nothing is kept any more, and nobody is told twice
        try:
            await self._run(lambda: self._transaction(work, write=True))
        except (RuntimeError, *_STORE_ERRORS) as error:
            self._failures.count(operation)
            self._failures.warn(operation, "journal %s failed on %s (%s); the entry is not kept", operation,
                                self._path, _describe(error))

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._run(lambda: self._transaction(work, write=False))
        except (RuntimeError, *_STORE_ERRORS) as error:
            self._failures.count("journal_read")
            self._failures.warn("journal_read", "journal read failed on %s (%s)", self._path, _describe(error))
            raise StoreUnavailable(_describe(error)) from None

    async def record(self, event: Event) -> None:
        def write(connection: sqlite3.Connection) -> None:
            kept = connection.execute("SELECT 1 FROM journal_events WHERE id = ?", (event.id,)).fetchone()
            info = self._touch(connection, event.owner, event.conversation, event.dialect, event.model, event.at)
            # The same event recorded again (by another replica: ids are shared) is not a second compaction.
            if counts_as_compaction(event) and kept is None:
                info = info.model_copy(update={"compactions": info.compactions + 1})
            connection.execute("INSERT OR REPLACE INTO journal_events (id, listed_in, at, entry) VALUES (?, ?, ?, ?)",
                               (event.id, event.conversation, event.at, event.model_dump_json()))
            connection.execute("DELETE FROM journal_events WHERE seq <= (SELECT seq FROM journal_events"
                               " ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.bounds.max_events,))
            self._save(connection, info)

        await self._write("journal_record", write)

    async def point(self, point: Point) -> None:
        def write(connection: sqlite3.Connection) -> None:
            info = self._touch(connection, point.owner, point.conversation, point.dialect, point.model, point.at)
            info = info.model_copy(update={"requests": info.requests + 1})
            connection.execute("INSERT INTO journal_points (conversation, at, entry) VALUES (?, ?, ?)",
                               (point.conversation, point.at, point.model_dump_json()))
            connection.execute(
                "DELETE FROM journal_points WHERE conversation = ? AND seq <= (SELECT seq FROM journal_points"
                " WHERE conversation = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (point.conversation, point.conversation, self.bounds.max_points))
            self._save(connection, info)

        await self._write("journal_point", write)

    def _fresh(self, at: float) -> bool:
        return self._clock() - at < self.bounds.ttl_seconds

    async def conversations(self, owner: str | None, limit: int) -> list[ConversationInfo]:
        if limit <= 0:
            return []

        def read(connection: sqlite3.Connection) -> list[object]:
            rows = connection.execute(
                "SELECT entry FROM journal_conversations WHERE (? IS NULL OR owner = ?) AND last_at > ?"
                " ORDER BY touched DESC LIMIT ?",
                (owner, owner, self._clock() - self.bounds.ttl_seconds, limit)).fetchall()
            return [row[0] for row in rows]

        found = (parse_entry(ConversationInfo, raw) for raw in await self._read(read))
        return [info for info in found if info is not None and (owner is None or info.owner == owner)
                and self._fresh(info.last_at)]

    async def conversation(self, owner: str | None, conversation: str) -> ConversationDetail | None:
        def read(connection: sqlite3.Connection) -> tuple[object, list[object], list[object]] | None:
            row = connection.execute("SELECT entry FROM journal_conversations WHERE id = ?",
                                     (conversation,)).fetchone()
            if row is None:
                return None
            cutoff = self._clock() - self.bounds.ttl_seconds
            points = connection.execute("SELECT entry FROM journal_points WHERE conversation = ? AND at > ?"
                                        " ORDER BY seq", (conversation, cutoff)).fetchall()
            events = connection.execute("SELECT entry FROM journal_events WHERE listed_in = ? AND at > ?"
                                        " ORDER BY seq", (conversation, cutoff)).fetchall()
            return row[0], [point[0] for point in points], [event[0] for event in events]

        rows = await self._read(read)
        info = None if rows is None else parse_entry(ConversationInfo, rows[0])
        if (rows is None or info is None or info.id != conversation or (owner is not None and info.owner != owner)
                or not self._fresh(info.last_at)):
            return None
        return detail_of(info, rows[1], rows[2], self._fresh)

    async def event(self, owner: str | None, event_id: str) -> Event | None:
        def read(connection: sqlite3.Connection) -> object:
            row = connection.execute("SELECT entry FROM journal_events WHERE id = ?", (event_id,)).fetchone()
            return None if row is None else row[0]

        event = parse_entry(Event, await self._read(read))
        if event is None or event.id != event_id or (owner is not None and event.owner != owner) \
                or not self._fresh(event.at):
            return None
        return event

    async def close(self) -> None:
        """Close the connection on its thread; a call stuck on the disk is not waited for beyond one timeout."""
        if self._closed:
            return
        self._closed = True
        closing = asyncio.get_running_loop().run_in_executor(self._executor, self._drop)
        self._executor.shutdown(wait=False)
        await asyncio.wait([closing], timeout=self._timeout + _GRACE_SECONDS)
