"""Ports on 127.0.0.1 for the servers the tests and benchmarks start: one free now, or the one a proxy says it took."""

from __future__ import annotations

import re
import socket

# What the proxy logs once its socket is bound (proxy.cli.serve), in either log format: with port 0, the port the
# kernel gave it.
_LISTENING = re.compile(r"listening on https?://[^\s,\"]*:(\d+)")


def free_port() -> int:
    """A port the kernel just handed out; the caller binds it next (a tiny race every port-0-less server has)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def said_port(log: str) -> int | None:
    """The port a proxy's log says it listens on, if it has said so yet. A proxy started on port 0 takes one no
    other process can take first, as a port picked beforehand (free_port) can be between the pick and the bind."""
    found = _LISTENING.search(log)
    return int(found.group(1)) if found else None
