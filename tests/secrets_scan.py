"""A run-wide secrets scan: no key or password in what the proxy logs or stores during the test session."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.log_filters import redact

# The literal keys and passwords the tests hand the proxy (grep tests/ for sk-, api_key, password, Bearer).
# Short or ordinary-looking ones are left to the generic patterns below, which catch them in a header.
LITERAL_SECRETS = (
    # tests/sdk.py, test_cli.py, test_compaction_e2e.py, test_tenants_e2e.py, test_passthrough.py, test_paths.py
    "sk-test", "sk-client", "sk-client-key", "sk-secret-key-123", "sk-summaries", "sk-tenant-a", "sk-tenant-b",
    "sk-one", "sk-two", "sk-victim", "sk-attacker", "sk-gateway", "sk-up", "sk-upstream", "sk-operator",
    "sk-proxy", "sk-live", "sk-cli-env-secret-4f9a1c", "proxy-cli-file-secret-77b2",
    # test_keys.py: proxy keys, the client's and the operator's upstream keys, redaction samples
    "proxy-key-7f3e9a1b2c", "proxy-key-second-55d0", "sk-client-own-upstream-key", "sk-operator-paid-key-0042",
    "sk-raw-socket-secret-1", "raw-socket-secret-2", "sk-secret-token-abc123", "sk-in-args-abcdef12",
    "sk-in-exception-123456", "sk-proj-AbCdEf0123456789", "plain-secret-value", "azure-secret-value",
    "proxy-secret-value", "hunter2", "hunter2-secret", "azure-own",
    # test_config.py, test_discovery.py
    "sk-upstream-0e1f2a", "proxy-key-7c3d9b", "sk-summarizer-55aa", "sk-from-env", "sk-client-secret",
    "sk-upstream-secret",
    # tests/redis_server.py (test_redis_store.py): the requirepass and ACL passwords
    "s3cret-Pa55word", "s3cret-Pa55word-acl",
)
# A literal counts only as a whole token, so "sk-up" is not found inside "task-update".
_LITERALS = re.compile(
    r"(?<![A-Za-z0-9_-])(?:" + "|".join(re.escape(s) for s in sorted(LITERAL_SECRETS, key=len, reverse=True))
    + r")(?![A-Za-z0-9_])")
SECRET_PATTERNS: dict[str, re.Pattern[str]] = {
    "a literal test secret": _LITERALS,
    "an sk- key": re.compile(r"sk-[A-Za-z0-9]{8,}"),
    "a bearer token": re.compile(r"Bearer [A-Za-z0-9._-]{8,}"),
    # scheme://user:password@ with a password that is not the proxy's own mask
    "a password in a URL": re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:(?!\*\*\*@)[^/\s@'\"]+@", re.IGNORECASE),
}
# The proxy's own loggers, aiohttp's (its server logs bad requests with their raw header bytes) and the root's.
WATCHED_LOGGERS = ("proxy", "aiohttp", "root")
# Files a store or a subprocess proxy writes under the pytest tmp dirs.
STORE_GLOBS = ("*.sqlite*", "*.db*")
LOG_GLOBS = ("*.log",)
BETWEEN_TESTS = "<between tests>"
MAX_KEPT_LEAKS = 200
_EXCERPT = 40


@dataclass(frozen=True)
class Leak:
    """One secret found: where, while which test ran, which pattern, and the text around it (secret masked)."""

    where: str
    test: str
    pattern: str
    excerpt: str

    def line(self) -> str:
        return f"{self.pattern} in {self.where} during {self.test}: ...{self.excerpt}..."


def find_secrets(text: str) -> Iterator[tuple[str, re.Match[str]]]:
    """Every (pattern name, match) of a secret in `text`."""
    for name, pattern in SECRET_PATTERNS.items():
        for match in pattern.finditer(text):
            yield name, match


def assert_no_secrets(text: str, where: str) -> None:
    """For tests that fetch something the proxy shows (a /metrics body, a store file): fail naming the leak."""
    leaks = [Leak(where, "this test", name, _excerpt(text, match)).line() for name, match in find_secrets(text)]
    assert not leaks, "secrets found:\n" + "\n".join(leaks)


def _excerpt(text: str, match: re.Match[str]) -> str:
    """The context of a match with the secret itself cut to four characters, so the report does not repeat it."""
    before = text[max(0, match.start() - _EXCERPT): match.start()]
    after = text[match.end(): match.end() + _EXCERPT]
    return f"{before}[{match[0][:4]}…]{after}".replace("\n", "\\n")


def record_text(record: logging.LogRecord) -> str:
    """A record as a handler would write it (message, traceback, stack), without changing the record."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed logging call still has text worth scanning
        message = f"{record.msg!r} % {record.args!r}"
    parts = [f"{record.name} {record.levelname} {message}"]
    exc_text = record.exc_text
    if not exc_text and record.exc_info:
        exc_text = logging.Formatter().formatException(record.exc_info)
    parts += [text for text in (exc_text, record.stack_info) if text]
    return "\n".join(parts)


def _watched(name: str) -> bool:
    return any(name == watched or name.startswith(watched + ".") for watched in WATCHED_LOGGERS)


class _Capture(logging.Handler):
    """On the root logger for the whole session: every watched record is scanned as it is emitted."""

    def __init__(self, scan: SecretsScan) -> None:
        super().__init__(level=logging.NOTSET)
        self._scan = scan

    def emit(self, record: logging.LogRecord) -> None:
        if _watched(record.name):
            self._scan.scan_log_record(record)


class SecretsScan:
    """The plugin: scans every watched log record, then the store and log files, and fails a leaking session.

    A record is judged as the proxy's deployment writes it: `compaction-proxy` installs proxy.log_filters'
    redaction on its log handlers, so the scan applies the same `redact` first. Secrets the redaction removed
    are counted, not failed: they show where the proxy leans on the filter.
    """

    def __init__(self) -> None:
        self.test = BETWEEN_TESTS
        self.leaks: list[Leak] = []
        self.leak_count = 0
        self.redacted = Counter[str]()
        self.records = 0
        self.files: Counter[str] = Counter()
        self._handler = _Capture(self)
        self._root_level: int | None = None

    # --- session lifecycle -----------------------------------------------------------------------------------

    def pytest_configure(self, config: pytest.Config) -> None:
        root = logging.getLogger()
        root.addHandler(self._handler)
        # The deployment logs at INFO by default (config `logging.level`); the root's WARNING default would hide
        # those lines. SECRETS_SCAN_LOG_LEVEL=DEBUG scans what a debugging deployment would write too.
        level = logging.getLevelName(os.environ.get("SECRETS_SCAN_LOG_LEVEL", "INFO").upper())
        if isinstance(level, int) and root.level > level:
            self._root_level = root.level
            root.setLevel(level)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        root = logging.getLogger()
        root.removeHandler(self._handler)
        if self._root_level is not None:
            root.setLevel(self._root_level)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        return (yield from self._during(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        return (yield from self._during(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Any:
        return (yield from self._during(item, "teardown"))

    def _during(self, item: pytest.Item, phase: str) -> Iterator[Any]:
        self.test = f"{item.nodeid} ({phase})"
        try:
            return (yield)
        finally:
            self.test = BETWEEN_TESTS

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        for path in self._files(session.config):
            self.scan_file(path)
        if self.leak_count and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        files = ", ".join(f"{count} {kind}" for kind, count in sorted(self.files.items())) or "no files"
        redacted = sum(self.redacted.values())
        terminalreporter.section("secrets scan")
        terminalreporter.write_line(f"scanned {self.records} log records and {files}; "
                                    f"{redacted} secret(s) removed by the log redaction before they could show")
        for pattern, count in sorted(self.redacted.items()):
            terminalreporter.write_line(f"  redacted: {count} x {pattern}")
        if self.leak_count:
            terminalreporter.write_line(f"SECRETS SCAN FAILED: {self.leak_count} secret(s) in logs or store files",
                                        red=True, bold=True)
            for leak in self.leaks:
                terminalreporter.write_line("  " + leak.line(), red=True)
        else:
            terminalreporter.write_line("secrets scan: no secret in any log record or store file", green=True)

    # --- scanning --------------------------------------------------------------------------------------------

    def scan_log_record(self, record: logging.LogRecord) -> None:
        self.records += 1
        try:
            raw = record_text(record)
            shown = redact(raw)
        except Exception as error:  # noqa: BLE001 - the scan must never break the logging call it watches
            raw = shown = f"<unscannable record: {type(error).__name__}>"
        self._found(shown, f"log record of {record.name}")
        if shown != raw:
            for name, _ in find_secrets(raw):
                self.redacted[name] += 1

    def scan_file(self, path: Path) -> None:
        kind = "log files" if any(path.match(glob) for glob in LOG_GLOBS) else "store files"
        self.files[kind] += 1
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return  # removed while the session ended; nothing left to leak
        previous, self.test = self.test, f"the test that owns {path.parent.name}"
        self._found(text, str(path))
        self.test = previous

    def _found(self, text: str, where: str) -> None:
        for name, match in find_secrets(text):
            self.leak_count += 1
            if len(self.leaks) < MAX_KEPT_LEAKS:
                self.leaks.append(Leak(where, self.test, name, _excerpt(text, match)))

    @staticmethod
    def _files(config: pytest.Config) -> Iterable[Path]:
        factory = getattr(config, "_tmp_path_factory", None)
        basetemp = getattr(factory, "_basetemp", None)  # None: no test asked for a tmp dir
        if basetemp is None or not Path(basetemp).is_dir():
            return []
        found = {path for glob in (*STORE_GLOBS, *LOG_GLOBS) for path in Path(basetemp).rglob(glob)
                 if path.is_file() and not path.is_symlink()}
        return sorted(found)


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("secrets-scan"):
        config.pluginmanager.register(SecretsScan(), "secrets-scan")
