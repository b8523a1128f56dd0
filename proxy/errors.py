"""The small vocabulary of errors the proxy itself produces, in OpenAI's error shape."""

from __future__ import annotations

import json
from typing import Any

from proxy.headers import refusal


class ProxyError(Exception):
    """An error answered by the proxy itself (never one relayed from the upstream)."""

    status: int = 500
    error_type: str = "proxy_error"
    code: str | None = None
    outcome: str = "none"  # x-compaction on the answer: what became of compaction

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return openai_error_body(self.message, self.error_type, param=self.param, code=self.code)

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()

    def headers(self) -> dict[str, str]:
        """x-compaction and x-compaction-reason for the answer: every answer says what compaction did."""
        return refusal(self.code, self.error_type, self.outcome)


class BadRequest(ProxyError):
    status = 400
    error_type = "invalid_request_error"


class Unauthorized(ProxyError):
    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(ProxyError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class ServiceUnavailable(ProxyError):
    status = 503
    error_type = "proxy_error"
    code = "journal_unavailable"


class PayloadTooLarge(ProxyError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class RequestTimeout(ProxyError):
    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class UnsupportedEncoding(ProxyError):
    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_content_encoding"


class UpgradeRefused(ProxyError):
    """A WebSocket upgrade: the proxy serves HTTP only. 426 is the answer Codex takes as "use HTTP" at once (any
    other failed handshake it retries with back-off first)."""

    status = 426
    error_type = "invalid_request_error"
    code = "websocket_not_supported"


class SummaryUnavailable(ProxyError):
    """A compaction the client asked for (POST /responses/compact) that the summariser could not make."""

    status = 502
    error_type = "upstream_error"
    code = "compaction_failed"
    outcome = "failed"


class UpstreamUnreachable(ProxyError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamAnswerTooLarge(ProxyError):
    """An upstream answer the proxy reads itself (a summary, a model listing) ran past the bytes it may take."""

    status = 502
    error_type = "upstream_error"
    code = "upstream_answer_too_large"


class UpstreamTimeout(ProxyError):
    status = 504
    error_type = "upstream_error"
    code = "upstream_timeout"


def openai_error_body(message: str, error_type: str, *, param: str | None = None,
                      code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
