"""Instructions per request, counted by valgrind's callgrind inside each target: the work a request costs, which
the machine's load does not move.

Usage: python -m bench.instructions [--requests N] [--only small,long,...,reuse-messages] [--off]
                                    [--proxy-root PATH ...]

How to read it
--------------
Each target (the floor, and `python -m proxy` with compaction on for each root; `--off` adds the proxies with it off)
runs under `valgrind --tool=callgrind`, counting nothing until it is told to (`--instr-atstart=no`). It answers WARMUP
requests of a shape first and is let finish what they started in the background, if anything; then its count is
switched on (`callgrind_control --instr=on`), it answers N more, and its count is written out (`callgrind_control
--dump`). The figure is that count over N: the machine instructions one more request costs the target, start-up,
imports and warm-up left out (requests go one at a time, from `bench.load`; what the loop does while it waits, a timer
or two, is counted with them and is little).

An instruction is not a unit of time either. Under valgrind a large memory copy (`rep movsb`) counts one
instruction per byte, where the processor moves dozens of bytes a cycle: most of what the floor is counted for a
long history is its copies of the body. So each shape has a second row, the instructions outside the C library's
memory copies (bench.callgrind): the work the request costs, which is what the long histories' CPU ratios in
`python -m bench` follow, though still lower than them (a request that touches half a megabyte also waits for
memory, which no count sees). What the counts are good for: the same figure to 0.5 % on a machine whose timed
rounds move by a third from one run to the next, so a change that saves a few microseconds a request shows, and
shows where.
Under callgrind a target runs some fifty times slower: a few hundred requests a shape is plenty. What depends on
the clock is kept out: the streams are paced by it, and a conversation near its threshold is planned by its pace in
seconds, so the reuse shapes are counted with `compaction.background` off (see UNPACED). Needs valgrind (Debian's
`valgrind`, which `.ci/run` installs).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.bodies import SHAPES
from bench.callgrind import copies_of, total_of
from bench.load_client import LoadClient
from bench.processes import BENCH_ROOT, Child, cpu_seconds, spawn, start_upstream, stop, wait_proxy, wait_until
from bench.scenarios import Row, per_shape
from bench.table import render
from bench.targets import column, proxy_config

WARMUP = 20
MAX_REQUESTS = 2000
MAX_SECONDS = 900.0  # a run of requests under callgrind, at most
START_TIMEOUT = 120.0  # a target starting under callgrind, at most
DUMP_TIMEOUT = 60.0
SETTLE_TIMEOUT = 300.0  # a target's work left over from its warm-up (a summary made in the background), at most
SETTLE_INTERVAL = 1.0
IDLE_SHARE = 0.05  # of a core: a target using less than this between two looks is idle
# Not the streams: they are paced by the clock.
SHAPE_NAMES = ("small", "long", "long-responses", "long-messages", "reuse", "reuse-responses", "reuse-messages")
# Near its threshold a conversation's next summary is planned by its pace against the summariser's time, in seconds:
# under callgrind every turn takes fifty times longer, so a proxy plans (and replays the turns ahead) where at full
# speed it does not. These shapes are counted with that planning off (compaction.background: false). At full speed
# the same reuse hits with it on made some 60 more Python calls a request (cProfile), all of them the pace's
# bookkeeping, against some 1,500: the figure leaves out about that much.
UNPACED = frozenset({"reuse", "reuse-responses", "reuse-messages"})

# Starts a target under callgrind for a shape: (directory, upstream port, tag, shape) -> (its process, its dump
# file, its port).
Start = Callable[[Path, int, str, str], tuple[Child, Path, int]]


def counted_run(name: str, module_argv: Sequence[str], cwd: Path, directory: Path, tag: str) -> tuple[Child, Path]:
    """`python -m <module_argv>` under callgrind in `cwd`, counting nothing yet."""
    dump = directory / f"{tag}.callgrind"
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={dump}",
            sys.executable, "-m", *module_argv]
    return spawn(name, argv, cwd=cwd, log=directory / f"{tag}.log"), dump


def floor_target(directory: Path, upstream_port: int, tag: str, shape: str) -> tuple[Child, Path, int]:
    ready = directory / f"{tag}.port"
    child, dump = counted_run("floor", ["bench.floor", "--upstream", f"http://127.0.0.1:{upstream_port}",
                                        "--port", "0", "--ready-file", str(ready)], BENCH_ROOT, directory, tag)
    wait_until(child, ready.exists, START_TIMEOUT)
    return child, dump, int(ready.read_text())


def proxy_start(root: Path, compaction: bool) -> Start:
    def start(directory: Path, upstream_port: int, tag: str, shape: str) -> tuple[Child, Path, int]:
        config = directory / f"{tag}.yaml"
        config.write_text(counted_config(upstream_port, 0, compaction, shape))
        child, dump = counted_run(tag, ["proxy", "--config", str(config)], root, directory, tag)
        return child, dump, wait_proxy(child, START_TIMEOUT)
    return start


def counted_config(upstream_port: int, port: int, compaction: bool, shape: str) -> str:
    """The bench's proxy configuration, with summaries planned by pace off for a shape in UNPACED."""
    config = json.loads(proxy_config(upstream_port, port, compaction))
    if shape in UNPACED:
        config["compaction"]["background"] = False
    return json.dumps(config, indent=2)


def control(child: Child, *flags: str) -> None:
    done = subprocess.run(["callgrind_control", *flags, str(child.pid)], capture_output=True, text=True,
                          timeout=DUMP_TIMEOUT)
    if done.returncode != 0:
        raise SystemExit(f"callgrind_control {' '.join(flags)} failed: {done.stderr or done.stdout}")


def dumped(dump: Path) -> bytes:
    """The first dump written for `dump` (callgrind numbers them `<file>.1`, ...), once it is whole."""
    deadline = time.monotonic() + DUMP_TIMEOUT
    while time.monotonic() < deadline:
        parts = sorted(dump.parent.glob(f"{dump.name}.*"))
        if parts and (text := parts[0].read_bytes()) and _whole(text):
            return text
        time.sleep(0.1)
    raise SystemExit(f"callgrind wrote no dump for {dump.name} within {DUMP_TIMEOUT:g} s")


def _whole(dump: bytes) -> bool:
    try:
        total_of(dump)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Count:
    """Instructions per request: in all, and of them in the C library's memory copies (bench.callgrind)."""

    total: float
    copies: float

    @property
    def outside_copies(self) -> float:
        return self.total - self.copies


def counted(start: Start, directory: Path, shape: str, requests: int, upstream_port: int, tag: str) -> Count:
    """Instructions per request of `shape` through the target `start` makes."""
    child, dump, port = start(directory, upstream_port, f"{tag}-{shape}", shape)
    client = LoadClient(directory)
    url = f"http://127.0.0.1:{port}{SHAPES[shape].path}"
    try:
        answered(client, url, shape, WARMUP, tag)
        settle(child)
        control(child, "--instr=on")
        answered(client, url, shape, requests, tag)
        control(child, "--dump")
        text = dumped(dump)
        return Count(total_of(text) / requests, copies_of(text) / requests)
    finally:
        client.close()
        stop(child)


def answered(client: LoadClient, url: str, shape: str, total: int, tag: str) -> None:
    """`total` requests of `shape`, one at a time, each answered 200."""
    done = client.run(url, shape, 1, total, MAX_SECONDS)
    if done.get("errors") or done.get("requests") != total:
        raise SystemExit(f"{tag} did not answer {total} {shape} requests with 200: {done}")


def settle(child: Child) -> None:
    """Wait until the target is idle: what its warm-up started in the background (the first reads of a history,
    a journal's writes) would otherwise be counted against the requests after it."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    used = cpu_seconds(child.pid)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_INTERVAL)
        now = cpu_seconds(child.pid)
        if now - used < IDLE_SHARE * SETTLE_INTERVAL:
            return
        used = now
    raise SystemExit(f"{child.name} was still busy {SETTLE_TIMEOUT:g} s after its warm-up")


def rows(results: dict[str, dict[str, Count]], shapes: Sequence[str]) -> list[Row]:
    """Each shape's instructions per request (millions), in all and outside memory copies, each also over the
    floor's (its own cell empty)."""
    found = []
    for shape in shapes:
        total = {target: {shape: counts[shape].total} for target, counts in results.items()}
        outside = {target: {shape: counts[shape].outside_copies} for target, counts in results.items()}
        found += per_shape(total, [shape], "instructions per request", "M", scale=1e-6)
        found += per_shape(outside, [shape], "outside memory copies", "M", scale=1e-6, same="outside memory copies")
    return found


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests counted per shape (default 200)")
    parser.add_argument("--only", default="small,long", help=f"shapes, of {','.join(SHAPE_NAMES)}")
    parser.add_argument("--proxy-root", type=Path, action="append", default=None,
                        help="a checkout whose proxy to count (repeatable; default this one)")
    parser.add_argument("--off", action="store_true", help="count the proxies with compaction off too")
    args = parser.parse_args(argv)
    args.shapes = [shape for shape in args.only.split(",") if shape]
    if not args.shapes or any(shape not in SHAPE_NAMES for shape in args.shapes):
        parser.error(f"--only takes {','.join(SHAPE_NAMES)}")
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be between 1 and {MAX_REQUESTS}")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    roots = [root.resolve() for root in args.proxy_root or [BENCH_ROOT]]
    starts: dict[str, Start] = {"floor": floor_target}
    for root in roots:
        for kind in ("off", "on") if args.off else ("on",):
            starts[column(kind, root, len(roots) > 1)] = proxy_start(root, kind == "on")
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as name:
        directory = Path(name)
        upstream, upstream_port = start_upstream(directory)
        try:
            results = {label: {shape: counted(start, directory, shape, args.requests, upstream_port,
                                              re.sub(r"[^\w.-]+", "-", label))
                               for shape in args.shapes} for label, start in starts.items()}
        finally:
            stop(upstream)
    header = [f"python: {platform.python_version()}, {platform.machine()}",
              f"requests counted per shape: {args.requests}, one at a time, after {WARMUP}"]
    print(render(header, list(results), rows(results, args.shapes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
