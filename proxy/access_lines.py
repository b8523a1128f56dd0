"""The access log's lines: straight to the proxy's own log handler as it would write them, else as log records."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import time
from contextlib import nullcontext
from typing import Any, Protocol

import orjson

from proxy.log_filters import RedactSecrets, redact
from proxy.log_format import FIELDS_ATTRIBUTE, JsonLines, TextLines
from proxy.log_limits import RepeatLimiter

access_log = logging.getLogger("proxy.access")
# Held lines are written at once past this many characters, whatever the interval.
MAX_HELD = 64 * 1024


class _EventLines(Protocol):
    def event_line(self, created: float, level: str, name: str, message: str,
                   fields: dict[str, Any] | None) -> str: ...


class AccessLines:
    """Writes one line per request on the `proxy.access` logger.

    Through logging, each line costs a record, the logger's and the handler's dispatch, two filters and a
    formatter, then a write to stderr: together the largest single part of what the proxy adds to a small request.
    So while the proxy's own handler (proxy.cli.configure_logging's, with its HeldLines) is the only one a line
    would reach, the line is made for it directly: the same text, redacted the same way, after any summary its
    repeat limiter has ready, and held with the lines around it for one write. Any other arrangement (a test's
    capture, handlers a library user added) gets records. Which one applies is looked at on every line, so a
    handler added later is never skipped.
    """

    def __init__(self) -> None:
        self._seen: list[logging.Handler] = []
        self._direct: _Direct | None = None

    def write(self, level: int, fields: dict[str, Any]) -> None:
        if not access_log.isEnabledFor(level):
            return
        message = json_line(fields)
        direct = self._direct_now()
        if direct is not None and level >= direct.handler.level:
            direct.write(level, message, fields)
        elif direct is None:
            # The record made here rather than by log(): a line per request need not look up where it was logged
            # from (findCaller walks the stack), and carries its fields for a JSON formatter to use as they are.
            access_log.handle(access_log.makeRecord(access_log.name, level, __file__, 0, message, (), None,
                                                    extra={FIELDS_ATTRIBUTE: fields}))

    def _direct_now(self) -> _Direct | None:
        handlers = logging.root.handlers
        if handlers != self._seen:  # handlers compare by identity
            self._seen = list(handlers)
            self._direct = _Direct.for_handler(handlers[0]) if len(handlers) == 1 else None
        parent = access_log.parent
        if access_log.handlers or access_log.filters or not access_log.propagate or \
                (parent is not None and parent is not logging.root and (parent.handlers or not parent.propagate)):
            return None
        return self._direct


def json_line(fields: dict[str, Any]) -> str:
    try:
        return orjson.dumps(fields).decode()
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate in a path: json escapes it
        return json.dumps(fields)


class HeldLines(logging.Filter):
    """Access lines held for up to `seconds` and written to the handler's stream in one go (nginx's and Envoy's
    access logs buffer the same way): a write to stderr per request costs more than the line.

    It sits among the handler's filters, so every other record the handler gets writes the held lines first: the
    log keeps the order things happened in. Written too when MAX_HELD characters are held, and at exit; a process
    killed outright loses at most `seconds` of access lines. `seconds` 0 writes every line as it comes.
    """

    def __init__(self, handler: logging.StreamHandler[Any], seconds: float) -> None:
        super().__init__()
        self._handler = handler
        self._seconds = seconds
        self._held: list[str] = []
        self._size = 0
        self._timer = False

    def hold(self, text: str) -> None:
        with self._handler.lock or nullcontext():
            self._held.append(text)
            self._size += len(text)
            if self._seconds > 0 and self._size < MAX_HELD and (self._timer or self._timed()):
                return
        self.write()

    def _timed(self) -> bool:
        """Whether a write is now due in `seconds` (False where no event loop runs: write now)."""
        try:
            asyncio.get_running_loop().call_later(self._seconds, self.write)
        except RuntimeError:
            return False
        self._timer = True
        return True

    def filter(self, record: logging.LogRecord) -> bool:
        if self._held:
            self.write()
        return True

    def write(self) -> None:
        """Write what is held now (from any thread; at exit too)."""
        handler = self._handler
        with handler.lock or nullcontext():
            held, self._held, self._size, self._timer = self._held, [], 0, False
            if not held:
                return
            try:
                handler.stream.write("".join(held))
                handler.stream.flush()
            except (OSError, ValueError):  # a closed or broken stderr: the lines are lost, as logging would lose them
                pass

    @classmethod
    def install(cls, handler: logging.StreamHandler[Any], seconds: float) -> HeldLines:
        held = cls(handler, seconds)
        handler.addFilter(held)
        # Registered after logging's own shutdown hook, so it runs first, while the handler still writes.
        atexit.register(held.write)
        return held


class _Direct:
    """The proxy's stream handler, given the text its own emit() would write for a record of the line."""

    def __init__(self, handler: logging.StreamHandler[Any], lines: _EventLines, held: HeldLines) -> None:
        self.handler = handler
        self._lines = lines
        self._held = held
        self._limiters = [limiter for limiter in handler.filters if isinstance(limiter, RepeatLimiter)]

    @classmethod
    def for_handler(cls, handler: logging.Handler) -> _Direct | None:
        """Only a stream handler with the proxy's formatter, redaction and held lines, and no filter this does not
        know."""
        lines = handler.formatter
        filters = handler.filters
        known = all(isinstance(each, RedactSecrets | RepeatLimiter | HeldLines) for each in filters)
        redacted = any(isinstance(each, RedactSecrets) for each in filters)
        held = next((each for each in filters if isinstance(each, HeldLines)), None)
        if not isinstance(handler, logging.StreamHandler) or not isinstance(lines, TextLines | JsonLines) \
                or not (known and redacted) or held is None:
            return None
        return cls(handler, lines, held)

    def write(self, level: int, message: str, fields: dict[str, Any]) -> None:
        clean = redact(message)
        # As RedactSecrets does: redacted, the fields would still say what was taken out.
        text = self._lines.event_line(time.time(), logging.getLevelName(level), access_log.name, clean,
                                      fields if clean == message else None)
        for limiter in self._limiters:
            limiter.release_expired()
        self._held.hold(text + self.handler.terminator)
