"""The client APIs the proxy compacts, each at its route: the one list the router and the runtime read."""

from __future__ import annotations

from typing import Any

from proxy.config import Settings
from proxy.dialects.chat import CHAT
from proxy.dialects.dialect import Dialect
from proxy.dialects.messages import MESSAGES, MESSAGES_MANAGING_UPSTREAM
from proxy.dialects.messages_over_chat import MESSAGES_OVER_CHAT
from proxy.dialects.responses import RESPONSES, RESPONSES_COMPACTING_UPSTREAM, RESPONSES_OVER_CHAT
from proxy.errors import ProxyError

DIALECTS: tuple[Dialect[Any], ...] = (CHAT, RESPONSES, MESSAGES)
API_PREFIX = "/v1"


def route_path(dialect: Dialect[Any]) -> str:
    """Where clients post to the dialect (the upstream's path below its base URL, under /v1 at the proxy)."""
    return API_PREFIX + dialect.path


# Route path → dialect name, which is also the route's label in metrics and logs.
ROUTES = {route_path(dialect): dialect.name for dialect in DIALECTS}
_AT = {route_path(dialect): dialect for dialect in DIALECTS}
# Each client API's bridge to an upstream that speaks only chat completions (upstream_api: chat, or auto's fallback).
_OVER_CHAT: dict[str, Dialect[Any]] = {RESPONSES.name: RESPONSES_OVER_CHAT, MESSAGES.name: MESSAGES_OVER_CHAT}


def upstream_api(dialect: Dialect[Any], settings: Settings) -> str | None:
    """What the upstream is configured to speak to the dialect's clients: their own API, "chat" or "auto"; None
    for chat completions' clients, which nothing is bridged for."""
    configured = {RESPONSES.name: settings.dialects.responses.upstream_api,
                  MESSAGES.name: settings.dialects.messages.upstream_api}
    return configured.get(dialect.name)


def fallback(dialect: Dialect[Any], settings: Settings) -> Dialect[Any] | None:
    """The bridge to turn to once the upstream shows it lacks the dialect's API (upstream_api: auto), or None."""
    return _OVER_CHAT[dialect.name] if upstream_api(dialect, settings) == "auto" else None


def serving(dialect: Dialect[Any], settings: Settings) -> Dialect[Any]:
    """The dialect as the configured upstream needs it: Responses and Messages clients bridged to a chat-only
    upstream; Responses clients left to an upstream that compacts by itself when they ask it to; Messages clients'
    context management left to an upstream that runs it."""
    if upstream_api(dialect, settings) == "chat":
        return _OVER_CHAT[dialect.name]  # a chat upstream runs no context management: the bridge's proxy does
    if dialect is MESSAGES and settings.dialects.messages.upstream_context_management:
        return MESSAGES_MANAGING_UPSTREAM
    if dialect is not RESPONSES:
        return dialect
    return RESPONSES_COMPACTING_UPSTREAM if settings.dialects.responses.upstream_compaction else RESPONSES


def error_body(path: str, error: ProxyError) -> dict[str, Any]:
    """A proxy-made error as the API at `path` shapes its errors; OpenAI's shape everywhere else."""
    # A dialect's own sub-routes (/v1/messages/count_tokens) are its clients' too: they read errors the same way.
    dialect = _AT.get(path) or next((known for route, known in _AT.items() if path.startswith(route + "/")), None)
    return dialect.error_body(error) if dialect is not None else error.body()
