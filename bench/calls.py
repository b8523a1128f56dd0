"""Python calls per request, counted by cProfile inside each target: a figure the machine's load does not move.

Usage: python -m bench.calls [--requests N] [--only small,long,reuse] [--proxy-root PATH ...]

How to read it
--------------
Each target (the floor, and `python -m proxy` with compaction off and on for each root) runs twice under cProfile
(`python -m cProfile -o FILE -m ...`): once answering WARMUP requests of a shape, once WARMUP + N. The difference
of the two runs' call counts over N is what one more request costs, with start-up, imports and warm-up taken
out. Requests go one at a time from `bench.load`, with the bodies `python -m bench` sends.

A call is not a unit of time: a call into C that parses half a megabyte counts once, as does a dict lookup. The
count moves only when the code does, so it is the figure to compare across commits on a machine too busy for the
timed ones (`python -m bench`), and the place to look for where a request's Python work goes (`--top K` lists the
functions whose call counts grew most per request, builtins included).
"""

from __future__ import annotations

import argparse
import platform
import pstats
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.load_client import LoadClient
from bench.machine import commit
from bench.processes import BENCH_ROOT, Child, spawn, start_upstream, stop, wait_proxy, wait_until
from bench.scenarios import Row, per_shape
from bench.table import render
from bench.targets import proxy_config

WARMUP = 20
SHAPES = ("small", "long", "reuse")
MAX_SECONDS = 600.0
TOP = 40  # functions kept per count, for --top

# Starts a target under cProfile: (directory, upstream port, tag) -> (its process, its profile, its port).
Start = Callable[[Path, int, str], tuple[Child, Path, int]]


@dataclass(frozen=True)
class Counted:
    """One target's calls per request for one shape, and the functions behind the most of them."""

    calls: float
    top: tuple[tuple[float, str], ...]


def profiled(name: str, module_argv: Sequence[str], cwd: Path, directory: Path, tag: str) -> tuple[Child, Path]:
    """`python -m cProfile -o FILE -m <module_argv>` in `cwd`; the profile is written when it stops."""
    profile = directory / f"{tag}.prof"
    argv = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", *module_argv]
    return spawn(name, argv, cwd=cwd, log=directory / f"{tag}.log"), profile


def floor_target(directory: Path, upstream_port: int, tag: str) -> tuple[Child, Path, int]:
    ready = directory / f"{tag}.port"
    child, profile = profiled("floor", ["bench.floor", "--upstream", f"http://127.0.0.1:{upstream_port}",
                                        "--port", "0", "--ready-file", str(ready)], BENCH_ROOT, directory, tag)
    wait_until(child, ready.exists)
    return child, profile, int(ready.read_text())


def proxy_target(directory: Path, upstream_port: int, root: Path, compaction: bool,
                 tag: str) -> tuple[Child, Path, int]:
    config = directory / f"{tag}.yaml"
    config.write_text(proxy_config(upstream_port, 0, compaction))
    child, profile = profiled(tag, ["proxy", "--config", str(config)], root, directory, tag)
    return child, profile, wait_proxy(child)


def proxy_start(root: Path, compaction: bool, number: int) -> Start:
    def start(directory: Path, upstream_port: int, tag: str) -> tuple[Child, Path, int]:
        return proxy_target(directory, upstream_port, root, compaction, f"{tag}-{number}")
    return start


def counts(profile: Path) -> dict[str, int]:
    """Calls per function (file:line name) in a profile, builtins included."""
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    return {f"{Path(key[0]).name}:{key[1]} {key[2]}": value[1] for key, value in stats.items()}


def counted(start: Start, directory: Path, shape: str, requests: int, upstream_port: int, tag: str) -> Counted:
    """Calls per request of `shape` through the target `start` makes: two profiled runs, their difference."""
    runs = []
    for total in (WARMUP, WARMUP + requests):
        child, profile, port = start(directory, upstream_port, f"{tag}-{shape}-{total}")
        client = LoadClient(directory)
        try:
            done = client.run(f"http://127.0.0.1:{port}/v1/chat/completions", shape, 1, total, MAX_SECONDS)
        finally:
            client.close()
            stop(child)
        if done.get("errors") or done.get("requests") != total:
            raise SystemExit(f"{tag} did not answer {total} {shape} requests with 200: {done}")
        if not profile.exists():
            raise SystemExit(f"{tag} wrote no profile:\n{child.output()}")
        runs.append(counts(profile))
    before, after = runs
    grown = sorted(((after[name] - before.get(name, 0)) / requests, name) for name in after)
    return Counted((sum(after.values()) - sum(before.values())) / requests, tuple(reversed(grown[-TOP:])))


def rows(results: dict[str, dict[str, Counted]], shapes: Sequence[str]) -> list[Row]:
    """Each shape's calls per request, and the same over the floor's (the floor's own cell empty)."""
    calls = {column: {shape: result.calls for shape, result in by_shape.items()}
             for column, by_shape in results.items()}
    return per_shape(calls, shapes, "Python calls per request", "calls")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.calls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests counted per shape (default 200)")
    parser.add_argument("--only", default=",".join(SHAPES), help=f"shapes, of {','.join(SHAPES)}")
    parser.add_argument("--proxy-root", type=Path, action="append", default=None,
                        help="a checkout whose proxy to count (repeatable; default this one)")
    parser.add_argument("--top", type=int, default=0, help="list the K functions that grew most per request")
    args = parser.parse_args(argv)
    shapes = [shape for shape in args.only.split(",") if shape]
    if not shapes or any(shape not in SHAPES for shape in shapes) or args.requests < 1:
        parser.error(f"--only takes {','.join(SHAPES)}; --requests at least 1")
    args.shapes = shapes
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    roots = [root.resolve() for root in args.proxy_root or [BENCH_ROOT]]
    with tempfile.TemporaryDirectory(prefix="bench-calls-") as name:
        directory = Path(name)
        upstream, upstream_port = start_upstream(directory)
        try:
            starts: dict[str, Start] = {"floor": floor_target}
            for number, root in enumerate(roots):
                for kind in ("off", "on"):
                    label = f"proxy {kind}" + (f" {root.name}@{commit(root)}" if len(roots) > 1 else "")
                    starts[label] = proxy_start(root, kind == "on", number)
            results = {label: {shape: counted(start, directory, shape, args.requests, upstream_port,
                                              label.replace(" ", "-").replace("@", "-"))
                               for shape in args.shapes} for label, start in starts.items()}
        finally:
            stop(upstream)
    header = [f"python: {platform.python_version()}", f"requests counted per shape: {args.requests}"]
    print(render(header, list(results), rows(results, args.shapes)))
    for label, by_shape in results.items() if args.top else ():
        for shape, result in by_shape.items():
            print(f"\n{label}, {shape}: the functions whose calls grew most per request")
            print("\n".join(f"  {calls:7.1f}  {function}" for calls, function in result.top[:args.top]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
