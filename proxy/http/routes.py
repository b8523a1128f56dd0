"""Route labels: a bounded name for each request path, for metrics and logs (clients choose paths)."""

from __future__ import annotations

CHAT_PATH = "/v1/chat/completions"
API_PREFIX = "/v1/"
# The probes and the metrics: open without a proxy key, and labelled by name.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def route_of(path: str) -> str:
    """"chat", "passthrough", "healthz", "readyz", "metrics" or "other": metrics must not grow with the paths
    clients make up."""
    if path == CHAT_PATH:
        return "chat"
    if path.startswith(API_PREFIX):
        return "passthrough"
    return path.strip("/") if path in OPEN_PATHS else "other"
