"""Log lines as the operator asked for them: text (time, level, logger, message), or one JSON object a line."""

from __future__ import annotations

import datetime
import json
import logging
import time
from typing import Any

import orjson

TEXT = "%(asctime)s %(levelname)s {who}%(name)s %(message)s"
# A record's event fields as a dict, beside its message (the same fields as JSON): a JSON formatter uses them
# rather than parsing the message again. Redaction drops them from a record whose message it changed.
FIELDS_ATTRIBUTE = "event_fields"
# The keys every JSON line opens with; an event's own key of the same name is kept as event_<key>.
_BASE = ("time", "level", "logger", "worker")


class JsonLines(logging.Formatter):
    """Each record as one JSON object: time (UTC, ISO 8601), level, logger, the worker when there are several, and
    either the event's own fields (a message that is a JSON object: the access log, compaction events) or
    `message`; an exception's traceback as `exception`. Nothing before the object, so a collector reads the
    line as it is."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, FIELDS_ATTRIBUTE, None)
        line = self._line(record.created, record.levelname, record.name, record.getMessage(),
                          fields if isinstance(fields, dict) else None)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _dumped(line)

    def event_line(self, created: float, level: str, name: str, message: str, fields: dict[str, Any] | None) -> str:
        """What format() makes of a record of an event (the access log's), without the record."""
        return _dumped(self._line(created, level, name, message, fields))

    def _line(self, created: float, level: str, name: str, message: str,
              fields: dict[str, Any] | None) -> dict[str, Any]:
        """The line's opening, then the event's fields (`fields`, or the message read as one) or `message`."""
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": level, "logger": name}
        if self._worker is not None:
            line["worker"] = self._worker
        event = fields if fields is not None else _event(message)
        if event is None:
            line["message"] = message
        else:
            line.update({f"event_{key}" if key in _BASE else key: value for key, value in event.items()})
        return line


def _dumped(line: dict[str, Any]) -> str:
    try:
        return orjson.dumps(line, default=str).decode()
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an integer past 64 bits: json spells them
        return json.dumps(line, ensure_ascii=False, default=str)


def _event(message: str) -> dict[str, Any] | None:
    """The message's fields when it is one JSON object (the proxy's event lines are), else None."""
    if not message.startswith("{"):
        return None
    try:
        value = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class TextLines(logging.Formatter):
    """Time, level, logger and message, with the time's seconds formatted once a second rather than per record
    (the access log writes a line per request)."""

    def __init__(self, who: str = "") -> None:
        super().__init__(TEXT.format(who=who))
        self._who = who
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self._stamp(record.created, record.msecs)

    def event_line(self, created: float, level: str, name: str, message: str, fields: dict[str, Any] | None) -> str:
        """What format() makes of a record without a traceback, without the record."""
        return f"{self._stamp(created, _msecs(created))} {level} {self._who}{name} {message}"

    def _stamp(self, created: float, msecs: float) -> str:
        second, text = self._second
        if int(created) != second:  # one tuple swapped whole: safe from any thread
            second = int(created)
            text = time.strftime(self.default_time_format, self.converter(created))
            self._second = (second, text)
        return f"{text},{int(msecs):03d}"  # logging's default_msec_format


def _msecs(created: float) -> float:
    # As logging.LogRecord computes them from the same time.time().
    return int((created - int(created)) * 1000) + 0.0


def formatter(kind: str, worker: int | None = None) -> logging.Formatter:
    """The formatter for `logging.format`: "json", or "text" (anything else)."""
    if kind == "json":
        return JsonLines(worker)
    return TextLines("" if worker is None else f"worker-{worker} ")
