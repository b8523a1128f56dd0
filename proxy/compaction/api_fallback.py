"""`upstream_api: auto`: a client's own API (Responses, Messages) where the upstream has it, chat completions once it
shows it has not."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import Field, fields, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from proxy.compaction.journey import Journey
from proxy.compaction.pipeline import Pipeline
from proxy.core.usage import Usage
from proxy.dialects.call import Call
from proxy.request_context import current_request_id
from proxy.upstream.answer import Answer

log = logging.getLogger("proxy.pipeline")

# A route the upstream does not serve: 404 (not a model it lacks) or 405. Nothing was generated, nothing billed.
NO_ROUTE = frozenset({404, 405})
# A model the upstream lacks, in OpenAI's words and in Anthropic's envelope (a server that answers in that shape has
# the Messages API: its 404 is about the model, never the route).
# What a request's first reading takes off its body (read_call): kept when the request is read again for the bridge.
_CARRIED = frozenset({"mode", "edits", "compaction_requested"})
_MISSING_MODEL = (b"model_not_found", b"does not exist", b"not_found_error")


class Bridgeable(Call, Protocol):
    """A call a pipeline may have translated into a chat completion: a dataclass, as it is read again (replace)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def bridged(self) -> bool: ...


B = TypeVar("B", bound=Bridgeable)


def route_missing(answer: Answer) -> bool:
    """Whether the upstream answered that it has no such API (as opposed to no such model)."""
    if answer.status not in NO_ROUTE or answer.body is None:
        return False
    return answer.status == 405 or not any(marker in answer.body for marker in _MISSING_MODEL)


class NativeOrChat(Generic[B]):
    """Sends a route's requests in the client's own API until the upstream answers one with "no such route"; from
    then on (for this runtime, so a reload asks again) every request goes as a chat completion, that first one
    included. `route` names the client API in the log line that says so."""

    def __init__(self, route: str, native: Pipeline[B], bridged: Pipeline[B]) -> None:
        self._route = route
        self._native = native
        self._bridged = bridged
        self.chat_only = False

    def parse(self, body: bytes, headers: Mapping[str, str], query: str) -> B:
        return (self._bridged if self.chat_only else self._native).parse(body, headers, query)

    def glanced(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        return None  # which API the upstream speaks is learned from answers the whole way

    def relay(self, body: bytes, headers: Mapping[str, str], query: str,
              model: str) -> AbstractAsyncContextManager[Answer]:
        raise NotImplementedError("a route that may bridge glances at nothing")

    @asynccontextmanager
    async def answer(self, call: B) -> AsyncIterator[Answer]:
        if not self.chat_only:
            async with self._native.answer(call) as answer:
                if not route_missing(answer):
                    yield answer
                    return
            self.chat_only = True
            log.warning(json.dumps({"event": "upstream_api_learned", "request_id": current_request_id(),
                                    "route": self._route, "upstream_api": "chat", "status": answer.status}))
        if not call.bridged:  # the client's own body and headers, read as the bridge reads them; what the first
            # reading took off the body (its mode, the context edits it asked for) stays
            carried = {field.name: getattr(call, field.name) for field in fields(call) if field.name in _CARRIED}
            call = replace(self._bridged.parse(call.body, call.headers, call.query), **carried)
        async with self._bridged.answer(call) as answer:
            yield answer

    async def compacted(self, call: B) -> Journey[B] | None:
        return await (self._bridged if call.bridged else self._native).compacted(call)

    def estimate(self, call: B) -> int:
        return (self._bridged if call.bridged else self._native).estimate(call)

    def edited(self, call: B) -> B:
        return (self._bridged if call.bridged else self._native).edited(call)

    def summary_usage(self, journey: Journey[B]) -> Usage:
        return self._native.summary_usage(journey)

    def compaction_answer(self, journey: Journey[B]) -> Answer:
        return (self._bridged if journey.call.bridged else self._native).compaction_answer(journey)

    async def close(self) -> None:
        await self._native.close()
        await self._bridged.close()

