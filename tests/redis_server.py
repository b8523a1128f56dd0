"""The redis-server fixtures: a throwaway server per test (tests.fakes.redis_process), none is a failure."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.fakes.redis_process import PASSWORD, MissingRedis, RedisServer, find_redis

__all__ = ["PASSWORD", "RedisServer", "redis_binary", "redis_server", "secured_redis"]


def redis_binary(environ: Mapping[str, str] = os.environ, scripts: str = sysconfig.get_path("scripts")) -> str:
    """tests.fakes.redis_process.find_redis, a missing binary failing the test: a skip would hide an install step."""
    try:
        return find_redis(environ, scripts)
    except MissingRedis as error:
        pytest.fail(str(error))


def _started(server: RedisServer) -> RedisServer:
    try:
        server.start()
    except MissingRedis as error:
        pytest.fail(str(error))
    return server


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = _started(RedisServer(tmp_path))
    yield server
    server.stop()


@pytest.fixture
def secured_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = _started(RedisServer(tmp_path, password=PASSWORD, user=("proxy", PASSWORD + "-acl")))
    yield server
    server.stop()
