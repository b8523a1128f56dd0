"""The client APIs the proxy compacts, each at its route: the one list the router and the runtime read."""

from __future__ import annotations

from typing import Any

from proxy.config import Settings
from proxy.dialects.chat import CHAT
from proxy.dialects.dialect import Dialect
from proxy.dialects.messages import MESSAGES
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


def serving(dialect: Dialect[Any], settings: Settings) -> Dialect[Any]:
    """The dialect as the configured upstream needs it: Responses clients bridged to a chat-only upstream, or left
    to an upstream that compacts by itself when they ask it to."""
    if dialect is not RESPONSES:
        return dialect
    config = settings.dialects.responses
    if config.upstream_api == "chat":
        return RESPONSES_OVER_CHAT
    return RESPONSES_COMPACTING_UPSTREAM if config.upstream_compaction else RESPONSES


def error_body(path: str, error: ProxyError) -> dict[str, Any]:
    """A proxy-made error as the API at `path` shapes its errors; OpenAI's shape everywhere else."""
    # A dialect's own sub-routes (/v1/messages/count_tokens) are its clients' too: they read errors the same way.
    dialect = _AT.get(path) or next((known for route, known in _AT.items() if path.startswith(route + "/")), None)
    return dialect.error_body(error) if dialect is not None else error.body()
