"""The summariser's model client: a non-streaming chat completion sent through an Upstream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from proxy import budget
from proxy.errors import ProxyError
from proxy.offload import off_loop_if_large
from proxy.overflow import detect_context_overflow
from proxy.summarizer import SummarizerError, SummarizerOverflow
from proxy.upstream import Upstream, UpstreamRequest

# Only what identifies the caller travels with a summariser request; nothing else of the client's request does.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "openai-organization", "openai-project", "api-key")


def credential_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's identifying headers. x-proxy-api-key is not one of them, and a proxy key in any of them is
    removed on the way out by upstream.request_headers, as from every upstream request."""
    return {name: value for name, value in headers.items() if name.lower() in CREDENTIAL_HEADERS}


class ModelClient:
    """Implements the summariser's ChatModel protocol over the proxy's own HTTP client."""

    def __init__(self, upstream: Upstream, model: str, headers: Mapping[str, str], *, max_output_tokens: int,
                 context_window: int | None, timeout: float, estimate: Callable[[list[dict[str, Any]]], int],
                 output_field: str = "max_tokens", temperature: float | None = None) -> None:
        self._upstream = upstream
        self.model = model
        self._headers = {**credential_headers(headers), "Content-Type": "application/json"}
        self.max_output_tokens = max_output_tokens
        self.context_window = context_window
        self._timeout = timeout
        self._output_field = output_field
        self._estimate = estimate
        self._temperature = temperature

    def output_limit(self, messages: list[dict[str, Any]]) -> int:
        """The output budget left once the prompt is in; servers reject prompt + max_tokens over the window."""
        room = budget.summarizer_output_room(self.context_window, self._estimate(messages), self.max_output_tokens)
        if room is None:
            raise SummarizerOverflow("the summariser's prompt leaves no room for a summary")
        return room

    def _request(self, sent: list[dict[str, Any]]) -> UpstreamRequest:
        """The summariser request: counting its prompt for the output limit is the costly part on a long one."""
        payload = {"model": self.model, "messages": sent, "stream": False,
                   self._output_field: self.output_limit(sent)}
        if self._temperature is not None:
            payload["temperature"] = self._temperature
        return UpstreamRequest("POST", "/chat/completions", "", self._headers, json.dumps(payload).encode())

    async def complete(self, system: str, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        sent = [{"role": "system", "content": system}, *messages]
        request = await off_loop_if_large(len(system), self._request, sent)
        try:
            async with asyncio.timeout(self._timeout):
                async with self._upstream.open(request) as response:
                    status, body = response.status, await self._upstream.read_body(response)
        except TimeoutError as error:
            raise SummarizerError(f"the summariser took longer than {self._timeout:g}s") from error
        except ProxyError as error:
            raise SummarizerError(f"the summariser could not be reached: {error.message}") from error
        if detect_context_overflow(status, body):
            raise SummarizerOverflow(f"the summariser's prompt did not fit (status {status})")
        if not 200 <= status < 300:
            raise SummarizerError(f"the summariser answered status {status}")
        return _first_choice(body)


def _first_choice(body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        answer = json.loads(body)
        choice = answer["choices"][0]
        message = dict(choice["message"])
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise SummarizerError("the summariser's answer is not a chat completion") from error
    message["finish_reason"] = choice.get("finish_reason")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    return message, usage
