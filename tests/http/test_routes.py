"""proxy.http.routes: the route constants, and the bounded route label of any request path."""

from __future__ import annotations

import pytest

from proxy.dialects.catalog import ROUTES
from proxy.http.routes import API_PREFIX, OPEN_PATHS, route_of

LABELS = {"chat", "responses", "messages", "responses_compact", "messages_count_tokens", "passthrough", "healthz",
          "readyz", "metrics", "other"}


def test_route_constants() -> None:
    assert ROUTES == {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}
    assert API_PREFIX == "/v1/"
    assert OPEN_PATHS == frozenset({"/healthz", "/readyz", "/metrics"})
    paths = [*ROUTES, API_PREFIX, *sorted(OPEN_PATHS)]
    assert len(set(paths)) == len(paths) == 7
    assert all(path.startswith(API_PREFIX) for path in ROUTES)
    assert not any(path.startswith(API_PREFIX) for path in OPEN_PATHS)


@pytest.mark.parametrize(("path", "label"), [
    ("/v1/chat/completions", "chat"),
    ("/v1/chat/completions/", "passthrough"),
    ("/v1/responses", "responses"),
    ("/v1/responses/compact", "responses_compact"),
    ("/v1/messages/count_tokens", "messages_count_tokens"),
    ("/v1/messages", "messages"),
    ("/v1/responses/compact/", "passthrough"),
    ("/v1/responses/resp_1", "passthrough"),
    ("/v1/chat/completions?stream=1", "passthrough"),
    ("/v1/models", "passthrough"),
    ("/v1/", "passthrough"),
    ("/v1/\ud800", "passthrough"),
    ("/v1", "other"),
    ("/V1/models", "other"),
    ("/healthz", "healthz"),
    ("/readyz", "readyz"),
    ("/metrics", "metrics"),
    ("/healthz/", "other"),
    ("//healthz", "other"),
    ("/HEALTHZ", "other"),
    ("healthz", "other"),
    ("", "other"),
    ("/", "other"),
    ("/\ud800", "other"),
    ("/x" * 100_000, "other"),
])
def test_route_of(path: str, label: str) -> None:
    assert route_of(path) == label
    assert label in LABELS
