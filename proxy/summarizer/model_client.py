"""The summariser's model client: a non-streaming chat completion sent through an Upstream."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from proxy.core import budget
from proxy.core.credentials import credential_headers
from proxy.errors import ProxyError, UpstreamAnswerTooLarge
from proxy.offload import off_loop_if_large
from proxy.summarizer.structured_output import FORMATS, Format, FormatMemory, Mode, memory_for, refuses, response_format
from proxy.summarizer.summarizer import SummarizerError, SummarizerOverflow
from proxy.upstream.overflow import detect_context_overflow
from proxy.upstream.upstream import Upstream, UpstreamRequest

log = logging.getLogger("proxy.model_client")

# A reply holds at most its output limit in tokens. A token is a few bytes of text; JSON escapes (`\\uXXXX` for every
# character of some scripts, as Python servers write them) make it up to ~12, long runs of whitespace more. Past
# this many bytes per token asked, plus the answer's envelope, a body is not this request's reply: reading stops.
REPLY_BYTES_PER_TOKEN = 32
REPLY_ENVELOPE_BYTES = 64 * 1024
class ModelClient:
    """Implements the summariser's ChatModel protocol over the proxy's own HTTP client."""

    def __init__(self, upstream: Upstream, model: str, headers: Mapping[str, str], *, max_output_tokens: int,
                 context_window: int | None, timeout: float, estimate: Callable[[list[dict[str, Any]]], int],
                 output_field: str = "max_tokens", temperature: float | None = None,
                 structured_output: Mode = "auto", formats: FormatMemory | None = None,
                 whole_output_tokens: int | None = None) -> None:
        self._upstream = upstream
        self.model = model
        self._headers = {**credential_headers(headers), "Content-Type": "application/json"}
        self.max_output_tokens = max_output_tokens
        self._whole = whole_output_tokens  # the part of the ask that must fit; the rest gives way to the prompt
        self.context_window = context_window
        self._timeout = timeout
        self._output_field = output_field
        self._estimate = estimate
        self._temperature = temperature
        self._mode: Mode = structured_output
        # Shared by every client of this upstream unless given: what one summary learns, the next one knows.
        self._formats = formats if formats is not None else memory_for(upstream)
        self._key = (upstream.config.base_url, model)
        self._last_format: Format | None = None
        self._constrain_next = False

    def limited(self, tokens: int) -> ModelClient:
        """This client asking for at most `tokens` of output, for one part of a history summarised in parts; what
        it learns of the upstream's formats is shared with this one."""
        part = copy.copy(self)
        part.max_output_tokens = min(tokens, self.max_output_tokens)
        part._whole = min(tokens, self._whole) if self._whole is not None else None
        part._last_format, part._constrain_next = None, False
        return part

    def output_limit(self, messages: list[dict[str, Any]]) -> int:
        """The output budget left once the prompt is in; servers reject prompt + max_tokens over the window."""
        room = budget.summarizer_output_room(self.context_window, self._estimate(messages), self.max_output_tokens,
                                             self._whole)
        if room is None:
            raise SummarizerOverflow("the summariser's prompt leaves no room for a summary")
        return room

    def _request(self, sent: list[dict[str, Any]], tools: Any, kind: Format | None) -> tuple[UpstreamRequest, int]:
        """The summariser request and the most bytes its answer may take: counting its prompt for the output limit
        is the costly part on a long one."""
        limit = self.output_limit(sent)
        payload: dict[str, Any] = {"model": self.model, "messages": sent, "stream": False, self._output_field: limit}
        if tools is not None:
            # The conversation's own tools keep its prefix identical for the server's cache; "none" asks for text.
            payload["tools"], payload["tool_choice"] = tools, "none"
        if self._temperature is not None:
            payload["temperature"] = self._temperature
        if kind is not None:
            payload["response_format"] = response_format(kind, limit)
        body = json.dumps(payload).encode()
        return UpstreamRequest("POST", "/chat/completions", "", self._headers, body), reply_bound(limit)

    async def complete(self, system: str | None, messages: list[dict[str, Any]],
                       tools: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        sent = [*([] if system is None else [{"role": "system", "content": system}]), *messages]
        size = len(system) if system is not None else sum(len(str(message.get("content"))) for message in messages)
        status, body = await self._constrained_or_plain(sent, tools, size)
        if detect_context_overflow(status, body):
            raise SummarizerOverflow(f"the summariser's prompt did not fit (status {status})")
        if not 200 <= status < 300:
            raise SummarizerError(f"the summariser answered status {status}")
        return _first_choice(body)

    def reply_parsed(self, parsed: bool) -> None:
        """The summariser's verdict on the last reply: in `auto`, plain replies of this upstream and model that
        keep failing to parse move it to constrained output (the reply under a schema is bare JSON)."""
        if self._mode == "auto" and self._last_format is None and self._formats.note_plain_reply(self._key, parsed):
            log.info("summariser %s at %s: its replies keep failing to parse; asking for the summary schema "
                     "through response_format from now on", self.model, self._key[0])

    def retry_constrained(self) -> bool:
        """After a plain reply cut off by its limit, in `auto`: whether the next request goes out under the bounded
        schema instead (its grammar makes the reply end in time). Only that request: a capable model whose ask was
        too small is not moved to constrained output for good, which costs facts (proxy.structured_output)."""
        if self._mode != "auto" or self._last_format is not None:
            return False
        self._constrain_next = bool(self._available_formats())
        return self._constrain_next

    def _available_formats(self) -> tuple[Format, ...]:
        return tuple(kind for kind in FORMATS if self._formats.formats(kind, self._key))

    def _formats_now(self) -> tuple[Format, ...]:
        if self._constrain_next:
            self._constrain_next = False
            return self._available_formats()
        return self._formats.formats(self._mode, self._key)

    async def _constrained_or_plain(self, sent: list[dict[str, Any]], tools: Any, size: int) -> tuple[int, bytes]:
        """(status, body) of the first answer that is not a refusal of its format; the plain request last.

        A refused format is remembered and never sent again to this upstream and model, so each refusal costs
        one extra request, once. When the server fails the next request the same way (5xx) even so, the
        refusals are taken back: the server was down, not unwilling.
        """
        refused: list[Format] = []
        for kind in (*self._formats_now(), None):
            try:
                status, body = await self._send(*await off_loop_if_large(size, self._request, sent, tools, kind))
            except SummarizerError:
                self._forgive(refused)
                raise
            if kind is None or detect_context_overflow(status, body) or \
                    not refuses(status, body, accepted_before=self._formats.accepted_before(self._key, kind)):
                break  # an overflow says nothing about the format: the ladder shrinks the prompt and asks again
            self._formats.refuse(self._key, kind)
            refused.append(kind)
            log.info("summariser %s at %s refused response_format %s (status %d); not sending it again",
                     self.model, self._key[0], kind, status)
        if status >= 500:
            self._forgive(refused)
        elif kind is not None and 200 <= status < 300:
            self._formats.accept(self._key, kind)
        self._last_format = kind
        return status, body

    def _forgive(self, refused: list[Format]) -> None:
        for kind in refused:
            self._formats.forgive(self._key, kind)

    async def _send(self, request: UpstreamRequest, bound: int) -> tuple[int, bytes]:
        """(status, body) of one request; a body is read up to `bound` bytes and no further."""
        try:
            async with asyncio.timeout(self._timeout):
                async with self._upstream.open(request) as response:
                    if response.content_type == "text/event-stream":
                        # Asked for one reply, a stream is no answer: its end is not in sight, nor its size.
                        raise SummarizerError("the summariser answered a request for one reply with a stream")
                    return response.status, await self._upstream.read_body(response, bound)
        except TimeoutError as error:
            raise SummarizerError(f"the summariser took longer than {self._timeout:g}s") from error
        except UpstreamAnswerTooLarge as error:
            raise SummarizerError(f"the summariser's answer is too long to be a summary: {error.message}") from error
        except ProxyError as error:
            raise SummarizerError(f"the summariser could not be reached: {error.message}") from error


def reply_bound(output_tokens: int) -> int:
    """The most bytes an answer asking for `output_tokens` may take (a generous factor: see REPLY_BYTES_PER_TOKEN)."""
    return REPLY_ENVELOPE_BYTES + REPLY_BYTES_PER_TOKEN * max(0, output_tokens)


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
