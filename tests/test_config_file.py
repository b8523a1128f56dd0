"""The config file read with bounds: an empty file, a huge, deep or self-expanding one is a ConfigError, never a
crash, a hang or a default config."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import MIB, ConfigError, Settings, load_settings
from proxy.config_file import MAX_BYTES, MAX_DEPTH, MAX_VALUES, read_head

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file the property tests rewrite for each case (a function-scoped tmp_path is not reset per case)."""
    return tmp_path_factory.mktemp("config-file") / "config.yaml"


def refusal(path: Path, content: str | bytes) -> str:
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    return str(caught.value)


def outcome(path: Path, content: bytes) -> Settings | ConfigError:
    path.write_bytes(content)
    try:
        return load_settings(path, env={})
    except ConfigError as error:
        return error


# --- a file that says nothing ------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["", " \n   \n", "# only comments\n", "---\n", "--- # a comment\n...\n",
                                     "null\n", "~\n", "--- ~\n", "\ufeff", "\r\n\r\n"])
def test_a_file_that_parses_to_nothing_is_refused(tmp_path: Path, content: str) -> None:
    message = refusal(tmp_path / "config.yaml", content)
    assert "is empty" in message and "write `{}`" in message


@pytest.mark.parametrize("content", ["{}\n", "--- {}\n", "{}  # every default, on purpose\n"])
def test_an_explicit_empty_mapping_means_every_default(tmp_path: Path, content: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(content, encoding="utf-8")
    assert load_settings(path, env={}) == Settings()


# --- bounds ------------------------------------------------------------------------------------------------

def alias_chain(links: int, depth: int) -> str:
    """Anchors each nesting the previous one `depth` levels down: shallow as written, deep once expanded."""
    lines = [f"a0: &a0 {'[' * depth}1{']' * depth}"]
    lines += [f"a{i}: &a{i} {'[' * depth}*a{i - 1}{']' * depth}" for i in range(1, links)]
    return "\n".join(lines) + "\n"


def laughs(levels: int, fan: int) -> str:
    """The billion laughs: each level a list of `fan` aliases of the level before."""
    lines = ["l0: &l0 lol"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


BOUNDED = {
    "deep flow nesting": ("x: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested deeper than"),
    "deep nesting never closed": ("[" * 100_000, "nested deeper than"),
    "deep block nesting": ("".join(f"{' ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5)) + "\n", "nested deeper than"),
    "deep only through aliases": (alias_chain(60, 50), "nested deeper than"),
    "a billion laughs": (laughs(9, 9), f"more than {MAX_VALUES:,} values"),
    "a small laugh": (laughs(10, 4), f"more than {MAX_VALUES:,} values"),
    "a recursive alias": ("a: &a [1, *a]\n", "refers to itself"),
    "a recursive merge": ("a: &a {b: 1, <<: *a}\n", "refers to itself"),
    "too many values": ("x: [" + "1," * (MAX_VALUES + 1) + "1]\n", f"more than {MAX_VALUES:,} values"),
    "over the size cap": ("{}\n# " + "x" * MAX_BYTES + "\n", "larger than 256 KiB"),
    "an integer Python will not parse": ("server: {port: " + "1" * 5000 + "}\n", "a value cannot be read"),
    "a date that does not exist": ("x: 2001-02-30\n", "a value cannot be read"),
}


@pytest.mark.parametrize("kind", BOUNDED)
def test_unbounded_files_are_refused_with_their_reason(tmp_path: Path, kind: str) -> None:
    content, fragment = BOUNDED[kind]
    message = refusal(tmp_path / "config.yaml", content)
    assert fragment in message
    assert len(message) < 1000  # one reason, not a traceback or the file


def test_the_bounds_leave_room_for_real_configs(tmp_path: Path) -> None:
    # Model entries up to just under the size cap: a huge file, and still a config.
    entry = "  model-{0}: {{context_window: {1}, manages_own_context: false}}\n"
    lines, size = ["models:\n"], len("models:\n")
    while size < MAX_BYTES - 100:
        lines.append(entry.format(len(lines), 1000 + len(lines)))
        size += len(lines[-1])
    path = tmp_path / "config.yaml"
    path.write_text("".join(lines), encoding="utf-8")
    assert len(load_settings(path, env={}).models) == len(lines)  # every entry and `default`


def test_an_oversized_file_is_refused_from_its_head(tmp_path: Path) -> None:
    # A pipe whose writer stays open: reading it to its end would wait for ever, reading its head does not.
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load_settings, fifo, env={})
        with fifo.open("wb") as writer:
            writer.write(b"#" * (MAX_BYTES + 1))
            writer.flush()
            with pytest.raises(ConfigError, match="larger than 256 KiB"):
                loading.result(timeout=60)  # a bound for a broken build, not a timing


def test_the_head_is_the_cap_and_one_byte(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"x" * (3 * MIB))
    assert len(read_head(path)) == MAX_BYTES + 1


# --- properties: anything at all is a config or a ConfigError ----------------------------------------------

YAML_CHARACTERS = "[]{}:,-?&*!|>'\"#%@` \n\t.~=<0123456789abcxyz$_"


@PROPERTY
@given(st.binary(max_size=400) | st.text(YAML_CHARACTERS, max_size=400).map(str.encode))
def test_any_bytes_are_a_config_or_a_config_error(scratch: Path, content: bytes) -> None:
    assert isinstance(outcome(scratch, content), Settings | ConfigError)


ANCHORS = st.sampled_from(["a", "b", "c"])
SCALARS = st.sampled_from(["1", "x", "~", "''", "[]", "{}", "2001-02-30", "1" * 5000, "${H1_UNSET}",
                           "${H1_UNSET:-http://h/v1}", "!!binary aGk=", "!!set {a, b}", "0x1f"]) | \
    ANCHORS.map(lambda name: f"*{name}")
KEYS = st.sampled_from(["server", "upstream", "api_keys", "base_url", "models", "default", "port", "x", "<<",
                        "[a]", "~"])


def _nest(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(st.tuples(KEYS, children), max_size=4).map(
            lambda pairs: "{" + ", ".join(f"{key}: {value}" for key, value in pairs) + "}"),
        st.tuples(ANCHORS, children).map(lambda pair: f"&{pair[0]} {pair[1]}"),
        st.tuples(st.integers(1, 3 * MAX_DEPTH), children).map(
            lambda pair: "[" * pair[0] + pair[1] + "]" * pair[0]),
    )


YAML_TREES = st.recursive(SCALARS, _nest, max_leaves=30)


@PROPERTY
@given(YAML_TREES, KEYS)
def test_any_nesting_of_anchors_and_aliases_is_a_config_or_a_config_error(scratch: Path, tree: str,
                                                                         key: str) -> None:
    for text in (tree, f"{key}: {tree}"):
        assert isinstance(outcome(scratch, text.encode()), Settings | ConfigError)


PYTHON_TREES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=40)


@PROPERTY
@given(st.dictionaries(st.sampled_from(["server", "upstream", "compaction", "models", "store", "logging", "x"]),
                       PYTHON_TREES, max_size=4))
def test_any_dumped_structure_is_a_config_or_a_config_error(scratch: Path, tree: dict[str, Any]) -> None:
    assert isinstance(outcome(scratch, yaml.safe_dump(tree).encode()), Settings | ConfigError)
