"""Calling Redis for a store that degrades: the client, fail-fast while it is down, every failure reported."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.log_filters import mask_url
from proxy.store.flights import ErrorCounter, StoreUnavailable
from proxy.store.store_health import Clock, FailureReports, StoreHealth

T = TypeVar("T")
HealthListener = Callable[[bool], None]
# Errors that mean "Redis is not there" (down, unreachable, refusing our credentials), as opposed to a refused command.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)
_HEALTH_CHECK_SECONDS = 15


def redis_client(url: str, username: str | None, password: str | None, timeout_seconds: float) -> aioredis.Redis:
    """A client that gives up on a call after `timeout_seconds` and reconnects by itself (bytes in, bytes out)."""
    # One quick retry on a fresh connection absorbs a pooled socket that died with a Redis restart; more would
    # only make an outage slower to notice. Our own back-off (StoreHealth) takes it from there.
    return aioredis.from_url(
        url, username=username, password=password, socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds, retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],  # redis-py retries only what is listed
        health_check_interval=_HEALTH_CHECK_SECONDS, decode_responses=False)


def url_password(url: str) -> str | None:
    """The password a Redis url carries (in its userinfo or its query), so that errors can be scrubbed of it."""
    parts = urlsplit(url)
    from_query = dict(parse_qsl(parts.query)).get("password")
    return parts.password or from_query or None


@dataclass(frozen=True)
class Wording:
    """How one caller's log lines and errors read: they name it, and say what an outage costs it."""

    noun: str  # starts every log line: "redis store", "redis journal"
    closed: str  # the StoreUnavailable of a call after close()
    while_down: str  # the first line of an outage says what goes missing until Redis answers again


class RedisCalls:
    """One caller's calls to Redis. Each call fails fast while Redis is down (between StoreHealth's probes); a
    failure is counted through `on_error(operation)`, logged at a bounded rate with the password scrubbed out, and
    raised as StoreUnavailable. `on_health` hears when Redis goes down (False) and when it answers again (True)."""

    def __init__(self, url: str, password: str | None, wording: Wording, log: logging.Logger, *,
                 on_error: ErrorCounter | None, clock: Clock, retry_delays: tuple[float, float],
                 on_health: HealthListener | None = None) -> None:
        self.url = mask_url(url)
        self.wording = wording
        self.health = StoreHealth(clock, *retry_delays)
        self.failures = FailureReports(log, on_error, clock)
        self.closed = False
        self._log = log
        self._on_health = on_health
        self._secrets = tuple(secret for secret in (password, url_password(url)) if secret)

    async def attempt(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis call; StoreUnavailable (counted, logged) instead of any Redis error."""
        if self.closed:
            raise StoreUnavailable(self.wording.closed)
        if not self.health.may_try():  # failing fast while Redis is down: counted, not logged again
            self.failures.count(operation)
            raise StoreUnavailable(self.health.last_error)
        try:
            result = await work()
        except UNREACHABLE as error:
            self.failed(operation, error)
            raise StoreUnavailable(self.health.last_error) from None
        except RedisError as error:  # Redis answered but refused (out of memory, no permission, a script error)
            self.answered()
            self.failures.count(operation)
            self.failures.warn(operation, f"{self.wording.noun} %s failed on %s: %s", operation, self.url,
                               self.describe(error))
            raise StoreUnavailable(self.describe(error)) from None
        finally:
            self.health.settle()
        self.answered()
        return result

    async def quietly(self, operation: str, work: Callable[[], Awaitable[T]]) -> T | None:
        """As attempt, with None for a failure: it is counted and logged there, and the caller goes on without."""
        try:
            return await self.attempt(operation, work)
        except StoreUnavailable:
            return None

    def failed(self, operation: str, error: BaseException, *, count: bool = True) -> None:
        """Redis did not answer: the failure that takes it down is logged at once, the ones after at a bounded rate.
        `count=False` for a probe of health, which is not an operation that failed."""
        if count:
            self.failures.count(operation)
        description = self.describe(error)
        noun = self.wording.noun
        if self.health.failed(description):
            self._log.warning(f"{noun} %s unreachable (%s): {self.wording.while_down}", self.url, description)
            if self._on_health is not None:
                self._on_health(False)
        else:
            self.failures.warn(f"down:{operation}", f"{noun} %s still unreachable (%s: %s)", self.url, operation,
                               description)

    def answered(self) -> None:
        """Redis answered: the end of an outage, if this is one, is logged and heard by `on_health`."""
        outage = self.health.succeeded()
        if outage is not None:
            self._log.warning(f"{self.wording.noun} %s reachable again after %.1fs of outage", self.url, outage)
            if self._on_health is not None:
                self._on_health(True)

    def describe(self, error: BaseException) -> str:
        """The error's type and message, with anything that looks like our password scrubbed out."""
        text = f"{type(error).__name__}: {error}"
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text
