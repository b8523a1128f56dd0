"""A free TCP port on 127.0.0.1, for the servers the tests and benchmarks start (proxies, Redis, model servers)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel just handed out; the caller binds it next (a tiny race every port-0-less server has)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
