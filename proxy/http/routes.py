"""Route labels: a bounded name for each request path, for metrics and logs (clients choose paths)."""

from __future__ import annotations

from proxy.dialects.catalog import ROUTES

API_PREFIX = "/v1/"
# OpenAI's compaction endpoint, answered by the proxy itself for any upstream.
COMPACT_PATH = "/v1/responses/compact"
# Anthropic's token counter: the upstream's where it has one, the proxy's estimate where it does not.
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
# The probes and the metrics: open without a proxy key, and labelled by name.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# The proxy's own routes (the journal's API, the dashboard): never an upstream's, which all sit under /v1/.
OWN_PREFIX = "/_proxy/"


def route_of(path: str) -> str:
    """A dialect's name ("chat", "responses", "messages"), "responses_compact", "messages_count_tokens",
    "passthrough", "healthz", "readyz", "metrics", "journal_api", "dashboard" or "other": metrics must not grow
    with the paths clients make up."""
    if (name := ROUTES.get(path)) is not None:
        return name
    if path == COMPACT_PATH:
        return "responses_compact"
    if path == COUNT_TOKENS_PATH:
        return "messages_count_tokens"
    if path.startswith(API_PREFIX):
        return "passthrough"
    if path.startswith(OWN_PREFIX):
        return "journal_api" if path.startswith(f"{OWN_PREFIX}api/") else "dashboard"
    return path.strip("/") if path in OPEN_PATHS else "other"
