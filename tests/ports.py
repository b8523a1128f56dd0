"""Ports on 127.0.0.1 for the servers the tests and benchmarks start: one free now, or the one a proxy says it took."""

from __future__ import annotations

import re
import socket
from pathlib import Path

# What the proxy logs once its socket is bound (proxy.cli.serve), in either log format: with port 0, the port the
# kernel gave it.
_LISTENING = re.compile(r"listening on https?://[^\s,\"]*:(\d+)")
# Where the line is looked for: it comes within the first lines a start writes.
_HEAD_BYTES = 64 * 1024


def free_port() -> int:
    """A port the kernel just handed out; the caller binds it next (a tiny race every port-0-less server has)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def said_port(log: Path, since: int = 0) -> int | None:
    """The port a proxy's log file says it listens on, in what was written from byte `since` on (a restart appends
    to its log), if it has said so yet. A proxy started on port 0 takes one no other process can take first, as a
    port picked beforehand (free_port) can be between the pick and the bind."""
    try:
        with log.open("rb") as file:
            file.seek(since)
            head = file.read(_HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    found = _LISTENING.search(head)
    return int(found.group(1)) if found else None
