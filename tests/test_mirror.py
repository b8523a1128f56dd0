"""Tests mirror the house: each module of proxy/ has tests/<folder>/test_<module>.py, or says where it is tested."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import name_of, sources

TESTS = Path(__file__).resolve().parent

# Modules tested through the running app (or through the one module that wraps them) rather than in a file of their
# own, each with where. Short on purpose: a new module gets its own test file.
ELSEWHERE = {
    "app": "the composition root: every tests/e2e test starts it",
    "compaction.ahead": "tests/e2e/test_prepared_e2e.py (prepared, spliced without a wait, one per mark, the "
                        "fallback) and test_compaction_e2e.py (one turn ahead)",
    "compaction.answer_headers": "tests/test_names.py (every header documented) and the x-compaction asserts of "
                                 "tests/e2e",
    "compaction.api_fallback": "tests/e2e/test_responses_over_chat.py and test_messages_over_chat_e2e.py (auto: "
                               "learned from a 404, kept on a missing model, what counts as no route)",
    "compaction.compactor": "tests/e2e/test_compaction_e2e.py, test_backoff_e2e.py, test_hostile_summariser.py",
    "compaction.job": "the compactor's: its log line's figures in tests/e2e/test_hysteresis_e2e.py",
    "compaction.journey": "a request's state and the Serving protocol: every tests/e2e test goes through both",
    "compaction.pipeline": "tests/e2e: compaction, shadow, hysteresis, overflow styles, tenants, the agent loop",
    "compaction.runtime": "tests/test_reload.py (swapped whole on reload), tests/e2e/test_shutdown.py",
    "dialects.dialect": "protocols only; tests/dialects/test_chat.py checks the chat dialect against them",
    "http.appkeys": "typed application keys, read by every handler",
    "http.handlers": "tests/e2e/test_passthrough.py and every end-to-end test",
    "http.journal_api": "tests/e2e/test_journal_api_e2e.py (tenants, operators, bounds, replicas) and "
                        "tests/e2e/test_dashboard_browser.py (the dashboard in Chromium)",
    "http.pin": "tests/test_reload.py: a stream and concurrent requests survive reloads",
    "http.server_timeouts": "tests/e2e/test_timeouts.py",
    "log_filters": "tests/e2e/test_keys.py and tests/e2e/test_secrets_scan.py (redaction)",
    "store.journals": "tests/store/test_journal.py's contract run against every journal it opens",
    "store.redis_journal": "tests/store/test_journal.py (the contract, and Redis's own cases)",
    "store.sqlite_journal": "tests/store/test_journal.py (the contract, and SQLite's own cases)",
    "store.stores": "tests/store/test_store.py's contract run against every store it opens",
    "summarizer.model_client": "tests/summarizer/test_structured_output.py, tests/e2e/test_hostile_summariser.py",
    "summarizer.summary_schema": "tests/summarizer/test_structured_output.py",
    "upstream.upstream": "tests/e2e/test_upstream_headers.py, tests/e2e/test_upstream_body.py, "
                         "tests/e2e/test_no_second_copy.py",
    "upstream.upstream_pool": "tests/e2e/test_no_second_copy.py (dead pooled connections go unused)",
}


def expected_test(name: str) -> Path:
    *folders, module = name.split(".")
    return TESTS.joinpath(*folders, f"test_{module}.py")


def modules() -> list[str]:
    return [name_of(path) for path in sources() if path.name != "__init__.py" and path.stem != "__main__"]


def test_every_module_has_its_test_file_or_says_where_it_is_tested() -> None:
    missing = [f"{name}: {expected_test(name).relative_to(TESTS.parent)}" for name in modules()
               if not expected_test(name).exists() and name not in ELSEWHERE]
    assert missing == []


def test_the_allow_list_names_only_modules_without_a_test_file() -> None:
    stale = [name for name in ELSEWHERE if name not in modules() or expected_test(name).exists()]
    assert stale == []


def test_every_test_folder_mirrors_a_layer() -> None:
    folders = {path.name for path in TESTS.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    layers = {path.parent.name for path in sources() if path.name == "__init__.py" and path.parent.name != "proxy"}
    # Beyond the layers: end-to-end runs, the real-model runs, a real agent CLI's runs, the benchmarks' logic, and
    # the fakes they share.
    assert folders - layers == {"e2e", "e2e_real", "e2e_agents", "bench", "fakes"}
    # The journey's three modules are tested running (see ELSEWHERE), so their folder may be absent.
    assert layers - folders <= {"compaction"}
