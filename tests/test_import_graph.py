"""The import graph stays a hierarchy: no circles, no imports hidden in functions, and a core without the web."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.import_graph import LAZY_EXPORTS, Module, circles, layer, levels, modules, reaches, upward

# Pure logic: no network, no aiohttp, no templates. Every module of proxy/core is, and so are these of other layers
# (pure parts the layers above lean on); each imports only pure modules, the standard library and small pure
# packages (tiktoken, orjson, pydantic).
PURE_ELSEWHERE = ("errors", "headers", "offload", "request_context", "summarizer.fence", "summarizer.result_removal",
                  "summarizer.summary_check", "summarizer.transcript", "upstream.overflow", "upstream.streaming",
                  "store.single_flight")
CORE = tuple(sorted(name for name in modules() if layer(name) == "core")) + PURE_ELSEWHERE
WEB = frozenset({"aiohttp", "jinja2", "redis", "prometheus_client"})


def graph() -> dict[str, Module]:
    return {name: module for name, module in modules().items() if name != LAZY_EXPORTS}


def test_there_are_no_import_circles() -> None:
    assert circles(graph()) == []
    assert levels(graph()) > 1


# Imports in a function for what they weigh, not to hide a circle (the graph counts their arrows all the same).
LOADED_WHEN_USED = {("store.stores", "store.redis_store"), ("store.journals", "store.redis_journal")}


def test_no_module_hides_an_import_of_another_in_a_function() -> None:
    hidden = [f"proxy.{name}:{line} imports proxy.{target}" for name, module in graph().items()
              for line, target in module.deferred if (name, target) not in LOADED_WHEN_USED]
    assert hidden == []


def test_a_proxy_without_redis_does_not_load_redis() -> None:
    check = "import proxy.app, proxy.cli, sys; print('redis' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_arrows_point_down_the_layers_only() -> None:
    """shell -> http -> compaction -> {summarizer, dialects, store} -> upstream -> core -> base (tests/import_graph)."""
    assert upward(graph()) == []
    assert {layer(name) for name in graph()} == {"shell", "http", "compaction", "summarizer", "dialects", "store",
                                                 "upstream", "core", "base"}


def test_aiohttp_web_is_imported_by_the_http_edge_and_the_shell_only() -> None:
    importers = sorted(name for name, module in graph().items() if module.web)
    assert "http.handlers" in importers
    assert {layer(name) for name in importers} <= {"http", "shell"}, importers


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
    sideways = {"core.a": Module("core.a", frozenset({"http.b"}), frozenset()),
                "http.b": Module("http.b", frozenset(), frozenset()),
                "store.c": Module("store.c", frozenset({"summarizer.d"}), frozenset()),
                "summarizer.d": Module("summarizer.d", frozenset(), frozenset())}
    assert upward(sideways) == ["core.a -> http.b", "store.c -> summarizer.d"]
