"""proxy.store.redis_calls: one caller's calls to Redis (fail fast while down, failures counted, logged, scrubbed),
driven by calls that fail as redis-py's do; no server needed."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoPermissionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.store.flights import StoreUnavailable
from proxy.store.redis_calls import RedisCalls, Wording
from tests.store.test_store_health import Clock

LOGGER = "proxy.test_redis_calls"
WORDING = Wording("redis journal", "the journal is closed", "journal entries are not kept until it answers")
URL = "redis://:hunter2@127.0.0.1:6390/0"
DELAYS = (0.5, 8.0)


@dataclass
class Caller:
    """A RedisCalls with what it reports to: its clock, the failures it counted and the health it announced."""

    clock: Clock = field(default_factory=Clock)
    errors: Counter[str] = field(default_factory=Counter)
    heard: list[bool] = field(default_factory=list)

    def calls(self, url: str = URL, password: str | None = None) -> RedisCalls:
        return RedisCalls(url, password, WORDING, logging.getLogger(LOGGER), on_error=self.count, clock=self.clock,
                          retry_delays=DELAYS, on_health=self.heard.append)

    def count(self, operation: str) -> None:
        self.errors[operation] += 1


class Work:
    """A Redis call that answers `value`, or raises `error`; it remembers how often it ran."""

    def __init__(self, error: BaseException | None = None, value: object = b"OK") -> None:
        self.error, self.value, self.runs = error, value, 0

    async def __call__(self) -> object:
        self.runs += 1
        if self.error is not None:
            raise self.error
        return self.value


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER]


async def down(calls: RedisCalls) -> None:
    """Take Redis down for `calls`, as a call that finds it unreachable does."""
    with pytest.raises(StoreUnavailable):
        await calls.attempt("probe", Work(RedisConnectionError("Connection refused")))


@pytest.mark.parametrize(("url", "password", "error", "described"), [
    ("redis://127.0.0.1:6390/0", "hunter2", RedisConnectionError("AUTH hunter2 refused"),
     "ConnectionError: AUTH *** refused"),
    (URL, None, RedisConnectionError(f"Error connecting to {URL}"),
     "ConnectionError: Error connecting to redis://:***@127.0.0.1:6390/0"),
    ("redis://127.0.0.1:6390/0?password=hunter2", None, ResponseError("bad password hunter2, hunter2"),
     "ResponseError: bad password ***, ***"),
    ("redis://127.0.0.1:6390/0", None, ConnectionRefusedError(111, "Connection refused"),
     "ConnectionRefusedError: [Errno 111] Connection refused"),
], ids=["given", "in-the-url", "in-the-query", "none"])
def test_a_described_error_has_the_password_scrubbed_out(url: str, password: str | None, error: BaseException,
                                                         described: str) -> None:
    calls = Caller().calls(url, password)
    assert calls.describe(error) == described
    assert "hunter2" not in calls.url


async def test_a_closed_caller_does_not_call_redis() -> None:
    caller = Caller()
    calls = caller.calls()
    calls.closed = True
    work = Work()
    with pytest.raises(StoreUnavailable) as raised:
        await calls.attempt("journal_read", work)
    assert str(raised.value) == "the journal is closed"
    assert await calls.quietly("journal_point", work) is None
    assert work.runs == 0 and not caller.errors and calls.health.up


@pytest.mark.parametrize("operation", ["journal_read", "journal_point", "acquire"])
async def test_calls_fail_fast_while_redis_is_down(operation: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caller = Caller()
    calls = caller.calls()
    await down(calls)
    caplog.clear()
    work = Work()
    with pytest.raises(StoreUnavailable) as raised:
        await calls.attempt(operation, work)
    assert work.runs == 0, "no call before the probe is due"
    assert str(raised.value) == calls.health.last_error == "ConnectionError: Connection refused"
    assert caller.errors[operation] == 1 and warnings(caplog) == [], "counted, not logged again"


@pytest.mark.parametrize("error", [RedisConnectionError("Connection refused by hunter2"),
                                   RedisTimeoutError("Timeout reading from socket"),
                                   OSError(113, "No route to host"), TimeoutError()],
                         ids=lambda error: type(error).__name__)
async def test_an_unreachable_redis_is_counted_and_takes_it_down(error: BaseException,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caller = Caller()
    calls = caller.calls(password="hunter2")
    with pytest.raises(StoreUnavailable) as raised:
        await calls.attempt("journal_read", Work(error))
    description = calls.describe(error)
    assert str(raised.value) == description and "hunter2" not in description
    assert caller.errors == {"journal_read": 1} and not calls.health.up and caller.heard == [False]
    assert warnings(caplog) == [f"redis journal {calls.url} unreachable ({description}): journal entries are not "
                                "kept until it answers"]
    caller.clock.now += DELAYS[0]  # the probe is due, and fails too: logged as still down, not heard again
    with pytest.raises(StoreUnavailable):
        await calls.attempt("journal_point", Work(error))
    assert warnings(caplog)[1:] == [f"redis journal {calls.url} still unreachable (journal_point: {description})"]
    assert caller.errors == {"journal_read": 1, "journal_point": 1} and caller.heard == [False]


@pytest.mark.parametrize("error", [ResponseError("OOM command not allowed when used memory > 'maxmemory'"),
                                   NoPermissionError("this user has no permissions to run the 'evalsha' command"),
                                   DataError("Invalid input of type: 'NoneType'")],
                         ids=lambda error: type(error).__name__)
async def test_a_refusal_is_counted_while_redis_counts_as_reachable(error: BaseException,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caller = Caller()
    calls = caller.calls()
    with pytest.raises(StoreUnavailable) as raised:
        await calls.attempt("journal_record", Work(error))
    description = calls.describe(error)
    assert str(raised.value) == description
    assert caller.errors == {"journal_record": 1} and calls.health.up and caller.heard == []
    assert warnings(caplog) == [f"redis journal journal_record failed on {calls.url}: {description}"]


@pytest.mark.parametrize(("answer", "value"), [(Work(value=b"PONG"), b"PONG"),
                                               (Work(ResponseError("NOSCRIPT No matching script")), None)],
                         ids=["answered", "refused"])
async def test_any_answer_ends_an_outage(answer: Work, value: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caller = Caller()
    calls = caller.calls()
    await down(calls)
    caller.clock.now += 2.0
    assert await calls.quietly("journal_read", answer) == value
    assert calls.health.up and caller.heard == [False, True]
    assert f"redis journal {calls.url} reachable again after 2.0s of outage" in warnings(caplog)


async def test_a_probe_of_health_that_fails_is_not_counted() -> None:
    caller = Caller()
    calls = caller.calls()
    calls.failed("ping", RedisConnectionError("Connection refused"), count=False)
    assert not calls.health.up and caller.heard == [False] and not caller.errors
