"""proxy.errors: each proxy error's status, type and code, and its OpenAI-shaped body."""

from __future__ import annotations

import json

import pytest

from proxy.errors import (
    BadRequest,
    PayloadTooLarge,
    ProxyError,
    RequestTimeout,
    Unauthorized,
    UnsupportedEncoding,
    UpstreamAnswerTooLarge,
    UpstreamTimeout,
    UpstreamUnreachable,
    openai_error_body,
)

TABLE = [
    (ProxyError, 500, "proxy_error", None),
    (BadRequest, 400, "invalid_request_error", None),
    (Unauthorized, 401, "invalid_request_error", "invalid_api_key"),
    (PayloadTooLarge, 413, "invalid_request_error", "request_too_large"),
    (RequestTimeout, 408, "invalid_request_error", "request_timeout"),
    (UnsupportedEncoding, 415, "invalid_request_error", "unsupported_content_encoding"),
    (UpstreamUnreachable, 502, "upstream_error", "upstream_unreachable"),
    (UpstreamAnswerTooLarge, 502, "upstream_error", "upstream_answer_too_large"),
    (UpstreamTimeout, 504, "upstream_error", "upstream_timeout"),
]


@pytest.mark.parametrize(("cls", "status", "error_type", "code"), TABLE)
def test_each_error(cls: type[ProxyError], status: int, error_type: str, code: str | None) -> None:
    error = cls("went wrong", param="messages")
    assert (error.status, error.error_type, error.code) == (status, error_type, code)
    assert isinstance(error, ProxyError) and str(error) == error.message == "went wrong"
    expected = {"error": {"message": "went wrong", "type": error_type, "param": "messages", "code": code}}
    assert error.body() == expected
    assert json.loads(error.body_bytes()) == expected


def test_the_codes_name_one_error_each() -> None:
    codes = [code for _, _, _, code in TABLE if code is not None]
    assert len(codes) == len(set(codes)) == 7


def test_a_code_given_overrides_only_that_instance() -> None:
    overridden = BadRequest("bad", code="model_not_found")
    assert overridden.code == "model_not_found" and overridden.body()["error"]["code"] == "model_not_found"
    assert BadRequest.code is None and BadRequest("bad").code is None
    assert Unauthorized("no", code=None).code == "invalid_api_key"  # None keeps the class's code
    assert Unauthorized("no", code="other").code == "other" and Unauthorized.code == "invalid_api_key"


def test_param_defaults_to_none() -> None:
    assert PayloadTooLarge("too big").body() == {
        "error": {"message": "too big", "type": "invalid_request_error", "param": None, "code": "request_too_large"}}


@pytest.mark.parametrize("message", [
    "",
    'quote " backslash \\ newline \n',
    "héllo \u2603",
    "lone \ud800 surrogate",
    "x" * 1_000_000,
])
def test_body_bytes_are_ascii_json_for_any_message(message: str) -> None:
    raw = BadRequest(message).body_bytes()
    assert raw.isascii()
    assert json.loads(raw)["error"]["message"] == message


def test_body_bytes_escape_non_ascii() -> None:
    assert BadRequest("é\ud800").body_bytes() == (
        b'{"error": {"message": "\\u00e9\\ud800", "type": "invalid_request_error", "param": null, "code": null}}')


def test_raised_errors_are_caught_as_proxy_errors() -> None:
    with pytest.raises(ProxyError) as caught:
        raise UpstreamTimeout("slow upstream")
    assert caught.value.status == 504 and caught.value.body()["error"]["type"] == "upstream_error"


def test_openai_error_body() -> None:
    assert openai_error_body("m", "t") == {"error": {"message": "m", "type": "t", "param": None, "code": None}}
    assert openai_error_body("m", "t", param="p", code="c") == {
        "error": {"message": "m", "type": "t", "param": "p", "code": "c"}}


def test_body_bytes_refuse_a_message_that_is_not_json() -> None:
    with pytest.raises(TypeError):
        ProxyError(b"bytes").body_bytes()  # type: ignore[arg-type]
