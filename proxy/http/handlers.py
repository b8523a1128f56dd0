"""HTTP handlers: parse the request, call the core, respond. Nothing else lives here."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from proxy.compaction.api_fallback import NO_ROUTE
from proxy.compaction.journey import Serving
from proxy.compaction.recorder import summary_id
from proxy.core.credentials import presents_one_of
from proxy.core.usage import Usage
from proxy.dialects.call import Call
from proxy.dialects.messages_request import MessagesCall
from proxy.dialects.responses_compaction import compaction_item, compaction_response
from proxy.errors import BadRequest, SummaryUnavailable, UpgradeRefused
from proxy.headers import COMPACTION, COMPACTION_ID, COUNTED_BY, REASON
from proxy.http.appkeys import METRICS, RUNTIME
from proxy.http.pin import pinned
from proxy.http.relay import deliver
from proxy.http.request_body import read_body
from proxy.log_filters import mask_url
from proxy.metrics import CONTENT_TYPE
from proxy.offload import LARGE_JSON, off_loop_above
from proxy.upstream.answer import Answer
from proxy.upstream.upstream import UpstreamRequest

API_PREFIX = "/v1"
_COUNT_BYTES = 64 * 1024  # more than any token count answer holds
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def query_of(request: web.Request) -> str:
    """The raw query string, forwarded as it came."""
    return request.raw_path.partition("?")[2]


def upstream_request(request: web.Request, body: bytes) -> UpstreamRequest:
    """The client's request re-addressed below the upstream base URL, query string kept raw."""
    path, _, query = request.raw_path.partition("?")
    return UpstreamRequest(request.method, path[len(API_PREFIX):], query, request.headers, body)


async def passthrough(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").strip().lower() == "websocket":
        return refuse_upgrade()
    return await forward(request, await read_body(request))


async def forward(request: web.Request, body: bytes) -> web.StreamResponse:
    """The request sent on as it came (its body already read), the upstream's answer relayed."""
    upstream = pinned(request).upstream
    async with upstream.open(upstream_request(request, body)) as response:
        return await deliver(request, Answer.relayed(upstream, response))


def compacting(dialect: str) -> Handler:
    """The handler of a route the proxy compacts on, through the pipeline of the named dialect."""

    async def handle(request: web.Request) -> web.StreamResponse:
        pipeline = pinned(request).pipelines[dialect]
        body = await read_body(request)
        if (model := pipeline.glanced(body, request.headers)) is not None:
            async with pipeline.relay(body, request.headers, query_of(request), model) as answer:
                return await deliver(request, answer)
        call = await parsed(request, pipeline, body)
        if call.compaction_requested:
            if (answered := await compaction_answer(pipeline, call)) is not None:
                return await deliver(request, answered)
            if isinstance(call, MessagesCall):  # its `compaction` was read off the body: nothing is left to send
                raise BadRequest("compaction was asked for, and compaction is off for this request at this proxy",
                                 param="compaction")
        async with pipeline.answer(call) as answer:
            return await deliver(request, answer)

    return handle


async def parsed(request: web.Request, pipeline: Serving, body: bytes | None = None) -> Call:
    body = await read_body(request) if body is None else body
    # Parsing (and bounding) a history of many megabytes is CPU work: off the loop when it is that large.
    call: Call = await off_loop_above(LARGE_JSON, len(body), pipeline.parse, body, request.headers,
                                      query_of(request))
    return call


def refuse_upgrade() -> web.Response:
    """426 for a WebSocket handshake (Codex asks for Responses over WebSocket first), and the connection closed."""
    refused = UpgradeRefused("WebSocket is not served here: send the request as HTTP POST")
    response = web.json_response(refused.body(), status=refused.status,
                                 headers={"Connection": "close", **refused.headers()})
    response.force_close()
    return response


async def responses_compact(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses/compact, answered by the proxy itself for any upstream that does not compact: the
    conversation compacted now into one `compaction` item that the proxy opens again on the next request. Where the
    proxy may not compact (compaction off, an upstream that compacts by itself), the request goes on untouched."""
    pinning = pinned(request)
    pipeline = pinning.pipelines["responses"]
    call = await parsed(request, pipeline)
    compacted = None if pinning.settings.dialects.responses.upstream_compaction else \
        await compacted_item(pipeline, call)
    if compacted is None:
        return await forward(request, call.body)
    item, usage, headers = compacted
    return web.json_response(compaction_response(item, usage), headers=headers)


async def messages_count_tokens(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages/count_tokens: the count of the request as the proxy would send it (context management
    applied where the proxy runs it, a compaction block opened): the upstream's where it has the route (Anthropic's
    API does, most servers do not); where it answers 404 or 405, or speaks only chat completions, the proxy's
    calibrated estimate. Edits applied add `context_management.original_input_tokens`, as Anthropic's count does."""
    pinning = pinned(request)
    pipeline = pinning.pipelines["messages"]
    call = await parsed(request, pipeline)
    assert isinstance(call, MessagesCall), "the Messages route reads Messages requests"
    edited = pipeline.edited(call)
    if not call.bridged:  # a chat server has no such route
        if edited.body is call.body:
            async with pinning.upstream.open(upstream_request(request, call.body)) as response:
                if response.status not in NO_ROUTE:
                    return await deliver(request, Answer.relayed(pinning.upstream, response))
        elif (counts := await upstream_counts(request, edited.body, call.body)) is not None:
            return web.json_response(counts)
    counted: dict[str, Any] = {"input_tokens": pipeline.estimate(edited)}
    if edited.body is not call.body:
        counted["context_management"] = {"original_input_tokens": pipeline.estimate(call)}
    return web.json_response(counted, headers={COUNTED_BY: "proxy"})


async def upstream_counts(request: web.Request, edited: bytes, original: bytes) -> dict[str, Any] | None:
    """The upstream's count of the edited request with its count of the original beside it; None when either is
    not a count (no such route, an error: the proxy's estimate answers instead)."""
    counts = [await upstream_count(request, body) for body in (edited, original)]
    if counts[0] is None or counts[1] is None:
        return None
    return {"input_tokens": counts[0], "context_management": {"original_input_tokens": counts[1]}}


async def upstream_count(request: web.Request, body: bytes) -> int | None:
    upstream = pinned(request).upstream
    async with upstream.open(upstream_request(request, body)) as response:
        if response.status != 200:
            return None
        try:  # a count is a few bytes: a longer answer is not one
            answer = json.loads(await response.content.read(_COUNT_BYTES))
        except (ValueError, aiohttp.ClientError):
            return None
    count = answer.get("input_tokens") if isinstance(answer, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


async def compaction_answer(pipeline: Serving, call: Call) -> Answer | None:
    """The answer to a request that asks for a compaction and nothing else (Codex's `compaction_trigger`, an
    on-demand Messages `compaction`), in the client's API and as it asked (streamed or not); None when the proxy
    may not compact it, 502 when no summary could be made."""
    journey = await pipeline.compacted(call)
    if journey is None:
        return None
    if journey.conversation.record is None and journey.failed:  # a summary was wanted and could not be made
        raise SummaryUnavailable(f"the conversation could not be compacted ({journey.reason}); nothing was changed")
    return pipeline.compaction_answer(journey)


async def compacted_item(pipeline: Serving, call: Call) -> tuple[dict[str, Any], Usage, dict[str, str]] | None:
    """The request's conversation compacted now, as one compaction item; None when the proxy may not compact it,
    502 when no summary could be made."""
    journey = await pipeline.compacted(call)
    if journey is None:
        return None
    conversation = journey.conversation
    if conversation.record is None and journey.failed:  # a summary was wanted and could not be made
        raise SummaryUnavailable(f"the conversation could not be compacted ({journey.reason}); nothing was changed")
    item = compaction_item(journey.view, conversation.messages, conversation.synthetic)
    headers = {COMPACTION: journey.trigger, **({REASON: journey.reason} if journey.reason else {})}
    if journey.origin is not None and conversation.record is not None:  # the journal is on: the event to read
        headers[COMPACTION_ID] = summary_id(conversation.namespace, conversation.record.prefix_hash)
    return item, pipeline.summary_usage(journey), headers


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    # The live settings (a reload may have changed the upstream); the store outlives reloads.
    settings, store = pinned(request).settings, request.app[RUNTIME].shared.store
    store_ok = await store.ping()
    body: dict[str, object] = {"status": "ready" if store_ok else "degraded",
                               "store": "ok" if store_ok else "unreachable"}
    # /readyz is open: what the proxy runs in front of is shown to an operator only (and without passwords).
    admin_keys = pinned(request).admin_keys
    if admin_keys and presents_one_of(request.headers, admin_keys):
        body["upstream"] = mask_url(settings.upstream.base_url)
        status = getattr(store, "status", None)  # RedisStore: where it is, since when it is down, the last error
        if callable(status):
            body["store_detail"] = status()
    # A shared store that is down costs reuse, not service: stay in the load balancer (200, "degraded").
    serving = store_ok or settings.store.kind == "redis"
    return web.json_response(body, status=200 if serving else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].exposition(), headers={"Content-Type": CONTENT_TYPE})
