"""Context windows as upstreams state them: pure parsers of four response shapes, and one function that asks."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.core.credentials import credential_headers
from proxy.errors import ProxyError
from proxy.upstream.upstream import Upstream, UpstreamRequest

log = logging.getLogger("proxy.discovery")

# A named limit outside this range is a parsing accident or a server misreport, not a window to trust.
PLAUSIBLE_WINDOW = range(256, 100_000_001)
# Discovery runs before a request is planned: it may delay one request per TTL, never by much.
DISCOVERY_TIMEOUT_SECONDS = 3.0
# A listing of thousands of models (OpenRouter's is ~1 MB) fits; an endless or hostile one is not read past this.
MAX_LISTING_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Discovered:
    """What one upstream said: windows per model name, and one for any name (a llama.cpp server has one model)."""

    by_model: Mapping[str, int] = field(default_factory=dict)
    served: int | None = None

    def __bool__(self) -> bool:
        return bool(self.by_model) or self.served is not None

    def window(self, model: str | None) -> int | None:
        return self.by_model.get(model or "", self.served)


def plausible(value: Any) -> int | None:
    """`value` as a window, or None: integers (or integral floats) inside PLAUSIBLE_WINDOW only."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value in PLAUSIBLE_WINDOW else None


def _json(body: bytes | None) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # also UnicodeDecodeError: an HTML error page or garbage, no window
        return None


def _entries(tree: Any) -> list[dict[str, Any]]:
    data = tree.get("data") if isinstance(tree, dict) else None
    return [entry for entry in data if isinstance(entry, dict)] if isinstance(data, list) else []


def _smallest(pairs: Iterable[tuple[str, int | None]]) -> dict[str, int]:
    # A name listed twice (LiteLLM deployments behind one alias, providers behind one id) may be routed to
    # either: only the smaller window is safe for both.
    windows: dict[str, int] = {}
    for name, window in pairs:
        if window is not None:
            windows[name] = min(window, windows.get(name, window))
    return windows


def _listing_window(entry: dict[str, Any]) -> int | None:
    vllm = plausible(entry.get("max_model_len"))
    if vllm is not None:
        return vllm
    top_provider = entry.get("top_provider")
    stated = [plausible(entry.get("context_length")),
              plausible(top_provider.get("context_length")) if isinstance(top_provider, dict) else None]
    # OpenRouter names the model's window and its top provider's; a request may land on the smaller.
    known = [window for window in stated if window is not None]
    return min(known) if known else None


def parse_models(body: bytes | None) -> dict[str, int]:
    """`GET /v1/models`: vLLM's `max_model_len`, OpenRouter's `context_length` / `top_provider.context_length`."""
    return _smallest((entry["id"], _listing_window(entry)) for entry in _entries(_json(body))
                     if isinstance(entry.get("id"), str))


def parse_props(body: bytes | None) -> int | None:
    """llama.cpp's `GET /props`: the per-slot `default_generation_settings.n_ctx`, or an older top-level `n_ctx`."""
    tree = _json(body)
    if not isinstance(tree, dict):
        return None
    settings = tree.get("default_generation_settings")
    per_slot = plausible(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return per_slot if per_slot is not None else plausible(tree.get("n_ctx"))


def _model_info_window(info: Any) -> int | None:
    if not isinstance(info, dict):
        return None
    window = plausible(info.get("max_input_tokens"))
    if window is not None:
        return window
    # LiteLLM's legacy `max_tokens` is the output limit whenever the provider names one: not a window then.
    total = plausible(info.get("max_tokens"))
    return total if total is not None and total != info.get("max_output_tokens") else None


def parse_model_info(body: bytes | None) -> dict[str, int]:
    """LiteLLM's `GET /model/info`: `data[].model_name` with `model_info.max_input_tokens` (else `max_tokens`)."""
    return _smallest((entry["model_name"], _model_info_window(entry.get("model_info")))
                     for entry in _entries(_json(body)) if isinstance(entry.get("model_name"), str))


def combine(models: bytes | None, model_info: bytes | None, props: bytes | None) -> Discovered:
    listed = parse_models(models)
    by_model = _smallest([*listed.items(), *parse_model_info(model_info).items()])
    return Discovered(by_model, parse_props(props))


def api_root(base_url: str) -> str:
    """The server root above an OpenAI-style base URL: llama.cpp serves `/props` there, not under `/v1`."""
    base = base_url.rstrip("/")
    return base.removesuffix("/v1") if base.endswith("/v1") else base


@dataclass(frozen=True)
class WindowSource:
    """Where one upstream states its windows: under its API base URL, and at its server root."""

    api: Upstream
    root: Upstream

    @classmethod
    def of(cls, session: aiohttp.ClientSession, upstream: Upstream) -> WindowSource:
        # Clients of their own: a discovery that finds nothing is not an upstream failure to count.
        api = Upstream(session, upstream.config)
        root = api_root(upstream.config.base_url)
        if root == upstream.config.base_url:
            return cls(api, api)
        return cls(api, Upstream(session, upstream.config.model_copy(update={"base_url": root})))

    @property
    def base_url(self) -> str:
        return self.api.config.base_url

    async def discover(self, headers: Mapping[str, str], *, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovered:
        return await discover_windows(self, headers, timeout=timeout)


async def _get(upstream: Upstream, path: str, headers: Mapping[str, str]) -> bytes | None:
    """The body of a 200 answer, else None; every failure is only a missing answer."""
    try:
        async with upstream.open(UpstreamRequest("GET", path, "", headers, b"")) as response:
            if response.status != 200:
                log.debug("window discovery: %s%s answered %d", upstream.config.base_url, path, response.status)
                return None
            return await upstream.read_body(response, MAX_LISTING_BYTES)
    except ProxyError as error:
        log.debug("window discovery: %s%s failed: %s", upstream.config.base_url, path, error.message)
        return None


async def discover_windows(source: WindowSource, headers: Mapping[str, str], *,
                           timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovered:
    """Ask every place a window may be stated, at once and within `timeout`; never raises for the upstream."""
    # Listings are usually authenticated, so the client's credentials go along; nothing else of its request does.
    sent = {**credential_headers(headers), "Accept": "application/json"}
    asks = [_get(source.api, "/models", sent), _get(source.api, "/model/info", sent),
            _get(source.root, "/props", sent)]
    tasks = [asyncio.ensure_future(ask) for ask in asks]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    models, model_info, props = (_result(task) if task in done else None for task in tasks)
    found = combine(models, model_info, props)
    log.log(logging.INFO if found else logging.DEBUG, "window discovery at %s: %d model windows%s%s",
            source.base_url, len(found.by_model),
            f", server window {found.served}" if found.served is not None else "",
            f" ({len(pending)} endpoints timed out)" if pending else "")
    return found


def _result(task: asyncio.Future[bytes | None]) -> bytes | None:
    if task.cancelled() or task.exception() is not None:
        log.debug("window discovery request failed", exc_info=task.exception())
        return None
    return task.result()
