"""The journal's read API and the dashboard, under the proxy's own prefix: a caller reads its own tenant's only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from proxy.core.credentials import presents_one_of
from proxy.core.tenants import has_credentials, journal_owner
from proxy.errors import NotFound, ServiceUnavailable, Unauthorized
from proxy.http.appkeys import METRICS, RUNTIME
from proxy.http.pin import pinned
from proxy.http.routes import OWN_PREFIX
from proxy.store.flights import StoreUnavailable
from proxy.store.journal import ConversationInfo, Event, Journal, Point

API = f"{OWN_PREFIX}api"
DASHBOARD = f"{OWN_PREFIX}dashboard/"
# The dashboard's files: shipped in the package, served as they are (no data in them, so open).
_ASSETS = {"": ("index.html", "text/html"), "index.html": ("index.html", "text/html"),
           "app.js": ("app.js", "text/javascript"), "style.css": ("style.css", "text/css")}
_ID = re.compile(r"[0-9a-f]{1,64}")
_MAX_LIMIT = 500
# The page may load only its own files and talk only to this origin; nothing it shows is run as markup.
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                 "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
# Journal answers are one caller's: never kept by a cache in between.
_PRIVATE = {"Cache-Control": "no-store", "Vary": "Authorization, X-Api-Key, Api-Key, X-Proxy-Api-Key"}


@dataclass(frozen=True)
class Reader:
    """Who reads: an operator (every owner) or one owner's caller."""

    owner: str | None

    @property
    def operator(self) -> bool:
        return self.owner is None


def reader_of(request: web.Request) -> Reader:
    """The reader a request's credentials make; 401 without credentials, or without a proxy key where the proxy
    asks for one. An operator key reads every tenant's."""
    runtime = pinned(request)
    server = runtime.settings.server
    if runtime.admin_keys and presents_one_of(request.headers, runtime.admin_keys):
        return Reader(None)
    if runtime.proxy_keys and not presents_one_of(request.headers, runtime.proxy_keys):
        raise Unauthorized("a valid proxy API key is required to read the compaction journal")
    if not has_credentials(request.headers):
        raise Unauthorized("present the API key your client uses (Authorization: Bearer …) to read its journal")
    return Reader(journal_owner(request.headers, server.tenant_header))


def _journal(request: web.Request) -> Journal:
    journal = request.app[RUNTIME].shared.recorder.journal
    if journal is None:
        raise NotFound("the compaction journal is off at this proxy (journal.enabled: false)")
    return journal


def _id(request: web.Request) -> str:
    value = request.match_info["id"]
    if not _ID.fullmatch(value):
        raise NotFound("no such entry")
    return value


def _answer(body: dict[str, Any]) -> web.Response:
    return web.json_response(body, headers=_PRIVATE)


def _conversation(info: ConversationInfo, reader: Reader) -> dict[str, Any]:
    # The owner is a hash of credentials: shown (shortened) to operators, who need to tell tenants apart.
    shown = info.model_dump(exclude={"owner"})
    return shown | {"owner": info.owner[:12]} if reader.operator else shown


def _point(point: Point) -> dict[str, Any]:
    return point.model_dump(exclude={"owner"})


def _event(event: Event) -> dict[str, Any]:
    return event.model_dump(exclude={"owner"})


async def info(request: web.Request) -> web.Response:
    """Open: what the dashboard's sign-in needs (the tenant header's name), nothing of anyone's data."""
    return web.json_response({"tenant_header": pinned(request).settings.server.tenant_header},
                             headers={"Cache-Control": "no-cache"})


async def conversations(request: web.Request) -> web.Response:
    reader = reader_of(request)
    try:
        limit = min(_MAX_LIMIT, max(1, int(request.query.get("limit", "100"))))
    except ValueError:
        limit = 100
    listed = await _read(_journal(request).conversations(reader.owner, limit))
    return _answer({"operator": reader.operator, "conversations": [_conversation(i, reader) for i in listed]})


async def conversation(request: web.Request) -> web.Response:
    reader = reader_of(request)
    detail = await _read(_journal(request).conversation(reader.owner, _id(request)))
    if detail is None:
        raise NotFound("no such conversation")
    return _answer({"conversation": _conversation(detail.info, reader), "points": [_point(p) for p in detail.points],
                    "events": [event.listed() for event in detail.events]})


async def event(request: web.Request) -> web.Response:
    reader = reader_of(request)
    found = await _read(_journal(request).event(reader.owner, _id(request)))
    if found is None:
        raise NotFound("no such event")
    return _answer(_event(found))


async def counters(request: web.Request) -> web.Response:
    """The live counters the dashboard shows, read from the same registry /metrics exposes."""
    reader_of(request)
    return _answer(request.app[METRICS].summary())


async def _read(work: Any) -> Any:
    try:
        return await work
    except StoreUnavailable as error:
        raise ServiceUnavailable(f"the compaction journal cannot be read now: {error}") from None


async def dashboard(request: web.Request) -> web.Response:
    name = request.match_info.get("file", "")
    if name not in _ASSETS:
        raise NotFound("no such file")
    filename, content_type = _ASSETS[name]
    body = resources.files("proxy").joinpath("dashboard", filename).read_bytes()
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=_PAGE_HEADERS)


def add_routes(app: web.Application) -> None:
    app.router.add_get(f"{API}/info", info)
    app.router.add_get(f"{API}/conversations", conversations)
    app.router.add_get(f"{API}/conversations/{{id}}", conversation)
    app.router.add_get(f"{API}/events/{{id}}", event)
    app.router.add_get(f"{API}/metrics", counters)
    app.router.add_get("/_proxy/dashboard", to_dashboard)
    app.router.add_get(f"{DASHBOARD}{{file:[a-z.]*}}", dashboard)


async def to_dashboard(request: web.Request) -> web.Response:
    raise web.HTTPFound(DASHBOARD)
