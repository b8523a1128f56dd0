"""Rate-limited warnings and errors: a flood of identical records becomes a few lines and one count of the rest."""

from __future__ import annotations

import atexit
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Identical records (same logger, level, call site and message template) let through per interval.
BURST = 5
INTERVAL = 60.0
# Distinct call sites tracked at once; the oldest is forgotten (its count reported) beyond this.
MAX_TRACKED = 1024
_SUMMARY_ATTRIBUTE = "rate_limit_summary"
# `log.error(..., extra=EXEMPT)`: a record that must be seen every time (each says something the operator has to
# act on, such as a refused config reload and its reason) passes, uncounted.
EXEMPT_ATTRIBUTE = "rate_limit_exempt"
EXEMPT: Mapping[str, object] = MappingProxyType({EXEMPT_ATTRIBUTE: True})
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")

_Key = tuple[str, int, str, int, str]


@dataclass
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0
    # The first suppressed record's first line; the record itself is not kept (its traceback holds frames).
    first_line: str = ""


class RepeatLimiter(logging.Filter):
    """A handler filter: at most `burst` identical records of WARNING and above per `interval` seconds, then one
    "suppressed N similar" line when that interval is over (written before the next record the handler gets)."""

    def __init__(self, handler: logging.Handler, *, burst: int = BURST, interval: float = INTERVAL,
                 level: int = logging.WARNING, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._handler = handler
        self._burst = burst
        self._interval = interval
        self._level = level
        self._clock = clock
        self._windows: OrderedDict[_Key, _Window] = OrderedDict()
        # When the oldest interval is over: until then none is, and a line passing by need not look (the access
        # log passes by on every request, and any warning in the last interval keeps a window open).
        self._due = math.inf
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY_ATTRIBUTE, False):
            return True
        self.release_expired()
        if bool(getattr(record, EXEMPT_ATTRIBUTE, False)) or record.levelno < self._level:
            return True  # nothing is limited below the level (one line per request)
        with self._lock:
            return self._admit(_key(record), record, self._clock())

    def release_expired(self) -> None:
        """Report the intervals that are over, before any record (filter() calls it; so do lines written past the
        handler's filters, proxy.access_lines, which would otherwise hold a summary back until the next record)."""
        if not self._windows or (self._clock() < self._due and len(self._windows) <= MAX_TRACKED):
            return
        with self._lock:
            summaries = self._expire(self._clock())
        for summary in summaries:
            self._handler.handle(summary)  # outside the lock: the summary passes this filter again

    def flush(self) -> None:
        """Report every count still pending, whatever its interval (at shutdown)."""
        with self._lock:
            now = self._clock()
            summaries = [summary for key, window in self._windows.items() if (summary := _summary(key, window, now))]
            self._windows.clear()
            self._due = math.inf
        for summary in summaries:
            self._handler.handle(summary)

    def _admit(self, key: _Key, record: logging.LogRecord, now: float) -> bool:
        window = self._windows.get(key)
        if window is None:
            if not self._windows:
                self._due = now + self._interval
            window = self._windows[key] = _Window(now)
        window.passed += 1
        if window.passed <= self._burst:
            return True
        if not window.suppressed:
            window.first_line = record.getMessage().partition("\n")[0][:200]
        window.suppressed += 1
        return False

    def _expire(self, now: float) -> list[logging.LogRecord]:
        """Close the intervals that are over (and the oldest beyond MAX_TRACKED); their summaries, if any."""
        summaries = []
        for key in list(self._windows):
            window = self._windows[key]
            if now - window.started < self._interval and len(self._windows) <= MAX_TRACKED:
                break  # ordered by start: the rest started later
            del self._windows[key]
            if (summary := _summary(key, window, now)) is not None:
                summaries.append(summary)
        oldest = next(iter(self._windows.values()), None)
        self._due = math.inf if oldest is None else oldest.started + self._interval
        return summaries


def _key(record: logging.LogRecord) -> _Key:
    # asyncio formats its own messages (a handle's repr, with addresses and times), so "identical" means the same
    # first line once numbers are blanked, not the same template.
    first_line = str(record.msg).partition("\n")[0][:300]
    return record.name, record.levelno, record.pathname, record.lineno, _NUMBERS.sub("#", first_line)


def _summary(key: _Key, window: _Window, now: float) -> logging.LogRecord | None:
    if not window.suppressed:
        return None
    name, level, pathname, lineno, _ = key
    summary = logging.LogRecord(
        name, level, pathname, lineno, "suppressed %d similar records in the last %.0fs: %s",
        (window.suppressed, now - window.started, window.first_line), None)
    setattr(summary, _SUMMARY_ATTRIBUTE, True)
    return summary


def install(handlers: Iterable[logging.Handler] | None = None, *, burst: int = BURST,
            interval: float = INTERVAL) -> list[RepeatLimiter]:
    """Add a limiter to each of `handlers` (default: the root logger's, which every propagated record reaches)."""
    added = []
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(existing, RepeatLimiter) for existing in handler.filters):
            limiter = RepeatLimiter(handler, burst=burst, interval=interval)
            # Registered after logging's own shutdown hook, so it runs first, while the handler still writes.
            atexit.register(limiter.flush)
            handler.addFilter(limiter)
            added.append(limiter)
    return added
