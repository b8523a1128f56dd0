"""`upstream_api: auto`: the Responses API where the upstream has it, chat completions once it shows it has not."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace

from proxy.compaction.pipeline import Journey, Pipeline
from proxy.core.usage import Usage
from proxy.dialects.responses_request import ResponsesCall
from proxy.request_context import current_request_id
from proxy.upstream.answer import Answer

log = logging.getLogger("proxy.pipeline")

# A route the upstream does not serve: 404 (not a model it lacks) or 405. Nothing was generated, nothing billed.
NO_ROUTE = frozenset({404, 405})
_MISSING_MODEL = (b"model_not_found", b"does not exist")


def route_missing(answer: Answer) -> bool:
    """Whether the upstream answered that it has no Responses API (as opposed to no such model)."""
    if answer.status not in NO_ROUTE or answer.body is None:
        return False
    return answer.status == 405 or not any(marker in answer.body for marker in _MISSING_MODEL)


class ResponsesOrChat:
    """Sends Responses requests as they are until the upstream answers one with "no such route"; from then on (for
    this runtime, so a reload asks again) every request goes as a chat completion, that first one included."""

    def __init__(self, native: Pipeline[ResponsesCall], bridged: Pipeline[ResponsesCall]) -> None:
        self._native = native
        self._bridged = bridged
        self.chat_only = False

    def parse(self, body: bytes, headers: Mapping[str, str], query: str) -> ResponsesCall:
        return (self._bridged if self.chat_only else self._native).parse(body, headers, query)

    @asynccontextmanager
    async def answer(self, call: ResponsesCall) -> AsyncIterator[Answer]:
        if not self.chat_only:
            async with self._native.answer(call) as answer:
                if not route_missing(answer):
                    yield answer
                    return
            self.chat_only = True
            log.warning(json.dumps({"event": "upstream_api_learned", "request_id": current_request_id(),
                                    "route": "responses", "upstream_api": "chat", "status": answer.status}))
        if not call.bridged:  # the client's own body and headers, read as the bridge reads them; its mode stays
            call = replace(self._bridged.parse(call.body, call.headers, call.query), mode=call.mode)
        async with self._bridged.answer(call) as answer:
            yield answer

    async def compacted(self, call: ResponsesCall) -> Journey[ResponsesCall] | None:
        return await (self._bridged if call.bridged else self._native).compacted(call)

    def estimate(self, call: ResponsesCall) -> int:
        return (self._bridged if call.bridged else self._native).estimate(call)

    def summary_usage(self, journey: Journey[ResponsesCall]) -> Usage:
        return self._native.summary_usage(journey)

    async def close(self) -> None:
        await self._native.close()
        await self._bridged.close()

