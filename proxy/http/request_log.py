"""Request ids and the access log: one JSON line per request, under an id the client may send and always gets back."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy import request_context
from proxy.access_lines import AccessLines
from proxy.config import Settings
from proxy.core.credentials import CREDENTIAL_HEADERS
from proxy.core.fingerprint import HASH_ERRORS
from proxy.headers import log_fields, outcome_of
from proxy.http.appkeys import METRICS
from proxy.http.routes import route_of
from proxy.log_filters import redact
from proxy.request_context import Notes

REQUEST_ID_HEADER = "x-request-id"
# Where an upstream's own x-request-id goes: the client's x-request-id is the proxy's, and the upstream's stays
# available (for a support ticket with the provider, or to find the request in the gateway's logs).
UPSTREAM_REQUEST_ID_HEADER = "x-upstream-request-id"
MAX_REQUEST_ID = 128
MAX_PATH = 256
# Printable ASCII without the space: nothing that can end a header, start a log line or hide in a terminal.
_SANE_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}")
_PROBES = frozenset({"healthz", "readyz", "metrics"})
# nginx's status for "the client closed the connection before an answer was sent": no real response has it.
CLIENT_CLOSED = 499


@dataclass
class _Entry:
    """What one request's log line will say: its notes (proxy.request_context, which handlers add to while the
    request runs), and what only the edge knows."""

    notes: Notes
    source: str  # "client", "generated" (none sent) or "replaced" (the client's was not sane)
    started: float
    upstream_request_id: str | None = None
    prepared: web.StreamResponse | None = None  # the response whose headers went out, from on_response_prepare

    @property
    def request_id(self) -> str:
        return self.notes.request_id


# web.RequestKey where aiohttp has it (newer ones warn about plain keys); a plain key on the older ones it supports.
_ENTRY: Any = web.RequestKey("request_log_entry", _Entry) if hasattr(web, "RequestKey") else "proxy.request_log_entry"


def sane_request_id(value: str, credentials: Iterable[bytes] = ()) -> bool:
    """Whether a client's id may be reflected and logged: short printable ASCII, and not a credential.

    The id is compared whole, never searched for a part of a key: replacing an id that merely contains a key's
    first letters would let a client learn the key letter by letter from which ids come back.
    """
    if not _SANE_ID.fullmatch(value) or redact(value) != value:
        return False
    encoded = value.encode("ascii")
    # Every credential is compared, in constant time, like the proxy's own key check.
    return not any([hmac.compare_digest(encoded, key) for key in credentials])


def _presented(headers: Mapping[str, str]) -> list[bytes]:
    """Values of the client's credential headers, whole and without their scheme (a bearer token)."""
    values: list[bytes] = []
    # An id equal to a credential header's value is a key sent by mistake.
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            values.append(value.encode("utf-8", HASH_ERRORS))
            token = value.partition(" ")[2].strip()
            if token:
                values.append(token.encode("utf-8", HASH_ERRORS))
    return values


def _configured_keys(settings: Settings) -> list[bytes]:
    upstreams = (settings.upstream, settings.compaction.summarizer.upstream)
    secrets = [*settings.server.api_keys,
               *(upstream.api_key for upstream in upstreams if upstream is not None and upstream.api_key)]
    return [secret.get_secret_value().encode("utf-8", HASH_ERRORS) for secret in secrets if secret is not None]


def new_request_id() -> str:
    """128 random bits as 32 hex digits (uuid4's strength, at a fifth of its cost: one per request)."""
    return os.urandom(16).hex()


def _entry_for(request: web.Request, configured: list[bytes]) -> _Entry:
    sent = request.headers.getall(REQUEST_ID_HEADER, [])
    started = time.perf_counter()
    if not sent:
        return _Entry(Notes(new_request_id()), "generated", started)
    # Two ids are no id: which one the client meant is anyone's guess.
    if len(sent) == 1 and sane_request_id(sent[0], [*configured, *_presented(request.headers)]):
        return _Entry(Notes(sent[0]), "client", started)
    return _Entry(Notes(new_request_id()), "replaced", started)


class RequestLog:
    """Every request gets an id (refusals included) and, once its answer is out, one count and one log line: `begin`
    as the request enters the middleware (proxy.http.middleware.edge), `end` as it leaves."""

    def __init__(self, settings: Settings) -> None:
        self._configured = _configured_keys(settings)
        self._enabled = settings.logging.access_log
        self._lines = AccessLines()

    def begin(self, request: web.Request) -> tuple[_Entry, Token[Notes | None]]:
        """The request's id and notes, current in its context until `end`."""
        entry = _entry_for(request, self._configured)
        request[_ENTRY] = entry
        return entry, request_context.enter(entry.notes)

    def end(self, request: web.Request, begun: tuple[_Entry, Token[Notes | None]],
            response: web.StreamResponse | None, error: BaseException | None) -> None:
        """The request leaves with `response` or `error` (cancellation too: a client that left still gets its line)."""
        entry, token = begun
        request_context.leave(token)
        entry.notes.closed = True
        if error is None and response is not None and not response.prepared:
            # A whole body is sent after this returns; its headers are final now, so stamp them here, where the
            # line still sees the upstream's id (on_response_prepare would stamp it again, idly).
            stamp(entry, response)
        # The count and the line once the answer is out (aiohttp sends a whole body after the middleware returns,
        # in the same step of the request's task): the client does not wait for the proxy's bookkeeping. What the
        # sending changes (the response prepared) is read now.
        ended = _Ended(response if error is None else None, _started(entry, response), time.perf_counter())
        asyncio.get_running_loop().call_soon(_after, request, entry, ended, error, self._enabled, self._lines)


@dataclass(slots=True)
class _Ended:
    """A request's end as its handler left it."""

    returned: web.StreamResponse | None  # None for a request that raised
    # The response whose headers went out while the handler ran (a stream; an error after it): the truth, as a
    # cut stream's returned response is a stand-in. A whole body's goes out after.
    started: web.StreamResponse | None
    at: float


def _started(entry: _Entry, response: web.StreamResponse | None) -> web.StreamResponse | None:
    if entry.prepared is not None:
        return entry.prepared
    return response if response is not None and response.prepared else None


def count_request(request: web.Request, route: str, response: web.StreamResponse | None) -> None:
    """Every answer counted by route, status and what compaction did, refusals too; a request that raised past the
    middleware (None) as a 500."""
    metrics = request.app.get(METRICS)
    if metrics is None:
        return
    if response is None:
        metrics.labelled(metrics.requests, route, "500", "none").inc()
    else:
        metrics.labelled(metrics.requests, route, str(response.status), outcome_of(response.headers)).inc()


def _after(request: web.Request, entry: _Entry, ended: _Ended, error: BaseException | None, enabled: bool,
           lines: AccessLines) -> None:
    route = route_of(request.path)
    count_request(request, route, ended.returned)
    if enabled:
        _write(request, entry, ended, error, route, lines)


async def on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp's signal, just before any response's headers are sent: streams and error responses get the id too."""
    entry = request.get(_ENTRY)
    if isinstance(entry, _Entry):
        entry.prepared = response
        stamp(entry, response)


def stamp(entry: _Entry, response: web.StreamResponse) -> None:
    """Put the request id on the response; an upstream's own id moves to x-upstream-request-id. Idempotent."""
    headers = response.headers
    theirs = headers.getall(REQUEST_ID_HEADER, [])
    if theirs == [entry.request_id]:
        return
    if theirs:
        headers.popall(REQUEST_ID_HEADER)
        upstream_id = theirs[0]
        if UPSTREAM_REQUEST_ID_HEADER not in headers:
            headers[UPSTREAM_REQUEST_ID_HEADER] = upstream_id
        # Relayed as the upstream sent it, but logged only when it is as sane as a client's.
        entry.upstream_request_id = upstream_id if sane_request_id(upstream_id) else None
    headers[REQUEST_ID_HEADER] = entry.request_id


def _write(request: web.Request, entry: _Entry, ended: _Ended, error: BaseException | None, route: str,
           lines: AccessLines) -> None:
    try:
        line = _line(request, entry, ended, error, route)
    except Exception:  # the log line must never cost the client its answer
        logging.getLogger("proxy.request_log").warning("could not build the access log line", exc_info=True)
        return
    quiet = line["route"] in _PROBES and isinstance(line["status"], int) and line["status"] < 400
    # Probes come every few seconds from each load balancer: at INFO they would bury the traffic.
    level = logging.DEBUG if quiet else logging.INFO
    lines.write(level, line)


def _line(request: web.Request, entry: _Entry, ended: _Ended, error: BaseException | None,
          route: str) -> dict[str, Any]:
    """The log line's fields: counts, labels and ids only; never a body, a query string or another header."""
    response = ended.started if ended.started is not None else ended.returned
    line: dict[str, Any] = {"event": "request", "request_id": entry.request_id}
    if entry.source != "client":
        line["request_id_source"] = entry.source
    line["method"] = request.method[:16]
    line["route"] = route
    if route != "other":  # anything else is whatever a client made up; the query string may hold a key
        line["path"] = request.raw_path.partition("?")[0][:MAX_PATH]
    if response is not None:
        line["status"] = response.status
    else:
        line["status"] = CLIENT_CLOSED if _cancelled(error) else 500
    line["duration_ms"] = round((ended.at - entry.started) * 1000, 1)
    if response is not None:
        line["stream"] = _is_stream(response)
        size = _bytes(request, response, started=ended.started is not None)
        if size is not None:
            line["bytes"] = size
        if route == "chat":
            line.update(log_fields(response.headers))
    if entry.notes.model is not None:
        line["model"] = entry.notes.model
    if entry.notes.upstream_status is not None:
        line["upstream_status"] = entry.notes.upstream_status
    if entry.upstream_request_id is not None:
        line["upstream_request_id"] = entry.upstream_request_id
    if error is not None:
        line["error"] = type(error).__name__
    if _cancelled(error) or (ended.started is not None and _connection_closed(request)):
        # The client left, or the proxy had to cut a started stream: the answer did not reach its end.
        line["aborted"] = True
    return line


def _is_stream(response: web.StreamResponse) -> bool:
    # The header read as it is: aiohttp's content_type parses every parameter of it.
    kind = response.headers.get("Content-Type", "")
    return kind.partition(";")[0].strip().lower() == "text/event-stream"


def _cancelled(error: BaseException | None) -> bool:
    # aiohttp cancels the handler (handler_cancellation) when the client's connection is lost.
    return isinstance(error, BaseException) and not isinstance(error, Exception)


def _connection_closed(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _bytes(request: web.Request, response: web.StreamResponse, *, started: bool) -> int | None:
    """A whole body's length; for a response already under way, what was written for it (framing included)."""
    if started:
        return request.writer.output_size if request.writer is not None else None
    body = response.body if isinstance(response, web.Response) else None
    return len(body) if isinstance(body, bytes | bytearray) else None
