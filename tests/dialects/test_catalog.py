"""proxy.dialects.catalog: each dialect at one route, named once; the router serves exactly those routes; each
served as what the upstream speaks needs."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import settings_from_mapping
from proxy.dialects.catalog import API_PREFIX, DIALECTS, ROUTES, error_body, fallback, route_path, serving
from proxy.dialects.chat import CHAT
from proxy.dialects.messages import MESSAGES
from proxy.dialects.messages_over_chat import MESSAGES_OVER_CHAT
from proxy.dialects.responses import RESPONSES, RESPONSES_OVER_CHAT
from proxy.errors import BadRequest, Unauthorized


def test_chat_completions_is_served_where_clients_post_it() -> None:
    assert CHAT in DIALECTS
    assert route_path(CHAT) == "/v1/chat/completions"
    assert ROUTES["/v1/chat/completions"] == "chat"


def test_each_dialect_has_its_own_name_and_route() -> None:
    names = [dialect.name for dialect in DIALECTS]
    paths = [route_path(dialect) for dialect in DIALECTS]
    assert len(set(names)) == len(names) and len(set(paths)) == len(paths)
    assert ROUTES == dict(zip(paths, names, strict=True))
    assert all(path.startswith(API_PREFIX + "/") for path in paths)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/chat/completions/", "/healthz", ""])
def test_a_proxy_error_takes_the_shape_of_its_route(path: str) -> None:
    """Chat completions and every route that is no dialect's answer in OpenAI's shape."""
    error = BadRequest("messages must be a list", param="messages")
    assert error_body(path, error) == {"error": {"message": "messages must be a list", "type": "invalid_request_error",
                                                 "param": "messages", "code": None}}


def test_each_dialect_shapes_the_proxy_errors_on_its_route() -> None:
    error = Unauthorized("a valid proxy API key is required")
    for dialect in DIALECTS:
        assert error_body(route_path(dialect), error) == dialect.error_body(error)


@pytest.mark.parametrize(("path", "anthropic"), [
    ("/v1/messages", True), ("/v1/messages/count_tokens", True), ("/v1/messagesx", False),
    ("/v1/chat/completions", False), ("/v1/responses/compact", False), ("/v1/models", False), ("/healthz", False),
])
def test_a_proxy_error_takes_the_shape_of_the_api_at_its_path(path: str, anthropic: bool) -> None:
    body = error_body(path, BadRequest("no"))
    assert (body.get("type") == "error" and body["error"]["type"] == "invalid_request_error") is anthropic
    assert anthropic or body == BadRequest("no").body()


@pytest.mark.parametrize(("dialect", "api", "served", "bridge"), [
    (MESSAGES, "messages", MESSAGES, None),
    (MESSAGES, "chat", MESSAGES_OVER_CHAT, None),
    (MESSAGES, "auto", MESSAGES, MESSAGES_OVER_CHAT),
    (RESPONSES, "responses", RESPONSES, None),
    (RESPONSES, "chat", RESPONSES_OVER_CHAT, None),
    (RESPONSES, "auto", RESPONSES, RESPONSES_OVER_CHAT),
    (CHAT, "chat", CHAT, None),
])
def test_what_each_client_api_is_served_by_for_what_the_upstream_speaks(dialect: Any, api: str, served: Any,
                                                                         bridge: Any) -> None:
    """upstream_api: the client's own API, the bridge to chat, or the client's own until a 404 says otherwise."""
    settings = settings_from_mapping({"dialects": {name: {"upstream_api": api} for name in ("messages", "responses")
                                                   if name == dialect.name}}, env={})
    assert serving(dialect, settings) is served and fallback(dialect, settings) is bridge
