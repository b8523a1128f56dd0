"""Hot reload: the config file re-read on SIGHUP or when it changes, validated, and swapped in whole."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from proxy.compaction.runtime import RuntimeSlot, build_runtime, load_templates
from proxy.config import ConfigError, Settings, open_relay_problem, settings_from_mapping
from proxy.config_file import read_head, read_tree
from proxy.log_limits import EXEMPT

log = logging.getLogger(__name__)

# With watching turned off, how often to look whether a reload turned it back on.
IDLE_POLL_SECONDS = 1.0
# A change is acted on once the file has stayed the same this long: an editor writing in place is not caught
# half-way (that would only be refused, but with an alarming log line).
SETTLE_SECONDS = 0.1
# Settings owned by the listener, the connection pool or the store, which live as long as the process. A reload
# keeps their running values and says that a restart is needed for the file's.
RESTART_ONLY = {
    "server": ("host", "port", "max_body_bytes", "header_timeout", "keepalive_timeout", "body_timeout",
               "shutdown_grace_seconds", "event_loop"),
    "upstream": ("max_connections", "keepalive_timeout"),
    "logging": ("access_log", "access_log_flush_seconds"),
}
RESTART_ONLY_SECTIONS = ("store",)


def fingerprint(path: Path) -> str | None:
    """A hash of the file's bytes (of a file too large to load, its head: enough to see it change size); None
    when it cannot be read (being replaced, or gone)."""
    try:
        return hashlib.sha256(read_head(path)).hexdigest()
    except OSError:
        return None


def unsaid_changes(running: Settings, raw: Mapping[str, Any], new: Settings) -> str | None:
    """Why `new` must not replace `running`: it drops the proxy keys or moves where requests or summaries go,
    and the file (`raw`, as parsed, before defaults) does not name the key that does so. A file truncated or
    half-written by a save says nothing of them, and its defaults would open the proxy and send keys elsewhere."""
    reasons = []
    if running.server.api_keys and not new.server.api_keys and not _names(raw, "server.api_keys"):
        reasons.append("the file leaves out server.api_keys, which would drop the proxy keys and let every client "
                       "in (to drop them on purpose, write `api_keys: []` under server)")
    if new.upstream.base_url != running.upstream.base_url and not _names(raw, "upstream.base_url"):
        reasons.append(f"the file leaves out upstream.base_url, which would send requests to the default "
                       f"{new.upstream.base_url} (to move them on purpose, set upstream.base_url)")
    summaries = _summaries_moved(running, raw, new)
    if summaries is not None:
        reasons.append(summaries)
    return "; ".join(reasons) or None


def _summaries_moved(running: Settings, raw: Mapping[str, Any], new: Settings) -> str | None:
    before, after = running.compaction.summarizer.upstream, new.compaction.summarizer.upstream
    if after is None:
        if before is None or _names(raw, "compaction.summarizer.upstream"):
            return None
        return ("the file leaves out compaction.summarizer.upstream, which would send summaries through upstream "
                "instead (to do so on purpose, write `upstream: null` under compaction.summarizer)")
    if before is not None and before.base_url == after.base_url:
        return None
    if _names(raw, "compaction.summarizer.upstream.base_url"):
        return None
    return (f"the file leaves out compaction.summarizer.upstream.base_url, which would send summaries to the "
            f"default {after.base_url} (to do so on purpose, set it)")


def _names(raw: Any, dotted: str) -> bool:
    """Whether the parsed file has the key at `dotted`, whatever its value (null and empty included)."""
    for part in dotted.split("."):
        if not isinstance(raw, Mapping) or part not in raw:
            return False
        raw = raw[part]
    return True


def changed_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths whose values differ between two dumped configs (values never shown: some are secrets)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        paths: list[str] = []
        for key in sorted({*old, *new}, key=str):
            paths += changed_paths(old.get(key), new.get(key), f"{prefix}{key}.")
        return paths
    return [] if old == new else [prefix.rstrip(".")]


def restart_only(paths: list[str]) -> list[str]:
    fields = {f"{section}.{name}" for section, names in RESTART_ONLY.items() for name in names}
    return [path for path in paths
            if path in fields or any(path == s or path.startswith(f"{s}.") for s in RESTART_ONLY_SECTIONS)]


def applicable(new: Settings, running: Settings) -> Settings:
    """`new` with every restart-only setting kept at its running value: what this process can apply now."""
    def kept(section: str) -> Any:
        fresh = getattr(new, section)
        return fresh.model_copy(update={name: getattr(getattr(running, section), name)
                                        for name in RESTART_ONLY[section]})

    update = {section: kept(section) for section in RESTART_ONLY}
    update.update({section: getattr(running, section) for section in RESTART_ONLY_SECTIONS})
    return new.model_copy(update=update)


class Reloader:
    """Re-reads one config file on request (SIGHUP) and whenever its contents change.

    A file that does not load, does not validate, would make an open relay or whose templates do not build is
    refused with one log line and the running config stays. Reloads run one at a time.
    """

    def __init__(self, slot: RuntimeSlot, path: Path, *, host: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._slot = slot
        self._path = path
        self._host = host  # --host, which wins over server.host for the open-relay check as for listening
        self._env = env
        self._seen = fingerprint(path)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._missing = False
        self._closed = False

    def start(self) -> None:
        """Watch the file from now on."""
        self._spawn(self._watch(), "watch config file")

    def request(self, trigger: str) -> None:
        """Reload soon (from a signal handler, which cannot await); ignored once shutting down."""
        if not self._closed:
            self._spawn(self.reload(trigger), f"reload config ({trigger})")

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def reload(self, trigger: str) -> str:
        """Load the file and apply it; returns "applied", "unchanged" or "refused" (also logged and counted)."""
        async with self._lock:
            started = time.perf_counter()
            self._seen = await asyncio.to_thread(fingerprint, self._path)
            result = await self._apply(trigger, started)
            self._slot.shared.metrics.config_reloads.labels(result).inc()
            return result

    async def _apply(self, trigger: str, started: float) -> str:
        running = self._slot.current.settings
        try:
            # In a thread: reading and validating a file (up to 256 KiB) must not hold up the requests being served.
            new, changed = await asyncio.to_thread(self._load, running)
        except ConfigError as error:
            return _refused(trigger, str(error))
        pending = restart_only(changed)
        if pending:
            log.warning("config reload (%s): %s changed in the file but can only change at a restart; "
                        "they keep their running values", trigger, ", ".join(pending))
        live = [path for path in changed if path not in pending]
        if not live:
            log.info("config reload (%s): nothing to apply", trigger)
            return "unchanged"
        try:
            templates = await asyncio.to_thread(load_templates, new)
        except Exception as error:  # noqa: BLE001  # templates that do not compile, a prompts_dir that is gone
            return _refused(trigger, f"{type(error).__name__}: {error}")
        runtime = build_runtime(new, self._slot.shared, templates)
        self._slot.swap(runtime)
        if new.logging.level != running.logging.level:
            logging.getLogger().setLevel(new.logging.level)
        log.info("config reloaded (%s) in %.1f ms: %s changed", trigger, (time.perf_counter() - started) * 1000,
                 ", ".join(live))
        return "applied"

    def _load(self, running: Settings) -> tuple[Settings, list[str]]:
        """What this process can apply of the file and the paths the file changes, or a ConfigError saying why
        it must not be applied."""
        raw = read_tree(self._path)
        loaded = settings_from_mapping(raw, self._env)
        new = applicable(loaded, running)
        problem = unsaid_changes(running, raw, loaded) or open_relay_problem(new, self._host)
        if problem is not None:
            raise ConfigError(problem)
        return new, changed_paths(running.model_dump(), loaded.model_dump())

    async def _watch(self) -> None:
        while True:
            # Read each time: a reload may change it, or turn watching off (0) and on again (by SIGHUP).
            poll = self._slot.current.settings.server.reload_poll_seconds
            await asyncio.sleep(poll or IDLE_POLL_SECONDS)
            if not poll:
                continue
            seen = await asyncio.to_thread(fingerprint, self._path)
            if seen is None:
                if not self._missing:
                    log.warning("config file %s cannot be read; keeping the running config", self._path)
                self._missing = True
                continue
            self._missing = False
            if seen == self._seen:
                continue
            await asyncio.sleep(SETTLE_SECONDS)
            # Unless it changed again meanwhile, or a SIGHUP has loaded this very content.
            if await asyncio.to_thread(fingerprint, self._path) == seen != self._seen:
                await self.reload("file changed")

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("config reload failed", exc_info=task.exception())


def _refused(trigger: str, reason: str) -> str:
    # One line, whatever the error: a validation error lists each bad path on a line of its own.
    # Exempt from the repeat limiter: each refusal has its own reason, and each leaves the file not in effect.
    log.error("config reload (%s) refused, keeping the running config: %s", trigger,
              "; ".join(line.strip() for line in reason.splitlines() if line.strip()), extra=EXEMPT)
    return "refused"
