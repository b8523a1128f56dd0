"""Client connections within the open-files limit: a reserve kept for the rest, the longest idle ones shed."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Protocol

from proxy.store.store_health import Clock, LogThrottle

log = logging.getLogger("proxy.client_connections")

# Descriptors the process holds beside connections: listening sockets, the event loop's, log and store files, the
# store's sockets, tokenizer files, DNS lookups (an idle proxy holds about ten).
HEADROOM = 64
# asyncio accepts up to a listen backlog (aiohttp's 128) of connections at once, before any is seen here.
ACCEPT_BURST = 128


class Connection(Protocol):
    def is_idle(self) -> bool:
        """No request in progress: waiting for a request head, or kept alive between requests."""
        ...

    def shed(self) -> None:
        """Close it now."""
        ...


def open_files_limit() -> int | None:
    """The soft open-files limit, None when there is none (or no way to know it)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def client_capacity(limit: int, max_connections: int) -> int:
    """How many client connections fit: the limit less a reserve for upstream connections (at most a quarter of the
    limit), the headroom and an accept burst; never fewer than an eighth of the limit."""
    reserve = min(max_connections, limit // 4) + HEADROOM + ACCEPT_BURST
    return max(limit - reserve, limit // 8)


def recommended_limit(max_connections: int) -> int:
    """Enough descriptors for as many busy clients as upstream connections, and the rest."""
    return 2 * max_connections + HEADROOM + ACCEPT_BURST


class ClientConnections:
    """The open client connections, the least recently active first. Past `capacity` (None: no limit), the longest
    idle ones are shed to make room for a new one: idle sockets must not hold every descriptor, or the proxy could
    neither accept a client nor connect upstream until their deadlines passed."""

    def __init__(self, capacity: int | None, *, limit: int | None, clock: Clock = time.monotonic) -> None:
        self._capacity, self._limit = capacity, limit
        self._open: OrderedDict[Connection, None] = OrderedDict()
        self._throttle = LogThrottle(clock)

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, connection: Connection) -> None:
        self._open[connection] = None
        if self._capacity is not None and len(self._open) > self._capacity:
            self._make_room(connection, len(self._open) - self._capacity)

    def active(self, connection: Connection) -> None:
        """It received bytes: the last to shed."""
        if connection in self._open:
            self._open.move_to_end(connection)

    def closed(self, connection: Connection) -> None:
        self._open.pop(connection, None)

    def _make_room(self, new: Connection, excess: int) -> None:
        shed = 0
        # One round at most; a busy connection goes to the back, so the next round starts among the idle ones.
        for _ in range(len(self._open) - 1):
            oldest = next(iter(self._open))
            if oldest is not new and oldest.is_idle():
                del self._open[oldest]
                oldest.shed()
                shed += 1
                if shed == excess:
                    break
            else:
                self._open.move_to_end(oldest)
        self._open.move_to_end(new)
        self._warn(shed)

    def _warn(self, shed: int) -> None:
        suppressed = self._throttle.allow("shed" if shed else "none idle")
        if suppressed is None:
            return
        more = f" ({suppressed} more times since the last report)" if suppressed else ""
        if shed:
            log.warning("%d client connections, the most the open files limit of %d leaves room for: closed the "
                        "longest idle one(s) to accept another%s; raise the limit (ulimit -n, LimitNOFILE)",
                        self._capacity, self._limit, more)
        else:
            log.warning("%d client connections, the most the open files limit of %d leaves room for, and none "
                        "idle: accepting another from the reserve for upstream connections%s; raise the limit "
                        "(ulimit -n, LimitNOFILE)", self._capacity, self._limit, more)
