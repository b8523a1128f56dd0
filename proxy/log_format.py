"""Log lines as the operator asked for them: text (time, level, logger, message), or one JSON object a line."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

TEXT = "%(asctime)s %(levelname)s {who}%(name)s %(message)s"
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
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name}
        if self._worker is not None:
            line["worker"] = self._worker
        message = record.getMessage()
        event = _event(message)
        if event is None:
            line["message"] = message
        else:
            line.update({f"event_{key}" if key in _BASE else key: value for key, value in event.items()})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _event(message: str) -> dict[str, Any] | None:
    """The message's fields when it is one JSON object (the proxy's event lines are), else None."""
    if not message.startswith("{"):
        return None
    try:
        value = json.loads(message)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def formatter(kind: str, worker: int | None = None) -> logging.Formatter:
    """The formatter for `logging.format`: "json", or "text" (anything else)."""
    if kind == "json":
        return JsonLines(worker)
    return logging.Formatter(TEXT.format(who="" if worker is None else f"worker-{worker} "))
