"""Whether a shared store answered lately (back-off between probes while it does not), and how a store that
degrades instead of raising reports its failures: counted, and logged at a bounded rate."""

from __future__ import annotations

import logging
from collections.abc import Callable

Clock = Callable[[], float]
LOG_INTERVAL_SECONDS = 30.0


class StoreHealth:
    """Whether Redis answered lately; while it does not, calls fail fast until the next probe is due."""

    def __init__(self, clock: Clock, first_delay: float, max_delay: float) -> None:
        self._clock = clock
        self.first_delay, self.max_delay = first_delay, max_delay
        self.up = True
        self.since = clock()
        self.last_error = ""
        self._delay = first_delay
        self._retry_at = float("-inf")
        self._probing = False

    def may_try(self) -> bool:
        """True when up, or when a probe is due (one at a time; the others keep failing fast)."""
        if self.up:
            return True
        if self._probing or self._clock() < self._retry_at:
            return False
        self._probing = True
        return True

    def failed(self, error: str) -> bool:
        """Record an unreachable Redis; True when this failure is the one that takes it down."""
        now = self._clock()
        went_down = self.up
        if went_down:
            self.since, self._delay = now, self.first_delay
        elif now >= self._retry_at:
            self._delay = min(self._delay * 2, self.max_delay)  # a failed probe: back off further
        self.up, self._probing, self.last_error = False, False, error
        self._retry_at = now + self._delay
        return went_down

    def settle(self) -> None:
        """After any call: a probe cancelled midway must not hold back the next one."""
        self._probing = False

    def down_for(self) -> float:
        return 0.0 if self.up else self._clock() - self.since

    def succeeded(self) -> float | None:
        """Record an answer; the length of the outage this ends, if it ends one."""
        self._probing = False
        if self.up:
            return None
        self.up = True
        outage, self.since = self._clock() - self.since, self._clock()
        return outage


class LogThrottle:
    """At most one log line per kind of event per interval; the suppressed ones are counted into the next."""

    def __init__(self, clock: Clock, interval: float = LOG_INTERVAL_SECONDS) -> None:
        self._clock, self._interval = clock, interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def allow(self, kind: str) -> int | None:
        """None to stay quiet; else how many lines of this kind were suppressed since the last one."""
        now = self._clock()
        if now - self._last.get(kind, float("-inf")) < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._suppressed.pop(kind, 0)


class FailureReports:
    """A store's failures: each counted through `on_error(operation)` (store_errors_total), and logged at most once
    per kind per interval, with how many were left out since."""

    def __init__(self, logger: logging.Logger, on_error: Callable[[str], None] | None, clock: Clock) -> None:
        self._log, self._on_error, self._throttle = logger, on_error, LogThrottle(clock)

    def count(self, operation: str) -> None:
        if self._on_error is not None:
            self._on_error(operation)

    def warn(self, kind: str, message: str, *args: object) -> None:
        suppressed = self._throttle.allow(kind)
        if suppressed is not None:
            self._log.warning(message + (f" ({suppressed} more since the last report)" if suppressed else ""), *args)
