"""The throwaway redis-server answers as itself: a port another redis-server holds is not taken for its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fakes.redis_process import RedisServer


def test_a_redis_server_tells_itself_from_another_on_its_port(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    held, late = RedisServer(tmp_path / "a", password="pw-a"), RedisServer(tmp_path / "b", password="pw-a")
    held.start()
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert held._answers_itself()
        # As if `late` had picked the port `held` took first: the server answering is not its process.
        late.port, late._process = held.port, stand_in
        assert not late._answers_itself()
        late._process = None
        late.port = held.port  # its first try meets the port taken; it starts on another
        late.start()
        assert late.port != held.port and late._answers_itself()
    finally:
        stand_in.kill()
        stand_in.wait()
        late.stop()
        held.stop()
