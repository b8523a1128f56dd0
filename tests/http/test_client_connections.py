"""Client connections within the open-files limit: the real program under a low limit, and the shedding logic."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from proxy.http.client_connections import ACCEPT_BURST, HEADROOM, ClientConnections, client_capacity
from tests.e2e.test_timeouts import closed_by_peer, open_idle_sockets, proxy_process
from tests.fakes.openai_upstream import FakeUpstream

LIMIT = 256
IDLE_SOCKETS = 300
SHED_WARNING = f"the open files limit of {LIMIT}"


def limited_config(fake: FakeUpstream, event_loop: str, max_connections: int = 16) -> dict[str, object]:
    # Deadlines far beyond the test's bounds: only shedding can free a descriptor in time.
    return {"server": {"event_loop": event_loop, "header_timeout": 120, "keepalive_timeout": 120},
            "upstream": {"base_url": f"{fake.url}/v1", "max_connections": max_connections},
            "logging": {"level": "INFO"}}


async def models_status(port: int) -> int:
    """One real client request, on a fresh connection, bounded."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
            session.get(f"http://127.0.0.1:{port}/v1/models") as response:
        await response.read()
        return response.status


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_idle_sockets_beyond_the_limit_are_shed_and_a_client_is_served(
        tmp_path: Path, fake: FakeUpstream, event_loop: str) -> None:
    with proxy_process(tmp_path, limited_config(fake, event_loop), (LIMIT, LIMIT)) as (port, log_path):
        idle = open_idle_sockets(port, IDLE_SOCKETS)
        try:
            status = await models_status(port)
            shed = closed_by_peer(idle)
        finally:
            for sock in idle:
                sock.close()
        log = log_path.read_text(errors="replace")
    assert status == 200, log[-3000:]
    assert fake.requests and fake.requests[-1].path == "/v1/models"
    assert shed >= IDLE_SOCKETS - client_capacity(LIMIT, 16), log[-3000:]
    assert log.count(SHED_WARNING) == 1, log[-3000:]  # rate-limited: one line for every connection shed
    assert "Too many open files" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_a_limit_low_for_max_connections_is_warned_at_start(tmp_path: Path, fake: FakeUpstream,
                                                                 event_loop: str) -> None:
    with proxy_process(tmp_path, limited_config(fake, event_loop, max_connections=1000), (LIMIT, LIMIT)) as (_, path):
        log = path.read_text(errors="replace")
    assert f"open files limit {LIMIT}" in log and "INFO" in log, log
    assert f"open files limit {LIMIT} is low for upstream.max_connections 1000" in log, log


# --- which connections are shed --------------------------------------------------------------------------------

@dataclass(eq=False)
class Connection:
    name: str
    idle: bool = True
    shed_count: int = 0

    def is_idle(self) -> bool:
        return self.idle

    def shed(self) -> None:
        self.shed_count += 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tracked(capacity: int | None, *connections: Connection) -> ClientConnections:
    clients = ClientConnections(capacity, limit=1024, clock=Clock())
    for connection in connections:
        clients.opened(connection)
    return clients


@pytest.mark.parametrize(("idle", "active", "capacity", "shed"), [
    ("abcde", "", 5, ""),         # within capacity: nothing shed
    ("abcde", "", 4, "a"),        # the longest idle goes
    ("abcde", "a", 4, "b"),       # a connection that spoke lately is not the longest idle
    ("bcde", "", 4, "b"),         # a busy first connection ("a") is skipped
    ("", "", 4, ""),              # all busy: nothing to shed
    ("e", "", 4, ""),             # only the new one is idle: it stays (the room is made for it)
    ("abcde", "", None, ""),      # no limit known: nothing is ever shed
], ids=["within", "oldest", "recently-active", "busy-skipped", "all-busy", "only-newest-idle", "unlimited"])
def test_the_longest_idle_connection_makes_room(idle: str, active: str, capacity: int | None, shed: str) -> None:
    connections = [Connection(name, idle=name in idle) for name in "abcde"]
    clients = tracked(capacity, *connections[:4])
    for connection in connections:
        if connection.name in active:
            clients.active(connection)
    clients.opened(connections[4])
    assert "".join(c.name for c in connections if c.shed_count) == shed
    assert all(c.shed_count <= 1 for c in connections)
    assert len(clients) == 5 - len(shed)


def test_closed_connections_free_their_place() -> None:
    first, second, third = Connection("a"), Connection("b"), Connection("c")
    clients = tracked(2, first, second)
    clients.closed(first)
    clients.closed(first)  # closed twice (shed, then lost): no error
    clients.opened(third)
    assert (first.shed_count, second.shed_count, third.shed_count) == (0, 0, 0) and len(clients) == 2


@pytest.mark.parametrize(("limit", "max_connections", "capacity"), [
    (1_048_576, 1000, 1_048_576 - 1000 - HEADROOM - ACCEPT_BURST),
    (4096, 1000, 4096 - 1000 - HEADROOM - ACCEPT_BURST),
    (1024, 1000, 1024 - 256 - HEADROOM - ACCEPT_BURST),  # the upstream's reserve is at most a quarter
    (256, 16, 256 - 16 - HEADROOM - ACCEPT_BURST),
    (256, 1000, 32),                                     # never fewer than an eighth for clients
])
def test_client_capacity_keeps_a_reserve(limit: int, max_connections: int, capacity: int) -> None:
    assert client_capacity(limit, max_connections) == capacity
