"""Summary single-flight: one build per prefix, within one process (LocalFlights) or across replicas (RedisFlights)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from proxy.store.single_flight import SingleFlight
from proxy.store.store import CompactedPrefix, SummaryStore

log = logging.getLogger("proxy.flights")

Build = Callable[[], Awaitable[CompactedPrefix]]
ErrorCounter = Callable[[str], None]

# What a lease holder announces when it lets go; only FAILED is shared with waiters as a failure, the others
# make them try again (and so take over).
STORED = "stored"
FAILED = "failed"
ABANDONED = "abandoned"
DROPPED = "dropped"  # built, but too large to share
CLOSED = "closed"  # the store shut down under the waiter
_RECENT_ANNOUNCEMENTS = 4096


class StoreUnavailable(Exception):
    """The shared store cannot answer now; the store has already counted and logged why."""


class RemoteFailure(Exception):
    """The summary was being built by another replica, which failed or did not finish in time."""


@dataclass(frozen=True)
class Lease:
    """The right to build one summary, until `token` stops being the lock's value (expiry, takeover)."""

    namespace: str
    prefix_hash: str
    token: int  # fencing token: grows with every lease granted by this store
    owner: str  # the store instance (replica) holding it

    @property
    def value(self) -> str:
        """The lock's value while this lease holds it; the owner keeps tokens unique across store restarts."""
        return f"{self.token}:{self.owner}"


@dataclass(frozen=True)
class Held:
    """Another holder's lease on the summary: whose (its lease value), to wait for that holder's announcement."""

    holder: str


class Announcements:
    """What lease holders announced (an outcome per key and holder), handed to the waiters for it.

    Recent announcements are kept, so a waiter that registers just after its holder spoke still hears it; a waiter
    that finds nobody listening (`subscribed` unset) is told to look again (None) rather than wait for what it may
    have missed.
    """

    def __init__(self) -> None:
        self.subscribed = asyncio.Event()
        self._waiters: dict[tuple[str, str], set[asyncio.Future[str]]] = {}
        self._recent: OrderedDict[tuple[str, str], str] = OrderedDict()

    def heard(self, key: str, holder: str, outcome: str) -> None:
        self._recent[key, holder] = outcome
        while len(self._recent) > _RECENT_ANNOUNCEMENTS:
            self._recent.popitem(last=False)
        for future in self._waiters.get((key, holder), ()):
            if not future.done():
                future.set_result(outcome)

    async def wait(self, key: str, holder: str, timeout: float) -> str | None:
        if (outcome := self._recent.get((key, holder))) is not None:
            return outcome
        if not self.subscribed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.subscribed.wait(), timeout)
            return self._recent.get((key, holder))
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((key, holder), set()).add(future)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None
        finally:
            waiting = self._waiters[key, holder]
            waiting.discard(future)
            if not waiting:
                del self._waiters[key, holder]

    def close(self) -> None:
        """Wake every waiter with CLOSED."""
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(CLOSED)


@runtime_checkable
class LeaseStore(SummaryStore, Protocol):
    """A summary store shared by replicas that also grants leases: what RedisFlights needs of RedisStore.

    Every method but the SummaryStore ones raises StoreUnavailable when the store cannot be asked.
    """

    @property
    def lock_ttl_seconds(self) -> float: ...

    async def acquire(self, namespace: str, prefix_hash: str) -> Lease | CompactedPrefix | Held:
        """The stored record; else a lease to build it; else who holds the lease to build it."""
        ...

    async def renew(self, lease: Lease) -> bool:
        """Extend the lease; False when it is no longer this holder's."""
        ...

    async def complete(self, lease: Lease, record: CompactedPrefix) -> bool:
        """Store the record and let go, waking waiters; False (nothing written) when the lease was lost."""
        ...

    async def release(self, lease: Lease, outcome: str) -> bool:
        """Let go without storing, telling waiters `outcome`; False when the lease was already lost."""
        ...

    async def wait(self, namespace: str, prefix_hash: str, holder: str, timeout: float) -> str | None:
        """The outcome `holder` announces for this key, or None if none comes within `timeout` (look again)."""
        ...

    async def in_flight(self, namespace: str) -> frozenset[str]:
        """The prefix hashes of this namespace whose leases are held now."""
        ...

    async def holder(self, namespace: str, prefix_hash: str) -> str | None:
        """Who holds the key's lease now (its lease value); None when nobody does."""
        ...


@runtime_checkable
class Flights(Protocol):
    """What the Compactor needs: claim a summary synchronously, join one in flight, wait for any of a chain."""

    def running(self, namespace: str, prefix_hash: str) -> asyncio.Task[CompactedPrefix] | None:
        """This process's task for the summary, to join; None when there is none."""
        ...

    def start(self, namespace: str, prefix_hash: str, build: Build) -> asyncio.Task[CompactedPrefix]:
        """The summary's shared task, claimed now (no await): it returns the stored record if there is one, else
        builds one with `build` (once, across replicas where the store is shared) and stores it."""
        ...

    async def wait_for_any(self, namespace: str, chain: Sequence[str]) -> bool:
        """Wait for the longest prefix of `chain` being built (here or elsewhere); True if there was one."""
        ...

    def running_any(self, namespace: str, chain: Sequence[str]) -> bool:
        """Whether this process is building a summary of any prefix of `chain` (no await)."""
        ...


def _key(namespace: str, prefix_hash: str) -> str:
    return f"{namespace}:{prefix_hash}"


class _Records:
    """Store reads and writes for a flight that never raise: a failure is logged, counted and skipped."""

    def __init__(self, store: SummaryStore, on_error: ErrorCounter | None) -> None:
        self._store = store
        self._on_error = on_error

    def count(self, operation: str) -> None:
        if self._on_error is not None:
            self._on_error(operation)

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        try:
            return await self._store.get(namespace, prefix_hash)
        except Exception:  # a broken store must not break compaction
            log.warning("summary store read failed", exc_info=True)
            self.count("get")
            return None

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        try:
            await self._store.put(namespace, record)
        except Exception:
            log.warning("summary store write failed; the summary is used once", exc_info=True)
            self.count("put")

    async def stored_or_built(self, namespace: str, prefix_hash: str, build: Build) -> CompactedPrefix:
        stored = await self.get(namespace, prefix_hash)
        if stored is not None:
            return stored
        record = await build()
        await self.put(namespace, record)
        return record


class LocalFlights:
    """Single-flight within this process, over any store (memory, sqlite, or a shared one that is down)."""

    def __init__(self, store: SummaryStore, on_error: ErrorCounter | None = None) -> None:
        self._records = _Records(store, on_error)
        self._flights = SingleFlight()

    def running(self, namespace: str, prefix_hash: str) -> asyncio.Task[CompactedPrefix] | None:
        return self._flights.running(_key(namespace, prefix_hash))

    def start(self, namespace: str, prefix_hash: str, build: Build) -> asyncio.Task[CompactedPrefix]:
        return self._flights.start(_key(namespace, prefix_hash),
                                   lambda: self._records.stored_or_built(namespace, prefix_hash, build))

    async def wait_for_any(self, namespace: str, chain: Sequence[str]) -> bool:
        if not self._flights:  # nearly always: no summary is being built, and a long chain costs nothing
            return False
        return await self._flights.wait_for_any([_key(namespace, prefix) for prefix in reversed(chain)])

    def running_any(self, namespace: str, chain: Sequence[str]) -> bool:
        return bool(self._flights) and any(self._flights.in_flight(_key(namespace, prefix)) for prefix in chain)


class RedisFlights:
    """Single-flight across replicas: a local single-flight whose one call per key holds the store's lease.

    A replica that finds the lease held waits for the holder's announcement (polling as a fallback) and takes the
    lease over when the holder dies; with the store unreachable it builds alone, as LocalFlights would.
    """

    def __init__(self, store: LeaseStore, *, max_wait: float, poll_seconds: float | None = None,
                 on_error: ErrorCounter | None = None) -> None:
        if max_wait <= 0:
            raise ValueError("max_wait must be positive")
        self._store = store
        self._records = _Records(store, on_error)
        self._flights = SingleFlight()
        self._max_wait = max_wait
        # Polling only backs up the announcement (lost when a subscriber reconnects) and notices a dead holder.
        self._poll = poll_seconds if poll_seconds is not None else max(0.05, min(1.0, store.lock_ttl_seconds / 4))

    def running(self, namespace: str, prefix_hash: str) -> asyncio.Task[CompactedPrefix] | None:
        return self._flights.running(_key(namespace, prefix_hash))

    def start(self, namespace: str, prefix_hash: str, build: Build) -> asyncio.Task[CompactedPrefix]:
        return self._flights.start(_key(namespace, prefix_hash), lambda: self._across(namespace, prefix_hash, build))

    def running_any(self, namespace: str, chain: Sequence[str]) -> bool:
        return bool(self._flights) and any(self._flights.in_flight(_key(namespace, prefix)) for prefix in chain)

    async def wait_for_any(self, namespace: str, chain: Sequence[str]) -> bool:
        if self._flights and await self._flights.wait_for_any([_key(namespace, prefix) for prefix in reversed(chain)]):
            return True
        try:
            flying = await self._store.in_flight(namespace) if chain else frozenset()
        except StoreUnavailable:
            return False
        target = next((prefix for prefix in reversed(chain) if prefix in flying), None)
        if target is None:
            return False
        await self._until_landed(namespace, target)
        return True

    async def _across(self, namespace: str, prefix_hash: str, build: Build) -> CompactedPrefix:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait
        while True:
            try:
                claim = await self._store.acquire(namespace, prefix_hash)
            except StoreUnavailable:
                return await self._records.stored_or_built(namespace, prefix_hash, build)
            if isinstance(claim, CompactedPrefix):
                return claim
            if isinstance(claim, Lease):
                return await self._build_holding(claim, build)
            left = deadline - loop.time()
            if left <= 0:
                raise RemoteFailure(f"another replica was still building this summary after {self._max_wait:g}s")
            outcome = await self._store.wait(namespace, prefix_hash, claim.holder, min(self._poll, left))
            if outcome in (FAILED, CLOSED):
                raise RemoteFailure("another replica failed to build this summary" if outcome == FAILED
                                    else "the summary store closed while waiting for another replica")

    async def _build_holding(self, lease: Lease, build: Build) -> CompactedPrefix:
        building = asyncio.Event()
        building.set()
        renewal = asyncio.create_task(self._renew(lease, building))
        try:
            record = await build()
        except asyncio.CancelledError:
            await _stop(renewal, building)
            await self._release(lease, ABANDONED)
            raise
        except BaseException:
            await _stop(renewal, building)
            await self._release(lease, FAILED)
            raise
        await _stop(renewal, building)
        try:
            stored = await self._store.complete(lease, record)
        except StoreUnavailable:
            return record
        except Exception:  # a store that breaks must not keep the lease: every replica would wait
            log.error("summary store failed to take a summary; releasing its lease, the summary is used once",
                      exc_info=True)
            self._records.count("put")
            await self._release(lease, DROPPED)
            return record
        if not stored:
            self._lost(lease, "before the summary was stored; it is used once")
        return record

    async def _renew(self, lease: Lease, building: asyncio.Event) -> None:
        """Keep the lease while `building` is set (cleared, and the task cancelled, when the build ends); an
        unreachable store is retried at the next turn."""
        interval = self._store.lock_ttl_seconds / 3
        while building.is_set():
            await asyncio.sleep(interval)
            if not building.is_set():
                return
            try:
                if not await self._store.renew(lease):
                    self._lost(lease, "while building the summary")
                    return
            except StoreUnavailable:
                continue

    async def _release(self, lease: Lease, outcome: str) -> None:
        try:
            await self._store.release(lease, outcome)
        except StoreUnavailable:
            pass  # the lease expires by itself
        except Exception:  # nor may a failed release turn into the request's failure
            log.error("summary store failed to release a lease; it expires by itself", exc_info=True)
            self._records.count("release")

    async def _until_landed(self, namespace: str, prefix_hash: str) -> None:
        """Until the holder lets go or dies, at most max_wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait
        while (left := deadline - loop.time()) > 0:
            try:
                holder = await self._store.holder(namespace, prefix_hash)
            except StoreUnavailable:
                return
            if holder is None or await self._store.wait(namespace, prefix_hash, holder, min(self._poll, left)):
                return

    def _lost(self, lease: Lease, when: str) -> None:
        self._records.count("lease_lost")
        log.warning(json.dumps({"event": "summary_lease_lost", "token": lease.token, "when": when}))


async def _stop(task: asyncio.Task[None], running: asyncio.Event) -> None:
    """End a helper loop and let it finish, without swallowing a cancellation of the caller.

    The flag, not only the cancellation: Python 3.11's wait_for (redis-py writes through it) drops a cancellation
    that arrives as the awaited write completes, and a renewal that outlived its build would hold the lease forever.
    """
    running.clear()
    task.cancel()
    await asyncio.wait([task])


def open_flights(store: SummaryStore, *, max_wait: float, on_error: ErrorCounter | None = None) -> Flights:
    """Cross-replica single-flight for a store that grants leases, per-process single-flight for the others."""
    if isinstance(store, LeaseStore):
        return RedisFlights(store, max_wait=max_wait, on_error=on_error)
    return LocalFlights(store, on_error)
