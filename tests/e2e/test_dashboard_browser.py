"""The compaction dashboard in headless Chromium: signed in with the SDK's own key it charts that key's conversation
and its compactions and shows the stored summaries; without the key, or with another one, it shows nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from bench.dashboard_screenshot import (
    CHROMIUM,
    DASHBOARD,
    WINDOW,
    dashboard_config,
    drive,
    launch_chromium,
    sign_in,
)
from proxy.app import RunningServer
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client


@pytest.fixture(autouse=True)
def chromium_installed() -> None:
    """A missing browser fails: .ci/run installs Debian's chromium, and a skip would hide that step."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set CHROMIUM to one)")

NewPage = Callable[[], Awaitable[Page]]
KEY = "sk-dashboard-owner-5a1f"
OTHER_KEY = "sk-dashboard-stranger-93c0"
TENANT_HEADER = "x-tenant"
expect.set_options(timeout=15_000)


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await launch_chromium(playwright)
        yield launched
        await launched.close()


@pytest.fixture
async def new_page(browser: Browser) -> AsyncIterator[NewPage]:
    """A fresh page (its own context: no sessionStorage shared); a script error or a CSP refusal on it fails the
    test."""
    errors: list[str] = []
    contexts = []

    async def open_page() -> Page:
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = await context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text)           # the page's CSP refused something
                if "Content Security Policy" in message.text else None)
        return page

    yield open_page
    for context in contexts:
        await context.close()
    assert errors == [], f"script errors on the dashboard: {errors}"


async def api(proxy: RunningServer, path: str, key: str | None = None) -> tuple[int, Any]:
    """A direct call of the dashboard's API, with `key` as a bearer token (or no credentials at all)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/_proxy/api{path}",
                                                               headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def journaled(proxy: RunningServer, key: str) -> tuple[str, str]:
    """The id of `key`'s only conversation and of its first event, as the API lists them to that key."""
    status, listed = await api(proxy, "/conversations?limit=100", key)
    assert status == 200 and len(listed["conversations"]) == 1, listed
    conversation_id = listed["conversations"][0]["id"]
    status, detail = await api(proxy, f"/conversations/{conversation_id}", key)
    assert status == 200 and detail["events"], detail
    return conversation_id, detail["events"][0]["id"]


def assert_openai_error(body: Any) -> None:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    assert {"message", "type", "code"} <= set(body["error"]), body


async def test_a_conversation_compacted_twice_is_charted_with_its_summaries(
        model: WindowedModel, make_proxy: ProxyFactory, new_page: NewPage) -> None:
    proxy = await make_proxy(dashboard_config())
    client = async_client(proxy.url, api_key=KEY)
    driven = await drive(client, compactions=2)
    await client.close()
    assert len(driven.compacted) == 2, driven.headers

    status, listed = await api(proxy, "/conversations?limit=100", KEY)
    assert status == 200 and len(listed["conversations"]) == 1, listed
    conversation = listed["conversations"][0]
    status, detail = await api(proxy, f"/conversations/{conversation['id']}", KEY)
    assert status == 200 and len(detail["points"]) == len(driven.headers)      # one point per request
    assert [point["outcome"] for point in detail["points"]] == driven.headers   # in order, as x-compaction said

    page = await new_page()
    await sign_in(page, proxy.url, KEY)
    rows = page.locator("#conversations tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text(conversation["model"])
    await rows.first.get_by_role("button").click()

    markers = page.locator("#chart svg .marker")
    await expect(markers).to_have_count(2)
    indexes = [int(await marker.get_attribute("data-request-index") or -1) for marker in await markers.all()]
    assert indexes == driven.compacted
    marked_events = [await marker.get_attribute("data-event-id") for marker in await markers.all()]
    assert marked_events == [detail["points"][index]["event_id"] for index in driven.compacted]
    chart = page.locator("#chart svg")
    assert await chart.get_attribute("role") == "img"
    assert "2 compactions" in (await chart.get_attribute("aria-label") or "")
    await expect(chart.locator("title")).to_have_count(1 + 2)                    # the chart's, and each marker's
    await expect(page.locator("#points tbody tr")).to_have_count(len(driven.headers))

    for event_id in marked_events:
        status, event = await api(proxy, f"/events/{event_id}", KEY)
        assert status == 200 and isinstance(event["summary"], str) and event["summary"]
        await page.locator(f'#events li[data-event-id="{event_id}"]').get_by_role(
            "button", name="Show summary").click()
        panel = page.locator("#summary-panel")
        await expect(panel).to_be_visible()
        await expect(panel).to_be_focused()
        shown = page.locator("#summary-text")
        await expect(shown).not_to_be_empty()
        assert await shown.text_content() == event["summary"]                   # as text, markup and all
        assert await shown.evaluate("node => node.children.length") == 0
        assert "FACT-0" in event["summary"]                                      # the fake summariser keeps facts
        assert any(event["summary"] in str(message.get("content"))               # what the model was sent
                   for call in model.chat_calls for message in call.body["messages"])


async def test_without_a_key_there_is_only_the_login_form(model: WindowedModel, make_proxy: ProxyFactory,
                                                          new_page: NewPage) -> None:
    proxy = await make_proxy(dashboard_config())
    client = async_client(proxy.url, api_key=KEY)
    driven = await drive(client, compactions=1)
    await client.close()
    assert driven.compacted, driven.headers
    conversation_id, event_id = await journaled(proxy, KEY)

    for path in ("/conversations?limit=100", f"/conversations/{conversation_id}", f"/events/{event_id}",
                 "/metrics"):
        status, body = await api(proxy, path)
        assert status == 401, path
        assert_openai_error(body)
    status, info = await api(proxy, "/info")
    assert status == 200 and info == {"tenant_header": None}

    page = await new_page()
    await page.goto(f"{proxy.url}{DASHBOARD}")
    await expect(page.get_by_label("API key")).to_be_visible()
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    await expect(page.get_by_label("Tenant")).to_be_hidden()                     # no tenant header configured
    await expect(page.locator("#dashboard")).to_be_hidden()
    await expect(page.locator("#conversations tbody tr")).to_have_count(0)
    assert conversation_id not in await page.content()

    # A key the proxy refuses (a real 401: this one asks for proxy keys) brings the form back with its message.
    locked = await make_proxy(dashboard_config(server={"api_keys": [KEY]}))
    page = await new_page()
    await page.goto(f"{locked.url}{DASHBOARD}")
    await page.get_by_label("API key").fill(OTHER_KEY)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#status")).to_contain_text("proxy API key is required")
    await expect(page.get_by_label("API key")).to_be_visible()
    await expect(page.locator("#dashboard")).to_be_hidden()
    assert conversation_id not in await page.content()
    assert await page.evaluate("() => sessionStorage.length") == 0


async def test_another_key_sees_no_conversation(model: WindowedModel, make_proxy: ProxyFactory,
                                                new_page: NewPage) -> None:
    proxy = await make_proxy(dashboard_config())
    client = async_client(proxy.url, api_key=KEY)
    await drive(client, compactions=1)
    await client.close()
    conversation_id, event_id = await journaled(proxy, KEY)

    page = await new_page()
    await sign_in(page, proxy.url, OTHER_KEY)
    await expect(page.locator("#no-conversations")).to_be_visible()
    await expect(page.locator("#conversations tbody tr")).to_have_count(0)
    assert conversation_id not in await page.content()
    assert (await api(proxy, "/conversations", OTHER_KEY))[1]["conversations"] == []
    assert (await api(proxy, f"/conversations/{conversation_id}", OTHER_KEY))[0] == 404
    assert (await api(proxy, f"/events/{event_id}", OTHER_KEY))[0] == 404

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("API key")).to_be_visible()
    await expect(page.locator("#dashboard")).to_be_hidden()
    assert await page.evaluate("() => sessionStorage.length") == 0


async def test_signing_in_with_the_keyboard_alone(model: WindowedModel, make_proxy: ProxyFactory,
                                                  new_page: NewPage) -> None:
    proxy = await make_proxy(dashboard_config(server={"tenant_header": TENANT_HEADER}))
    client = async_client(proxy.url, api_key=KEY, default_headers={TENANT_HEADER: "acme"})
    driven = await drive(client, compactions=1)
    await client.close()
    assert (await api(proxy, "/info"))[1] == {"tenant_header": TENANT_HEADER}

    page = await new_page()
    await page.goto(f"{proxy.url}{DASHBOARD}")
    key_input, tenant_input = page.get_by_label("API key"), page.get_by_label("Tenant")
    await expect(key_input).to_be_visible()
    await expect(tenant_input).to_be_visible()
    for _ in range(5):                                       # past the skip link, to the first field
        await page.keyboard.press("Tab")
        if await key_input.evaluate("node => node === document.activeElement"):
            break
    await expect(key_input).to_be_focused()
    assert await key_input.evaluate("node => getComputedStyle(node).outlineStyle") != "none"   # focus is visible
    await page.keyboard.type(KEY)
    await page.keyboard.press("Tab")
    await expect(tenant_input).to_be_focused()
    await page.keyboard.type("acme")
    await page.keyboard.press("Enter")

    await expect(page.locator("#dashboard")).to_be_visible()
    await expect(page.locator("#conversations tbody tr")).to_have_count(1)
    await expect(page.locator("#status")).to_have_attribute("aria-live", "polite")
    first = page.locator("#conversations tbody tr").first.get_by_role("button")
    for _ in range(10):                                      # from the page to the conversation's button
        if await first.evaluate("node => node === document.activeElement"):
            break
        await page.keyboard.press("Tab")
    await expect(first).to_be_focused()
    await page.keyboard.press("Enter")
    markers = page.locator("#chart svg .marker")
    await expect(markers).to_have_count(len(driven.compacted))
    assert [int(await m.get_attribute("data-request-index") or -1) for m in await markers.all()] == driven.compacted
