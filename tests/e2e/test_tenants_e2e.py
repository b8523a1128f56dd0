"""Tenants cannot be spoofed: summaries are namespaced by credential, tenant header and model together."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.tenants import namespace_for, tenant_namespace
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import WINDOW, big_history, compaction_config
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

TENANT_HEADER = "x-tenant"
HISTORY_TURNS = 20


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


def tenant_config() -> dict[str, Any]:
    return {**compaction_config(background=False), "server": {"tenant_header": TENANT_HEADER}}


async def send(proxy_url: str, key: str, tenant: str | None, chat_model: str = "fake-small") -> str:
    """One long conversation as `key` (and `tenant`); returns the answer's x-compaction."""
    headers = {TENANT_HEADER: tenant} if tenant is not None else {}
    client = async_client(proxy_url, api_key=key, default_headers=headers)
    await client.chat.completions.create(model=chat_model, messages=big_history(1))    # calibration turn
    raw = await client.chat.completions.with_raw_response.create(model=chat_model,
                                                                 messages=big_history(HISTORY_TURNS))
    await client.close()
    return raw.headers["x-compaction"]


async def test_the_same_tenant_header_under_another_key_shares_nothing(model: WindowedModel,
                                                                      make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(tenant_config())
    assert await send(proxy.url, "sk-victim", "acme") == "proactive"
    # The attacker names the victim's tenant: it must neither read the victim's summary nor plant one.
    assert await send(proxy.url, "sk-attacker", "acme") == "proactive"
    assert len(model.summarizer_calls) == 2


async def test_a_planted_summary_is_not_reused_by_the_victim(model: WindowedModel,
                                                            make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(tenant_config())
    assert await send(proxy.url, "sk-attacker", "acme") == "proactive"
    assert await send(proxy.url, "sk-victim", "acme") == "proactive"
    assert len(model.summarizer_calls) == 2


async def test_the_same_key_on_another_model_shares_nothing(model: WindowedModel,
                                                           make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(tenant_config())
    assert await send(proxy.url, "sk-one", "acme", "fake-small") == "proactive"
    assert await send(proxy.url, "sk-one", "acme", "fake-other") == "proactive"
    assert len(model.summarizer_calls) == 2


async def test_without_a_tenant_header_another_model_shares_nothing(model: WindowedModel,
                                                                   make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(compaction_config(background=False))
    assert await send(proxy.url, "sk-one", None, "fake-small") == "proactive"
    assert await send(proxy.url, "sk-one", None, "fake-other") == "proactive"
    assert len(model.summarizer_calls) == 2


async def test_the_header_still_separates_tenants_of_one_key(model: WindowedModel,
                                                            make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(tenant_config())
    assert await send(proxy.url, "sk-gateway", "team-a") == "proactive"
    assert await send(proxy.url, "sk-gateway", "team-b") == "proactive"
    assert len(model.summarizer_calls) == 2


async def test_same_key_header_and_model_reuse_the_summary(model: WindowedModel,
                                                          make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(tenant_config())
    assert await send(proxy.url, "sk-one", "acme") == "proactive"
    assert await send(proxy.url, "sk-one", "acme") == "reused"
    assert len(model.summarizer_calls) == 1


@pytest.mark.parametrize(("first", "second"), [
    ({"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}),
    ({"Authorization": "Bearer sk-a"}, {"x-api-key": "sk-a"}),
    ({"api-key": "azure-a"}, {"api-key": "azure-b"}),
    ({"x-proxy-api-key": "p", "Authorization": "Bearer sk-a"},
     {"x-proxy-api-key": "p", "Authorization": "Bearer sk-b"}),
    ({"Authorization": "Bearer sk-a", "x-tenant": "t"}, {"Authorization": "Bearer sk-a", "x-tenant": "u"}),
    ({"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-a", "x-tenant": "t"}),
], ids=["keys", "header-kind", "azure", "own-key-behind-proxy-key", "tenants", "tenant-vs-none"])
def test_distinct_credentials_give_distinct_namespaces(first: dict[str, str], second: dict[str, str]) -> None:
    assert namespace_for(first, TENANT_HEADER, "m") != namespace_for(second, TENANT_HEADER, "m")


def test_namespace_is_a_hash_that_separates_models() -> None:
    headers = {"Authorization": "Bearer sk-secret-in-namespace"}
    assert namespace_for(headers, None, "a") != namespace_for(headers, None, "b")
    assert namespace_for(headers, None, "a") == namespace_for(dict(headers), None, "a")
    assert "sk-secret" not in namespace_for(headers, None, "a")
    assert tenant_namespace("k", "t", "m") != tenant_namespace("k", "tm")       # fields cannot run together
