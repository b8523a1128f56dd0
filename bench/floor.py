"""The benchmark's floor: the least an aiohttp reverse proxy can do, so the proxy is measured against its own design.

Usage: python -m bench.floor --upstream http://127.0.0.1:PORT --port 0 --ready-file FILE

One catch-all route, one ClientSession, the request body read whole and forwarded, the answer streamed back chunk
by chunk as it arrives. No parsing, no logging, no metrics. It runs on uvloop when uvloop is installed, as
`python -m proxy` does by default, so the difference between the two columns is the proxy's own work.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.processes import serve_child

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
# What a forwarding proxy must not pass on (hop-by-hop) or must let the transport recompute.
DROPPED = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"})


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {name: value for name, value in request.headers.items() if name.lower() not in DROPPED}
    url = request.app[UPSTREAM] + request.rel_url.path_qs
    async with request.app[SESSION].request(request.method, url, data=body, headers=headers,
                                            auto_decompress=False) as upstream:
        response = web.StreamResponse(status=upstream.status, headers={
            name: value for name, value in upstream.headers.items() if name.lower() not in DROPPED})
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def session(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as client:
        app[SESSION] = client
        yield


def make_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the upstream's origin, e.g. http://127.0.0.1:8001")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, required=True, help="where the bound port is written")
    args = parser.parse_args()
    serve_child(make_app(args.upstream), args.port, args.ready_file)


if __name__ == "__main__":
    main()
