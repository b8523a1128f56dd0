"""Command line: `compaction-proxy [--config PATH]` serves; `compaction-proxy check-config PATH` validates."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from proxy import __version__
from proxy.access_lines import HeldLines
from proxy.app import start_server
from proxy.config import ConfigError, Settings, load_settings, open_relay_problem
from proxy.http.appkeys import RUNTIME
from proxy.http.client_connections import client_capacity, open_files_limit, recommended_limit
from proxy.log_filters import install as install_redaction
from proxy.log_filters import mask_url
from proxy.log_format import formatter as log_formatter
from proxy.log_limits import install as install_repeat_limits
from proxy.reload import Reloader
from proxy.workers import CANNOT_LISTEN, supervise

log = logging.getLogger("proxy")
# Soft open-files limit asked for when the hard limit is unlimited (macOS refuses more than its kernel maximum).
OPEN_FILES_WHEN_UNLIMITED = 10240
# How often a worker checks that its supervisor is still there.
ORPHAN_CHECK_SECONDS = 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compaction-proxy", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--config", type=Path, help="YAML config file (default: built-in defaults)")
    parser.add_argument("--host", help="override server.host")
    parser.add_argument("--port", type=int, help="override server.port")
    parser.add_argument("--workers", type=_positive, default=1,
                        help="worker processes sharing the port (SO_REUSEPORT; default 1 = this process serves)")
    # Set by the supervisor on the workers it starts: which worker, and whose (a worker whose supervisor is gone
    # shuts down rather than serve on unsupervised).
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="serve the proxy (the default)")
    check = commands.add_parser("check-config", help="validate a config file and print what it resolves to")
    check.add_argument("path", type=Path)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def check_config(path: Path, host: str | None = None) -> int:
    try:
        settings = load_settings(path)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    problem = open_relay_problem(settings, host)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    # SecretStr fields dump as '**********' and URL passwords are masked, so printing the resolved tree is safe.
    print(json.dumps(_masked(settings.model_dump(mode="json")), indent=2))
    return 0


def _masked(tree: Any) -> Any:
    """A dumped config with every URL's password masked (upstream, summariser upstream, store)."""
    if isinstance(tree, dict):
        return {key: _masked(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_masked(value) for value in tree]
    return mask_url(tree) if isinstance(tree, str) else tree


def configure_logging(settings: Settings, worker: int | None = None) -> None:
    """stderr at the configured level, with credentials redacted from every record (aiohttp's included)."""
    # The workers share the supervisor's stderr: each line says which one wrote it.
    logging.basicConfig(level=settings.logging.level, stream=sys.stderr)
    # No format shows a record's thread or process, and each costs a lookup per record (a line per request).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    for handler in logging.getLogger().handlers:
        handler.setFormatter(log_formatter(settings.logging.format, worker))
    install_redaction()
    # After redaction, so a "suppressed N similar" line quotes an already redacted message.
    install_repeat_limits()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            HeldLines.install(handler, settings.logging.access_log_flush_seconds)


def raise_open_files_limit(max_connections: int) -> None:
    """The soft open-files limit up to the hard one, logged, with a warning when it leaves little room beside
    `max_connections` upstream connections: every client and upstream connection holds a descriptor."""
    _raise_soft_limit()
    limit = open_files_limit()
    if limit is not None and limit < recommended_limit(max_connections):
        log.warning("open files limit %d is low for upstream.max_connections %d: client connections are capped at "
                    "%d, the longest idle ones closed beyond that; raise the hard limit to %d or more (ulimit -Hn, "
                    "LimitNOFILE) or lower upstream.max_connections", limit, max_connections,
                    client_capacity(limit, max_connections), recommended_limit(max_connections))


def _raise_soft_limit() -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit (macOS) still caps the soft one at the kernel's per-process maximum.
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WHEN_UNLIMITED)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as error:
            log.warning("open files limit stays at %d: raising it to %d failed (%s)", soft, wanted, error)
            return
        log.info("open files limit raised from %d to %d", soft, wanted)
    else:
        log.info("open files limit %d (hard limit %s)", soft, "unlimited" if hard == resource.RLIM_INFINITY else hard)


class CannotListen(Exception):
    """The listening socket could not be opened; the message says why."""


async def serve(settings: Settings, args: argparse.Namespace) -> None:
    raise_open_files_limit(settings.upstream.max_connections)
    supervised = args.supervisor_pid is not None
    try:
        server = await start_server(settings, host=args.host, port=args.port, reuse_port=supervised)
    except OSError as error:  # the port is taken, the address is not this machine's
        raise CannotListen(f"cannot listen: {error.strerror or error}") from None
    # Everything built so far (modules, config, templates, the tokenizer's tables) lives as long as the process:
    # out of the collector's sight, a full collection walks only what requests leave behind.
    gc.freeze()
    log.info("compaction-proxy %s listening on %s, upstream %s, event loop %s", __version__, server.url,
             mask_url(settings.upstream.base_url), type(asyncio.get_running_loop()).__module__.split(".")[0])
    slot = server.app[RUNTIME]
    reloader = Reloader(slot, args.config, host=args.host) if args.config is not None else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _on_sighup, reloader)
    if reloader is not None:
        reloader.start()
    orphaned = asyncio.create_task(_until_orphaned(args.supervisor_pid, stop)) if supervised else None
    try:
        await stop.wait()
    finally:
        if orphaned is not None:
            orphaned.cancel()
        if reloader is not None:
            await reloader.close()
        in_flight = slot.in_flight
        log.info("shutting down: no new connections; %d request(s) in progress get up to %g s to finish",
                 in_flight, settings.server.shutdown_grace_seconds)
        started = time.monotonic()
        await server.stop()
        log.info("stopped in %.2f s", time.monotonic() - started)


def _on_sighup(reloader: Reloader | None) -> None:
    if reloader is None:
        log.warning("SIGHUP: no --config file to reload; the built-in defaults stay")
    else:
        reloader.request("SIGHUP")


async def _until_orphaned(supervisor: int, stop: asyncio.Event) -> None:
    """Shut down gracefully once the supervisor is gone (killed outright: it could not forward SIGTERM)."""
    while os.getppid() == supervisor:
        await asyncio.sleep(ORPHAN_CHECK_SECONDS)
    log.warning("supervisor %d is gone: shutting down", supervisor)
    stop.set()


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop to serve on: uvloop's runs the proxy's own I/O in C (a fifth to a third less CPU per
    request, measured with bench/), asyncio's needs nothing installed. None is asyncio's default."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("server.event_loop is uvloop, but uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.path, args.host)
    try:
        settings = load_settings(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    problem = open_relay_problem(settings, args.host)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    configure_logging(settings, args.worker_index)
    if args.workers > 1:
        return supervise(args, settings)
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.server.event_loop)) as runner:
            runner.run(serve(settings, args))
    except CannotListen as error:
        print(error, file=sys.stderr)
        return CANNOT_LISTEN if args.supervisor_pid is not None else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
