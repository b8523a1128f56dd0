"""Shared fixtures: a fake upstream and the proxy in front of it, both on real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load

from proxy.app import RunningServer, start_server
from proxy.config import Settings, UpstreamConfig, settings_from_mapping
from proxy.core.encodings import BUNDLED_ENCODING, clear_encoding_cache
from proxy.http.appkeys import RUNTIME
from proxy.upstream.upstream import Upstream, create_session
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import deep_merge, serve_app

ProxyFactory = Callable[..., Awaitable[RunningServer]]
# Re-exported: tests import the serving helpers from here as well as from tests.fakes.serving.
__all__ = ["ProxyFactory", "deep_merge", "serve_app"]
pytest_plugins = ["tests.secrets_scan"]  # fails the run if a key or password reaches a log or store


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    state = FakeUpstream()
    runner, url = await serve_app(FakeUpstreamApp(state).build())
    state.url = url
    yield state
    await runner.cleanup()


@pytest.fixture
async def upstream(fake: FakeUpstream) -> AsyncIterator[Upstream]:
    """The proxy's own upstream client, pointed at the fake (for units that call a model without a proxy)."""
    config = UpstreamConfig(base_url=f"{fake.url}/v1")
    async with create_session(config) as session:
        yield Upstream(session, config)


@pytest.fixture
async def make_proxy(fake: FakeUpstream) -> AsyncIterator[ProxyFactory]:
    """Start a proxy in front of the fake with config overrides (a nested dict, as in YAML)."""
    running: list[RunningServer] = []

    async def start(overrides: dict[str, Any] | None = None) -> RunningServer:
        base = {"upstream": {"base_url": f"{fake.url}/v1"}}
        settings: Settings = settings_from_mapping(deep_merge(base, overrides or {}), env={})
        server = await start_server(settings, host="127.0.0.1", port=0)
        running.append(server)
        return server

    yield start
    for server in running:
        # The memo's remembered values are shared between requests: no path the test took may have changed one.
        shared = server.app[RUNTIME].shared
        assert shared.bodies.intact(), "a remembered request value was changed in place"
        assert shared.replacements.intact(shared.counter.count_each), "a stored summary's message changed in place"
        await server.stop()


@pytest.fixture
async def proxy(make_proxy: ProxyFactory) -> RunningServer:
    return await make_proxy()


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty tiktoken cache for the test, with any network read turned into a failure."""
    cache_dir = tmp_path / "tiktoken-cache"
    cache_dir.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache_dir))
    real_read_file = tiktoken.load.read_file

    def local_reads_only(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise AssertionError(f"network read attempted: {blobpath}")
        return real_read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", local_reads_only)
    clear_encoding_cache()
    yield cache_dir
    clear_encoding_cache()


@pytest.fixture()
def bundled() -> tiktoken.Encoding:
    return tiktoken.get_encoding(BUNDLED_ENCODING)
