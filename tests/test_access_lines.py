"""Access lines written straight to the proxy's own handler read exactly as its records would, keep the log's
order when held, and give way to records whenever any other handler could see them."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from proxy.access_lines import MAX_HELD, AccessLines, HeldLines, access_log, json_line
from proxy.log_filters import RedactSecrets
from proxy.log_format import FIELDS_ATTRIBUTE, formatter
from proxy.log_limits import RepeatLimiter

CLEAN = {"event": "request", "request_id": "a" * 32, "method": "POST", "route": "chat",
         "path": "/v1/chat/completions", "status": 200, "duration_ms": 0.7, "stream": False, "model": "m"}
SECRET = {**CLEAN, "path": "/v1/sk-abcdefghijklmnop/chat"}
ODD = {**CLEAN, "path": "/v1/\ud800"}  # what orjson refuses: json spells it


def proxy_handler(kind: str, worker: int | None, seconds: float) -> tuple[logging.StreamHandler[io.StringIO],
                                                                          HeldLines]:
    """A handler as proxy.cli.configure_logging leaves stderr's, writing to a string."""
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(formatter(kind, worker))
    handler.addFilter(RedactSecrets())
    handler.addFilter(RepeatLimiter(handler))
    held = HeldLines(handler, seconds)
    handler.addFilter(held)
    return handler, held


@contextmanager
def only(*handlers: logging.Handler, level: int = logging.DEBUG) -> Iterator[None]:
    """The root logger with exactly these handlers (pytest's own capture set aside), as it was afterwards."""
    root = logging.getLogger()
    saved, saved_level = root.handlers[:], root.level
    root.handlers[:] = list(handlers)
    root.setLevel(level)
    try:
        yield
    finally:
        root.handlers[:] = saved
        root.setLevel(saved_level)


def without_time(kind: str, line: str) -> Any:
    if kind == "json":
        parsed = json.loads(line)
        parsed.pop("time")
        return parsed
    return line[len("2026-12-06 10:00:00,000 "):]


@pytest.mark.parametrize("kind", ["text", "json"])
@pytest.mark.parametrize("worker", [None, 3])
@pytest.mark.parametrize("fields", [CLEAN, SECRET, ODD], ids=["clean", "secret", "odd"])
def test_a_direct_line_reads_as_its_record_would(kind: str, worker: int | None, fields: dict[str, Any]) -> None:
    direct_handler, _ = proxy_handler(kind, worker, 0)
    record_handler, _ = proxy_handler(kind, worker, 0)
    with only(direct_handler):
        AccessLines().write(logging.INFO, fields)
    message = json_line(fields)  # the message the proxy gives its records
    record = logging.LogRecord(access_log.name, logging.INFO, __file__, 0, message, (), None)
    setattr(record, FIELDS_ATTRIBUTE, fields)
    record_handler.handle(record)
    direct, recorded = direct_handler.stream.getvalue(), record_handler.stream.getvalue()
    assert direct.count("\n") == recorded.count("\n") == 1
    assert without_time(kind, direct) == without_time(kind, recorded)
    assert "abcdefghijklmnop" not in direct


def test_the_time_is_the_formatters_own() -> None:
    created = 1_700_000_000.25
    record = logging.LogRecord(access_log.name, logging.INFO, __file__, 0, "x", (), None)
    record.created, record.msecs = created, 250.0
    for kind in ("text", "json"):
        lines = formatter(kind)
        assert lines.event_line(created, "INFO", access_log.name, "x", None) == lines.format(record)  # type: ignore[attr-defined]


async def test_held_lines_wait_then_go_in_one_write_and_another_record_sends_them_first() -> None:
    handler, _ = proxy_handler("text", None, 0.2)
    lines = AccessLines()
    with only(handler):
        for index in range(3):
            lines.write(logging.INFO, {**CLEAN, "status": 200 + index})
        assert handler.stream.getvalue() == ""  # held
        logging.getLogger("proxy.relay").warning("something happened")
        written = handler.stream.getvalue().splitlines()
        assert [line.split(" ", 4)[3] for line in written] == ["proxy.access"] * 3 + ["proxy.relay"]
        lines.write(logging.INFO, CLEAN)
        assert handler.stream.getvalue().count("\n") == 4
        await asyncio.sleep(0.4)
        assert handler.stream.getvalue().count("\n") == 5  # the interval wrote it


async def test_a_large_batch_is_written_at_once() -> None:
    handler, _ = proxy_handler("json", None, 5)
    lines = AccessLines()
    with only(handler):
        count = 0
        while handler.stream.getvalue() == "":
            lines.write(logging.INFO, CLEAN)
            count += 1
            assert count < MAX_HELD  # every line is over a character long
    written = handler.stream.getvalue()
    assert len(written) >= MAX_HELD > len(written) - len(written.splitlines()[-1]) - 1  # the line that reached it
    assert [json.loads(line)["status"] for line in handler.stream.getvalue().splitlines()] == [200] * count


def test_no_event_loop_writes_at_once_and_zero_seconds_never_holds() -> None:
    for seconds in (0.5, 0):
        handler, _ = proxy_handler("text", None, seconds)
        with only(handler):
            AccessLines().write(logging.INFO, CLEAN)
        assert handler.stream.getvalue().count("\n") == 1


async def test_records_go_through_logging_while_another_handler_could_see_them(
        caplog: pytest.LogCaptureFixture) -> None:
    handler, _ = proxy_handler("text", None, 0)
    lines = AccessLines()
    caplog.set_level(logging.INFO, logger=access_log.name)
    lines.write(logging.INFO, CLEAN)  # pytest's capture is on the root: a record
    assert [record.name for record in caplog.records] == [access_log.name]
    with only(handler):
        lines.write(logging.INFO, {**CLEAN, "status": 201})  # the proxy's handler alone: direct
        extra = logging.StreamHandler(io.StringIO())
        access_log.addHandler(extra)
        try:
            lines.write(logging.INFO, {**CLEAN, "status": 202})  # a handler added since: records again
        finally:
            access_log.removeHandler(extra)
    assert '"status":201' in handler.stream.getvalue().replace(" ", "")
    assert '"status":202' in extra.stream.getvalue().replace(" ", "")
    assert handler.stream.getvalue().count("\n") == 2


def test_an_unknown_filter_or_formatter_keeps_records() -> None:
    handler, _ = proxy_handler("text", None, 0)
    handler.addFilter(lambda record: "drop" not in record.getMessage())
    with only(handler):
        AccessLines().write(logging.INFO, {**CLEAN, "path": "/v1/drop"})
    assert handler.stream.getvalue() == ""  # the operator's filter saw it
    plain = logging.StreamHandler(io.StringIO())
    plain.addFilter(RedactSecrets())
    with only(plain):
        AccessLines().write(logging.INFO, CLEAN)
    assert plain.stream.getvalue().strip() == json_line(CLEAN)


def test_levels_are_honoured() -> None:
    handler, _ = proxy_handler("text", None, 0)
    with only(handler, level=logging.INFO):
        AccessLines().write(logging.DEBUG, CLEAN)  # a probe's line
    assert handler.stream.getvalue() == ""
    handler.setLevel(logging.WARNING)
    with only(handler, level=logging.DEBUG):
        AccessLines().write(logging.INFO, CLEAN)
    assert handler.stream.getvalue() == ""


def test_a_closed_stream_loses_the_line_not_the_request() -> None:
    handler, _ = proxy_handler("text", None, 0)
    handler.stream.close()
    with only(handler):
        AccessLines().write(logging.INFO, CLEAN)  # raises nothing


async def test_threads_logging_beside_held_lines_leave_every_line_whole() -> None:
    handler, held = proxy_handler("json", None, 0.01)
    lines = AccessLines()
    stop = threading.Event()

    def warn() -> None:
        other = logging.getLogger("proxy.offload")
        while not stop.is_set():
            other.warning("from a thread %s", "x" * 200)

    with only(handler):
        thread = threading.Thread(target=warn)
        thread.start()
        try:
            for index in range(2000):
                lines.write(logging.INFO, {**CLEAN, "status": index})
                if index % 50 == 0:
                    await asyncio.sleep(0)
        finally:
            stop.set()
            thread.join()
        held.write()
    parsed = [json.loads(line) for line in handler.stream.getvalue().splitlines()]  # each whole, or this fails
    statuses = [line["status"] for line in parsed if line["logger"] == access_log.name]
    assert statuses == list(range(2000))  # none lost, in order
    assert any(line["logger"] == "proxy.offload" for line in parsed)


def test_a_summary_the_limiter_has_ready_comes_before_the_next_access_line() -> None:
    now = [1000.0]
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(formatter("text"))
    handler.addFilter(RedactSecrets())
    handler.addFilter(RepeatLimiter(handler, burst=1, interval=10, clock=lambda: now[0]))
    handler.addFilter(HeldLines(handler, 0))
    with only(handler):
        for _ in range(3):
            logging.getLogger("proxy.store").warning("the store is down")
        now[0] += 11
        AccessLines().write(logging.INFO, CLEAN)
    written = [line.split(" ", 4)[4] for line in handler.stream.getvalue().splitlines()]
    assert written == ["the store is down", "suppressed 2 similar records in the last 11s: the store is down",
                       json_line(CLEAN)]
