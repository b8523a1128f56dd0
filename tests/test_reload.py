"""Hot reload through the real program: SIGHUP and file edits change behaviour on the next request; a broken
config is refused with one log line and the old one keeps serving; connections survive reloads."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Settings, settings_from_mapping
from proxy.log_limits import BURST
from proxy.reload import applicable, changed_paths, restart_only, unsaid_changes
from tests.e2e.test_compaction_e2e import WINDOW, big_history
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.proxy_process import ProxyProcess, proxy_process

KEY_A, KEY_B = "reload-key-alpha-1f3e", "reload-key-bravo-9c2d"


def write_config(path: Path, tree: dict[str, Any]) -> Path:
    # Written whole then renamed in, as editors and ConfigMap updates do: the watcher never sees half a file.
    scratch = path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(tree), encoding="utf-8")
    scratch.replace(path)
    return path


def base_config(fake: FakeUpstream, **server: Any) -> dict[str, Any]:
    return {"upstream": {"base_url": f"{fake.url}/v1"},
            "server": {"reload_poll_seconds": 0, **server},
            "models": {"default": {"context_window": WINDOW}},
            "compaction": {"threshold": 0, "background": False}}


async def status_with(proxy: ProxyProcess, key: str) -> int:
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.base}/v1/chat/completions", headers={"x-proxy-api-key": key},
            json={"model": "fake-small", "messages": [{"role": "user", "content": "hi"}]}) as answer:
        await answer.read()
        return answer.status


async def compaction_of(proxy: ProxyProcess, messages: list[dict[str, Any]]) -> str:
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.base}/v1/chat/completions", json={"model": "fake-small", "messages": messages}) as answer:
        assert answer.status == 200, await answer.text()
        return answer.headers["x-compaction"]


async def reloads(proxy: ProxyProcess) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.base}/metrics") as answer:
        text = await answer.text()
    return {sample.labels["result"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == "compaction_proxy_config_reloads" for sample in family.samples
            if sample.name.endswith("_total")}


async def test_sighup_applies_a_changed_proxy_key(tmp_path: Path, fake: FakeUpstream) -> None:
    config = write_config(tmp_path / "config.yaml", base_config(fake, api_keys=[KEY_A]))
    async with proxy_process(tmp_path, config) as proxy:
        assert (await status_with(proxy, KEY_A), await status_with(proxy, KEY_B)) == (200, 401)
        write_config(config, base_config(fake, api_keys=[KEY_B]))
        # Watching is off (reload_poll_seconds: 0): only the signal can have applied it.
        await asyncio.sleep(1.5)
        assert await status_with(proxy, KEY_A) == 200
        signalled = time.monotonic()
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reloaded (SIGHUP)")
        latency = time.monotonic() - signalled
        assert "server.api_keys changed" in output
        assert (await status_with(proxy, KEY_A), await status_with(proxy, KEY_B)) == (401, 200)
        assert (await reloads(proxy)).get("applied") == 1
        assert KEY_A not in output and KEY_B not in output  # the line names what changed, never a value
        print(f"SIGHUP to the new key in effect: {latency * 1000:.0f} ms")


async def test_a_file_edit_changes_the_threshold_on_the_next_request(tmp_path: Path, fake: FakeUpstream) -> None:
    fake.chat_hook = WindowedModel(window=WINDOW)
    tree = base_config(fake, reload_poll_seconds=0.2)
    config = write_config(tmp_path / "config.yaml", tree)
    history = big_history(12)  # ~4,100 tokens: over 0.6 of the window with its reserve, well inside the window
    async with proxy_process(tmp_path, config) as proxy:
        assert await compaction_of(proxy, history) == "none"  # threshold 0: only an overflow compacts
        tree["compaction"] = {"threshold": 0.6, "target": 0.3, "background": False}
        edited = time.monotonic()
        write_config(config, tree)
        output = await proxy.wait_for_log("config reloaded (file changed)")
        latency = time.monotonic() - edited
        assert "compaction.target, compaction.threshold changed" in output
        assert await compaction_of(proxy, history) == "proactive"
        print(f"file edit to the new threshold in effect: {latency * 1000:.0f} ms (poll every 0.2 s)")


BROKEN = {
    "yaml": ("server: [1,\n", "not valid YAML"),
    "validation": ("compaction:\n  threshold: 0.5\n  target: 0.7\n", "must be below threshold"),
    "unknown key": ("compaction:\n  threshhold: 0.5\n", "compaction.threshhold: unknown key"),
    "open relay": (None, "refusing to start as an open relay"),
    "broken template": (None, "TemplateSyntaxError"),
    "empty": ("", "is empty"),
    "comments only": ("# saved half-way by an editor\n", "is empty"),
    "nested too deep": ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than"),
}


@pytest.mark.parametrize("kind", BROKEN)
async def test_a_broken_config_is_refused_and_the_old_one_stays(tmp_path: Path, fake: FakeUpstream,
                                                                 kind: str) -> None:
    good = {**base_config(fake, api_keys=[KEY_A], host="0.0.0.0"),
            "upstream": {"base_url": f"{fake.url}/v1", "api_key": "sk-operator-upstream-7d1"}}
    config = write_config(tmp_path / "config.yaml", good)
    async with proxy_process(tmp_path, config) as proxy:
        text, reason = BROKEN[kind]
        if kind == "open relay":  # valid on its own, but no proxy keys beyond loopback with the operator's key
            write_config(config, {**good, "server": {**good["server"], "api_keys": []}})
        elif kind == "broken template":  # a valid file whose prompt override does not compile
            prompts = tmp_path / "prompts"
            prompts.mkdir()
            (prompts / "compaction.md").write_text("{{ unclosed", encoding="utf-8")
            write_config(config, {**good, "compaction": {**good["compaction"], "prompts_dir": str(prompts)}})
        else:
            assert text is not None
            config.write_text(text, encoding="utf-8")
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reload (SIGHUP) refused, keeping the running config")
        refusal = next(line for line in output.splitlines() if "refused" in line)
        assert reason in refusal
        assert "Traceback" not in output
        assert (await status_with(proxy, KEY_A), await status_with(proxy, "no-key")) == (200, 401)
        # A good file afterwards is applied: a refusal leaves nothing half-done behind.
        write_config(config, {**good, "server": {**good["server"], "api_keys": [KEY_B]}})
        proxy.signal(signal.SIGHUP)
        await proxy.wait_for_log("config reloaded (SIGHUP)")
        assert await status_with(proxy, KEY_B) == 200
        assert await reloads(proxy) == {"refused": 1, "applied": 1}


async def test_restart_only_settings_are_named_and_live_ones_apply(tmp_path: Path, fake: FakeUpstream) -> None:
    config = write_config(tmp_path / "config.yaml", base_config(fake, api_keys=[KEY_A]))
    async with proxy_process(tmp_path, config) as proxy:
        changed = base_config(fake, api_keys=[KEY_B], port=1, shutdown_grace_seconds=3)
        changed["store"] = {"kind": "sqlite", "path": str(tmp_path / "summaries.db")}
        write_config(config, changed)
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reloaded (SIGHUP)")
        warning = next(line for line in output.splitlines() if "restart" in line)
        for name in ("server.port", "server.shutdown_grace_seconds", "store.kind", "store.path"):
            assert name in warning
        assert "server.api_keys" not in warning
        assert await status_with(proxy, KEY_B) == 200  # still on the old port, with the new key
        async with aiohttp.ClientSession() as session, session.get(f"{proxy.base}/readyz") as answer:
            assert answer.status == 200
        assert not (tmp_path / "summaries.db").exists()


async def test_a_stream_and_concurrent_requests_survive_reloads(tmp_path: Path, fake: FakeUpstream) -> None:
    fake.stream_chunk_delay = 0.05
    tree = base_config(fake)
    config = write_config(tmp_path / "config.yaml", tree)
    words = " ".join(f"w{index}" for index in range(40))  # a 2-second stream

    async def stream() -> str:
        async with aiohttp.ClientSession() as session, session.post(
                f"{proxy.base}/v1/chat/completions",
                json={"model": "fake-small", "stream": True, "messages": [{"role": "user", "content": words}]},
        ) as answer:
            assert answer.status == 200
            return (await answer.read()).decode()

    async def requests(count: int) -> list[str]:
        return [await compaction_of(proxy, [{"role": "user", "content": f"q{index}"}]) for index in range(count)]

    async with proxy_process(tmp_path, config) as proxy:
        streaming = asyncio.ensure_future(stream())
        steady = [asyncio.ensure_future(requests(15)) for _ in range(4)]
        for window in (4096, 16384, 8192, 32768):
            await asyncio.sleep(0.3)
            tree["models"] = {"default": {"context_window": window}}
            write_config(config, tree)
            proxy.signal(signal.SIGHUP)
        body = await asyncio.wait_for(streaming, 15)
        answers = await asyncio.wait_for(asyncio.gather(*steady), 30)
        await proxy.wait_for_log("config reloaded (SIGHUP)", count=4)
        assert body.rstrip().endswith("data: [DONE]") and "w39" in body
        assert all(outcome == "none" for batch in answers for outcome in batch)
        assert (await reloads(proxy)).get("applied") == 4


def test_applicable_keeps_restart_only_values_and_the_withheld_keys() -> None:
    running = settings_from_mapping({"server": {"port": 8080, "api_keys": ["old-key"]}}, env={})
    new = settings_from_mapping({"server": {"port": 9090, "api_keys": ["new-key"], "shutdown_grace_seconds": 5},
                                 "upstream": {"max_connections": 7, "idle_timeout": 12, "keepalive_timeout": 1},
                                 "store": {"kind": "sqlite", "path": "/tmp/x.db"}}, env={})
    applied = applicable(new, running)
    assert applied.upstream.keepalive_timeout == running.upstream.keepalive_timeout  # the pool's, from its start
    assert (applied.server.port, applied.server.shutdown_grace_seconds) == (8080, 30.0)
    assert applied.upstream.max_connections == running.upstream.max_connections
    assert applied.store == running.store
    assert applied.upstream.idle_timeout == 12
    assert applied.upstream.withheld_keys == ("new-key",)  # the live keys are never sent upstream either
    paths = changed_paths(running.model_dump(), new.model_dump())
    assert restart_only(paths) == ["server.port", "server.shutdown_grace_seconds", "store.kind", "store.path",
                                   "upstream.keepalive_timeout", "upstream.max_connections"]
    assert "new-key" not in json.dumps(paths)


async def test_a_burst_of_sighups_applies_the_change_once(tmp_path: Path, fake: FakeUpstream) -> None:
    config = write_config(tmp_path / "config.yaml", base_config(fake, api_keys=[KEY_A]))
    async with proxy_process(tmp_path, config) as proxy:
        write_config(config, base_config(fake, api_keys=[KEY_B]))
        for _ in range(5):
            proxy.signal(signal.SIGHUP)
            await asyncio.sleep(0.01)
        await proxy.wait_for_log("config reloaded (SIGHUP)")
        await asyncio.sleep(0.5)  # the rest (those not merged by the kernel) find nothing to apply
        counted = await reloads(proxy)
        assert counted.get("applied") == 1 and "refused" not in counted, counted
        assert await status_with(proxy, KEY_B) == 200
        assert "Traceback" not in proxy.output()


async def test_sighup_without_a_config_file_keeps_serving(tmp_path: Path) -> None:
    async with proxy_process(tmp_path, None) as proxy:
        proxy.signal(signal.SIGHUP)
        await proxy.wait_for_log("no --config file to reload")
        await proxy.wait_healthy(timeout=5)
        proxy.signal(signal.SIGTERM)
        assert await proxy.exit_code() == 0


def refusal_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "refused, keeping the running config" in line]


async def test_a_truncated_file_is_refused_and_the_keys_and_upstream_stay(tmp_path: Path,
                                                                           fake: FakeUpstream) -> None:
    config = write_config(tmp_path / "config.yaml", base_config(fake, api_keys=[KEY_A], reload_poll_seconds=0.1))
    async with proxy_process(tmp_path, config) as proxy:
        config.write_bytes(b"")  # truncated in place, as a non-atomic save does before it writes
        output = await proxy.wait_for_log("config reload (file changed) refused, keeping the running config")
        assert "is empty" in refusal_lines(output)[0] and "write `{}`" in refusal_lines(output)[0]
        assert await status_with(proxy, "no-key") == 401
        forwarded = len(fake.chat_requests())
        assert await status_with(proxy, KEY_A) == 200
        assert len(fake.chat_requests()) == forwarded + 1  # the same upstream
        assert await reloads(proxy) == {"refused": 1}


async def test_dropping_the_keys_or_moving_the_upstream_takes_saying_so(tmp_path: Path,
                                                                        fake: FakeUpstream) -> None:
    tree = base_config(fake, api_keys=[KEY_A])
    config = write_config(tmp_path / "config.yaml", tree)
    async with proxy_process(tmp_path, config) as proxy:
        # Sections lost (a bad merge, a template rendered half): the defaults would open and move the proxy.
        write_config(config, {"server": {"reload_poll_seconds": 0}, "models": tree["models"],
                              "compaction": tree["compaction"]})
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reload (SIGHUP) refused, keeping the running config")
        assert all(name in refusal_lines(output)[0] for name in ("server.api_keys", "upstream.base_url"))
        assert (await status_with(proxy, "no-key"), await status_with(proxy, KEY_A)) == (401, 200)
        # Said on purpose, the keys go.
        write_config(config, {**tree, "server": {**tree["server"], "api_keys": []}})
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reloaded (SIGHUP)")
        assert "server.api_keys changed" in output
        assert await status_with(proxy, "no-key") == 200
        assert await reloads(proxy) == {"refused": 1, "applied": 1}


async def test_every_refusal_is_logged_past_the_repeat_limit(tmp_path: Path, fake: FakeUpstream) -> None:
    config = write_config(tmp_path / "config.yaml", base_config(fake, api_keys=[KEY_A]))
    broken = [BROKEN["yaml"], BROKEN["validation"], BROKEN["unknown key"]]
    async with proxy_process(tmp_path, config) as proxy:
        for index in range(BURST + 3):
            config.write_text(str(broken[index % 3][0]), encoding="utf-8")
            proxy.signal(signal.SIGHUP)
            output = await proxy.wait_for_log("refused, keeping the running config", count=index + 1)
        lines = refusal_lines(output)
        assert [broken[index % 3][1] in line for index, line in enumerate(lines)] == [True] * (BURST + 3)
        assert all(" ERROR " in line for line in lines) and "suppressed" not in output
        assert await reloads(proxy) == {"refused": BURST + 3}


async def health_checks(proxy: ProxyProcess, answering: asyncio.Event, done: asyncio.Event) -> list[int]:
    """/healthz, one request after another, `answering` set at the first answer, until `done` and once more; each
    answer's status. A reload refused unread is over in a moment: under load the first check could otherwise start
    after it, and the last one end before it."""
    statuses = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while True:
            finished = done.is_set()
            async with session.get(f"{proxy.base}/healthz") as answer:
                statuses.append(answer.status)
            answering.set()
            if finished:
                return statuses


async def test_a_huge_file_is_refused_unread_while_health_checks_answer(tmp_path: Path,
                                                                       fake: FakeUpstream) -> None:
    tree = base_config(fake, api_keys=[KEY_A])
    config = write_config(tmp_path / "config.yaml", tree)
    huge = tmp_path / "huge.yaml"
    with huge.open("w", encoding="utf-8") as file:  # the same config, padded with comments to 30 MB
        file.write(yaml.safe_dump({**tree, "server": {**tree["server"], "api_keys": [KEY_B]}}))
        for _ in range(30):
            file.write("#" + "x" * (1024 * 1024 - 2) + "\n")
    async with proxy_process(tmp_path, config) as proxy:
        answering, done = asyncio.Event(), asyncio.Event()
        checking = asyncio.ensure_future(health_checks(proxy, answering, done))
        await asyncio.wait_for(answering.wait(), 60)
        huge.replace(config)
        proxy.signal(signal.SIGHUP)
        output = await proxy.wait_for_log("config reload (SIGHUP) refused, keeping the running config")
        done.set()
        statuses = await asyncio.wait_for(checking, 60)
        assert "larger than 256 KiB" in refusal_lines(output)[0]
        assert statuses and set(statuses) == {200}
        assert (await status_with(proxy, KEY_A), await status_with(proxy, KEY_B)) == (200, 401)


# --- what a reload must be told, not left to infer ---------------------------------------------------------

RUNNING = {"server": {"api_keys": [KEY_A]}, "upstream": {"base_url": "http://127.0.0.1:9/v1"},
           "compaction": {"summarizer": {"upstream": {"base_url": "http://127.0.0.1:7/v1"}}}}
SUMMARIES_SAID = {"summarizer": {"upstream": {"base_url": "http://127.0.0.1:7/v1"}}}
KEYS_SAID = {"api_keys": [KEY_A]}
UPSTREAM_SAID = {"base_url": "http://127.0.0.1:9/v1"}

UNSAID: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "everything said again": (RUNNING, ()),
    "keys replaced": ({**RUNNING, "server": {"api_keys": [KEY_B]}}, ()),
    "keys left out": ({**RUNNING, "server": {"port": 1}}, ("server.api_keys",)),
    "server left out": ({key: value for key, value in RUNNING.items() if key != "server"}, ("server.api_keys",)),
    "keys emptied on purpose": ({**RUNNING, "server": {"api_keys": []}}, ()),
    "keys from a variable that is unset": ({**RUNNING, "server": {"api_keys": "${H1_PROXY_KEYS:-}"}}, ()),
    "upstream left out": ({"server": KEYS_SAID, "compaction": SUMMARIES_SAID}, ("upstream.base_url",)),
    "upstream key without its url": ({**RUNNING, "upstream": {"api_key": "sk-h1-upstream"}}, ("upstream.base_url",)),
    "upstream moved on purpose": ({**RUNNING, "upstream": {"base_url": "http://127.0.0.1:8/v1"}}, ()),
    "upstream from a variable's fallback": ({**RUNNING, "upstream": {"base_url": "${H1_URL:-https://x.test/v1}"}},
                                            ()),
    "summariser upstream left out": ({"server": KEYS_SAID, "upstream": UPSTREAM_SAID},
                                     ("compaction.summarizer.upstream",)),
    "summariser upstream dropped on purpose": ({**RUNNING, "compaction": {"summarizer": {"upstream": None}}}, ()),
    "summariser upstream without its url": (
        {**RUNNING, "compaction": {"summarizer": {"upstream": {"api_key": "sk-h1-summaries"}}}},
        ("compaction.summarizer.upstream.base_url",)),
    "everything left out": ({"logging": {"level": "DEBUG"}},
                            ("server.api_keys", "upstream.base_url", "compaction.summarizer.upstream")),
}


@pytest.mark.parametrize("case", UNSAID)
def test_unsaid_changes_names_what_the_file_drops_or_moves_without_saying(case: str) -> None:
    raw, named = UNSAID[case]
    running = settings_from_mapping(RUNNING, env={})
    reason = unsaid_changes(running, raw, settings_from_mapping(raw, env={}))
    if not named:
        assert reason is None
    else:
        assert reason is not None and all(name in reason for name in named), reason
        assert KEY_A not in reason and "sk-h1" not in reason


def test_a_running_config_without_keys_or_upstream_has_nothing_to_lose() -> None:
    running = Settings()
    assert unsaid_changes(running, {"logging": {"level": "DEBUG"}},
                          settings_from_mapping({"logging": {"level": "DEBUG"}}, env={})) is None
