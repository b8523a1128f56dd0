"""A screenshot of the compaction dashboard: one conversation driven through the proxy until it compacts twice.

Usage: python -m bench.dashboard_screenshot --out docs/dashboard.png [--chromium /usr/bin/chromium]

Everything runs on 127.0.0.1 in this process: the fake upstream with an enforced 8k window (tests.fakes.windowed,
whose summariser keeps every FACT marker), the proxy (proxy.app.start_server) in front of it, and the openai SDK as
the client. A short conversation and then a long one are sent turn by turn; the long one grows past the threshold,
is compacted, grows past it again and is compacted a second time. Headless Chromium (a system Chromium, driven
by playwright without its own browser download) then opens /_proxy/dashboard/, signs in with the client's key,
selects the long conversation, shows its second summary and saves a full-page screenshot.

The helpers are shared with tests/e2e/test_dashboard_browser.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from playwright.async_api import Browser, Page, Playwright, async_playwright, expect

from proxy.app import RunningServer, start_server
from proxy.config import settings_from_mapping
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import deep_merge, serve_app
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# No GPU, no sandbox (containers), and no background traffic: an offline machine gets no refused connections.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DASHBOARD = "/_proxy/dashboard/"
WINDOW = 8192
MODEL = "fake-small"
# The x-compaction values of a request that built a summary on the spot (reused and none did not).
COMPACTING = frozenset({"proactive", "reactive", "forced", "requested"})
MAX_TURNS = 80
DEMO_KEY = "sk-dashboard-demo-key"


def dashboard_config(**overrides: Any) -> dict[str, Any]:
    """An 8k window compacted at 0.8 of it, summaries built on the request (background off), so the request
    that compacts says so in its x-compaction header."""
    base = {"models": {"default": {"context_window": WINDOW}},
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, "background": False}}
    return deep_merge(base, overrides)


def system_message(topic: str) -> dict[str, Any]:
    return {"role": "system", "content": f"You keep a list of facts about {topic}. Answer briefly."}


def user_turn(index: int) -> dict[str, Any]:
    filler = " ".join(f"word{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{index}. {filler}"}


@dataclass
class Driven:
    """One conversation as the client saw it: every request's x-compaction, in order."""

    headers: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compacted(self) -> list[int]:
        """The 0-based indexes of the requests that were compacted."""
        return [index for index, header in enumerate(self.headers) if header in COMPACTING]


async def drive(client: openai.AsyncOpenAI, *, compactions: int | None = 2, turns: int = MAX_TURNS,
                topic: str = "the dashboard") -> Driven:
    """Send one growing conversation turn by turn (the full history each time, as a stateless client does)
    until `compactions` of its requests were compacted (None: all `turns` turns), or `turns` turns."""
    driven = Driven(history=[system_message(topic)])
    for index in range(turns):
        if compactions is not None and len(driven.compacted) >= compactions:
            break
        driven.history.append(user_turn(index))
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=driven.history)
        driven.headers.append(raw.headers["x-compaction"])
        driven.history.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
    return driven


async def launch_chromium(playwright: Playwright, executable: str = CHROMIUM) -> Browser:
    return await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)


async def sign_in(page: Page, proxy_url: str, key: str, tenant: str | None = None) -> None:
    """Open the dashboard and sign in with the form, as a user does; returns once the dashboard shows."""
    await page.goto(f"{proxy_url}{DASHBOARD}")
    await page.get_by_label("API key").fill(key)
    if tenant is not None:
        await page.get_by_label("Tenant").fill(tenant)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#dashboard")).to_be_visible()


@asynccontextmanager
async def proxy_in_front_of_a_fake(overrides: dict[str, Any] | None = None) -> AsyncIterator[RunningServer]:
    """The windowed fake upstream and the proxy in front of it, both in this process."""
    state = FakeUpstream()
    state.chat_hook = WindowedModel(window=WINDOW)
    runner, url = await serve_app(FakeUpstreamApp(state).build())
    state.url = url
    settings = settings_from_mapping(deep_merge({"upstream": {"base_url": f"{url}/v1"}}, overrides or {}), env={})
    server = await start_server(settings, host="127.0.0.1", port=0)
    try:
        yield server
    finally:
        await server.stop()
        await runner.cleanup()


async def screenshot(out: Path, executable: str) -> None:
    async with proxy_in_front_of_a_fake(dashboard_config()) as proxy:
        client = async_client(proxy.url, api_key=DEMO_KEY)
        await drive(client, compactions=None, turns=3, topic="a short chat")
        driven = await drive(client, compactions=2)
        await client.close()
        if len(driven.compacted) < 2:
            raise SystemExit(f"the conversation compacted {len(driven.compacted)} times in {len(driven.headers)} "
                             f"requests, not twice")
        async with async_playwright() as playwright:
            browser = await launch_chromium(playwright, executable)
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await sign_in(page, proxy.url, DEMO_KEY)
            await page.locator("#conversations tbody tr").first.get_by_role("button").click()
            await expect(page.locator("#chart .marker")).to_have_count(2)
            await expect(page.locator("#metrics dd")).to_have_count(4)
            await page.get_by_role("button", name="Show summary").last.click()
            await expect(page.locator("#summary-panel")).to_be_visible()
            out.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(out), full_page=True)
            await browser.close()
    print(f"{out}: {len(driven.headers)} requests, compacted at requests {[i + 1 for i in driven.compacted]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"), help="the PNG to write")
    parser.add_argument("--chromium", default=CHROMIUM, help="the Chromium binary (default: $CHROMIUM or %(default)s)")
    args = parser.parse_args()
    asyncio.run(screenshot(args.out, args.chromium))


if __name__ == "__main__":
    main()
