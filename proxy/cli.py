"""Command line: `compaction-proxy [--config PATH]` serves; `compaction-proxy check-config PATH` validates."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from proxy import __version__
from proxy.app import start_server
from proxy.config import ConfigError, Settings, load_settings

log = logging.getLogger("proxy")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compaction-proxy", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--config", type=Path, help="YAML config file (default: built-in defaults)")
    parser.add_argument("--host", help="override server.host")
    parser.add_argument("--port", type=int, help="override server.port")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="serve the proxy (the default)")
    check = commands.add_parser("check-config", help="validate a config file and print what it resolves to")
    check.add_argument("path", type=Path)
    return parser


def check_config(path: Path) -> int:
    try:
        settings = load_settings(path)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    # SecretStr fields dump as '**********', so printing the resolved tree is safe.
    print(json.dumps(settings.model_dump(mode="json"), indent=2))
    return 0


async def serve(settings: Settings, host: str | None, port: int | None) -> None:
    server = await start_server(settings, host=host, port=port)
    log.info("compaction-proxy %s listening on %s, upstream %s", __version__, server.url,
             settings.upstream.base_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.path)
    try:
        settings = load_settings(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    logging.basicConfig(level=settings.logging.level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(settings, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
