"""The import graph stays a hierarchy: no circles, no imports hidden in functions, and a core without the web."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.import_graph import LAZY_EXPORTS, Module, circles, levels, modules, reaches

# Pure logic: no network, no aiohttp, no templates. Anything here may be imported by any layer, and imports only
# from this list and the standard library or small pure packages (tiktoken, orjson, pydantic).
CORE = ("backoff", "budget", "calibration", "credentials", "elision", "encodings", "errors", "fence", "fingerprint",
        "headers", "history_index", "messages", "offload", "overflow", "plan", "request_context", "result_removal",
        "routes", "single_flight", "streaming", "summary_check", "tenants", "tokens", "transcript")
WEB = frozenset({"aiohttp", "jinja2", "redis", "prometheus_client"})


def graph() -> dict[str, Module]:
    return {name: module for name, module in modules().items() if name != LAZY_EXPORTS}


def test_there_are_no_import_circles() -> None:
    assert circles(graph()) == []
    assert levels(graph()) > 1


def test_no_module_hides_an_import_of_another_in_a_function() -> None:
    hidden = [f"proxy/{name}.py:{line} imports proxy.{target}" for name, module in graph().items()
              for line, target in module.deferred]
    assert hidden == []


@pytest.mark.parametrize("name", CORE)
def test_the_core_imports_only_the_core(name: str) -> None:
    loaded = reaches(graph(), name)
    assert loaded <= set(CORE), f"proxy.{name} loads {sorted(loaded - set(CORE))}"
    external = set().union(*(graph()[module].external for module in loaded))
    assert not external & WEB, f"proxy.{name} loads {sorted(external & WEB)}"


def test_importing_the_core_loads_neither_aiohttp_nor_jinja2() -> None:
    """The same, as the interpreter sees it: what the source says is what gets loaded."""
    imports = "; ".join(f"import proxy.{name}" for name in CORE)
    check = f"{imports}; import sys; print(sorted(name for name in {sorted(WEB)!r} if name in sys.modules))"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_graph_sees_a_circle_and_a_hidden_import() -> None:
    """The checks above can fail: a made-up graph with both faults is caught by the same functions."""
    made_up = {"a": Module("a", frozenset({"b"}), frozenset()), "b": Module("b", frozenset({"a"}), frozenset(),
                                                                             ((3, "a"),))}
    assert circles(made_up) == [["a", "b"]]
    assert [target for module in made_up.values() for _, target in module.deferred] == ["a"]
