"""Settings: the example file, defaults, dotted-path errors, interpolation, overrides and secrets."""

from __future__ import annotations

import json
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from proxy.config import (
    MIB,
    ConfigError,
    ModelConfig,
    Settings,
    UpstreamConfig,
    interpolate_env,
    load_settings,
    settings_from_mapping,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.yaml"
ANY_MODEL = "*"


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model behind `Model`, `Model | None`; None for scalars and collections of scalars."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [arg for arg in typing.get_args(annotation) if _submodel(arg) is not None]
        return _submodel(models[0]) if models else None
    return None


def leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every scalar field of `model`, recursively, as dotted paths; dict-of-model values use `*` for the key."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        if typing.get_origin(annotation) is dict and _submodel(typing.get_args(annotation)[1]):
            paths += leaf_paths(typing.get_args(annotation)[1], f"{path}.{ANY_MODEL}.")
        elif (sub := _submodel(annotation)) is not None:
            paths += leaf_paths(sub, f"{path}.")
        else:
            paths.append(path)
    return paths


def commented_block(text: str, key: str) -> dict[str, Any]:
    """The commented-out `# key:` block of the example, uncommented and parsed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(rf"\s*# {key}:\s*", line))
    indent = lines[start].index("#")
    prefix = " " * indent + "# "
    block = [lines[start][len(prefix):]]
    for line in lines[start + 1:]:
        if not line.startswith(prefix + "  "):
            break
        block.append(line[len(prefix):])
    parsed = yaml.safe_load("\n".join(block))
    assert isinstance(parsed, dict)
    return parsed


def example_tree() -> dict[str, Any]:
    """The example's YAML with the optional summariser upstream block put in place of its `null`."""
    text = EXAMPLE.read_text(encoding="utf-8")
    tree: dict[str, Any] = yaml.safe_load(text)
    assert tree["compaction"]["summarizer"]["upstream"] is None
    tree["compaction"]["summarizer"]["upstream"] = commented_block(text, "upstream")["upstream"]
    for model in tree["models"].values():  # a model's own stages have the keys documented globally
        assert model["tool_results"] is None
        model["tool_results"] = tree["compaction"]["tool_results"]
    return tree


def has_path(tree: Any, parts: list[str]) -> bool:
    if not parts:
        return True
    if not isinstance(tree, dict):
        return False
    head, rest = parts[0], parts[1:]
    if head == ANY_MODEL:
        return bool(tree) and all(has_path(value, rest) for value in tree.values())
    return head in tree and has_path(tree[head], rest)


def invalid(tree: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping(tree, env={} if env is None else env)
    return str(caught.value)


# --- the example file --------------------------------------------------------------------------------------

def test_leaf_walk_sees_nested_and_per_model_fields() -> None:
    paths = leaf_paths(Settings)
    for expected in ("server.port", "compaction.summarizer.model", "compaction.summarizer.upstream.api_key",
                     "models.*.context_window", "store.kind", "logging.level"):
        assert expected in paths
    assert "compaction.summarizer" not in paths and "models" not in paths


@pytest.mark.parametrize("path", leaf_paths(Settings))
def test_example_documents_every_field(path: str) -> None:
    assert has_path(example_tree(), path.split(".")), f"config.example.yaml does not mention {path}"


def test_example_loads_with_an_empty_environment() -> None:
    settings = load_settings(EXAMPLE, env={})
    assert set(settings.models) == {"default", "gpt-4o-mini"}
    assert settings.upstream.api_key is None  # ${OPENAI_API_KEY:-} unset means pass-through


def test_example_values_are_the_defaults() -> None:
    loaded = load_settings(EXAMPLE, env={}).model_dump()
    defaults = Settings().model_dump()
    assert {k: v for k, v in loaded.items() if k != "models"} == {k: v for k, v in defaults.items() if k != "models"}
    assert all(model == ModelConfig().model_dump() for model in loaded["models"].values())


def test_example_summarizer_upstream_block_is_valid_and_default() -> None:
    tree = example_tree()
    block = interpolate_env(tree["compaction"]["summarizer"]["upstream"], {})
    assert UpstreamConfig.model_validate(block) == UpstreamConfig()
    assert settings_from_mapping(tree, env={}).compaction.summarizer.upstream == UpstreamConfig()


def test_example_secret_comes_from_the_environment() -> None:
    settings = load_settings(EXAMPLE, env={"OPENAI_API_KEY": "sk-from-env"})
    assert settings.upstream.api_key is not None
    assert settings.upstream.api_key.get_secret_value() == "sk-from-env"


def test_every_example_value_has_a_comment_with_its_default() -> None:
    valued = re.compile(r"^\s*[A-Za-z_][\w.-]*:\s+(?!#)\S")
    lines = [line for line in EXAMPLE.read_text(encoding="utf-8").splitlines()
             if valued.match(line) and not line.lstrip().startswith("#")]
    assert len(lines) >= 25
    undocumented = [line for line in lines if " # " not in line or "default" not in line.split(" # ", 1)[1]]
    assert undocumented == []


# --- defaults ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "expected"), [
    ("server.host", "127.0.0.1"),
    ("server.port", 8080),
    ("server.max_body_bytes", 64 * MIB),
    ("server.api_keys", ()),
    ("upstream.base_url", "https://api.openai.com/v1"),
    ("upstream.api_key", None),
    ("compaction.enabled", True),
    ("compaction.threshold", 0.8),
    ("compaction.summarizer.model", None),
    ("compaction.summarizer.upstream", None),
    ("store.kind", "memory"),
    ("logging.level", "INFO"),
])
def test_defaults(path: str, expected: Any) -> None:
    value: Any = load_settings(None, env={})
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected


def test_default_model_always_exists() -> None:
    settings = settings_from_mapping({"models": {"gpt-4o": {"context_window": 8192}}}, env={})
    assert settings.models["default"] == ModelConfig()


# --- errors name dotted paths ------------------------------------------------------------------------------

@pytest.mark.parametrize(("tree", "path"), [
    ({"servr": {}}, "servr"),
    ({"server": {"hots": "0.0.0.0"}}, "server.hots"),
    ({"compaction": {"summarizer": {"modle": "gpt-4o-mini"}}}, "compaction.summarizer.modle"),
    ({"compaction": {"summarizer": {"upstream": {"base_ur": "http://x"}}}}, "compaction.summarizer.upstream.base_ur"),
    ({"models": {"gpt-4o": {"contxt_window": 8192}}}, "models.gpt-4o.contxt_window"),
    ({"store": {"kind": "memory", "size": 5}}, "store.size"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_unknown_keys_are_rejected_with_their_dotted_path(tree: dict[str, Any], path: str) -> None:
    assert f"{path}: unknown key" in invalid(tree)


@pytest.mark.parametrize(("tree", "path", "fragment"), [
    ({"server": {"port": "eighty"}}, "server.port", "valid integer"),
    ({"server": {"port": 70000}}, "server.port", "less than or equal to 65535"),
    ({"server": {"max_body_bytes": 0}}, "server.max_body_bytes", "greater than 0"),
    ({"server": "localhost"}, "server", "valid dictionary"),
    ({"upstream": {"base_url": "ftp://files"}}, "upstream.base_url", "http:// or https://"),
    ({"upstream": {"idle_timeout": 0}}, "upstream.idle_timeout", "greater than 0"),
    ({"compaction": {"enabled": "maybe"}}, "compaction.enabled", "valid boolean"),
    ({"compaction": {"threshold": -0.1}}, "compaction.threshold", "greater than or equal to 0"),
    ({"compaction": {"target": 1.0}}, "compaction.target", "less than 1"),
    ({"compaction": {"summarizer": {"max_output_tokens": -5}}}, "compaction.summarizer.max_output_tokens",
     "greater than 0"),
    ({"models": {"gpt-4o": {"context_window": 0}}}, "models.gpt-4o.context_window", "greater than 0"),
    ({"models": ["gpt-4o"]}, "models", "valid dictionary"),
    ({"store": {"kind": "postgres"}}, "store.kind", "'memory'"),
    ({"logging": {"level": "LOUD"}}, "logging.level", "'INFO'"),
])
def test_bad_values_give_readable_dotted_path_errors(tree: dict[str, Any], path: str, fragment: str) -> None:
    message = invalid(tree)
    line = next(line for line in message.splitlines() if line.strip().startswith(f"{path}:"))
    assert fragment in line
    assert "errors.pydantic.dev" not in message and "Traceback" not in message


def test_every_problem_is_reported_at_once() -> None:
    message = invalid({"server": {"port": -1}, "store": {"kind": "ram"}, "extra": 1})
    assert all(f"{path}:" in message for path in ("server.port", "store.kind", "extra"))


@pytest.mark.parametrize(("store", "ok"), [
    ({"kind": "sqlite"}, False),
    ({"kind": "sqlite", "path": "/var/lib/proxy/summaries.db"}, True),
    ({"kind": "memory"}, True),
])
def test_sqlite_store_needs_a_path(store: dict[str, Any], ok: bool) -> None:
    if ok:
        assert settings_from_mapping({"store": store}, env={}).store.kind == store["kind"]
    else:
        assert "store: " in invalid({"store": store}) and "needs a path" in invalid({"store": store})


@pytest.mark.parametrize(("compaction", "ok"), [
    ({"threshold": 0.8, "target": 0.5}, True),
    ({"threshold": 0.5, "target": 0.5}, False),
    ({"threshold": 0.6, "target": 0.7}, False),
    ({"threshold": 0, "target": 0.9}, True),      # proactive compaction off: no target to respect
    ({"threshold": 1.0, "target": 0.9}, True),
    ({"enabled": False, "threshold": 0.3, "target": 0.5}, True),
])
def test_target_must_be_below_threshold(compaction: dict[str, Any], ok: bool) -> None:
    if ok:
        assert settings_from_mapping({"compaction": compaction}, env={}).compaction.target == compaction["target"]
    else:
        message = invalid({"compaction": compaction})
        assert "compaction: " in message and "must be below threshold" in message


@pytest.mark.parametrize(("compaction", "share"), [
    ({}, 0.75),
    ({"prepare_at": 0.5}, 0.5),
    ({"prepare_at": None}, None),                      # one turn ahead instead
    ({"threshold": 0.5, "target": 0.3}, 0.75),         # a share of the threshold: any threshold takes it
    ({"background": False}, None),
    ({"threshold": 0}, None),                          # proactive compaction off: nothing to prepare for
])
def test_where_summaries_are_prepared(compaction: dict[str, Any], share: float | None) -> None:
    assert settings_from_mapping({"compaction": compaction}, env={}).compaction.prepare_share == share


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.2, "soon"])
def test_prepare_at_is_a_share_below_one(value: Any) -> None:
    assert "compaction.prepare_at" in invalid({"compaction": {"prepare_at": value}})


# --- frozen ------------------------------------------------------------------------------------------------

_SETTINGS = settings_from_mapping({"models": {"gpt-4o": {"context_window": 8192}}}, env={})


@pytest.mark.parametrize(("owner", "attribute", "value"), [
    (_SETTINGS, "server", None),
    (_SETTINGS.server, "port", 1),
    (_SETTINGS.upstream, "base_url", "http://elsewhere"),
    (_SETTINGS.compaction, "threshold", 0.1),
    (_SETTINGS.compaction.summarizer, "model", "gpt-4o"),
    (_SETTINGS.models["gpt-4o"], "context_window", 1),
    (_SETTINGS.store, "kind", "sqlite"),
])
def test_settings_are_frozen(owner: BaseModel, attribute: str, value: Any) -> None:
    before = getattr(owner, attribute)
    with pytest.raises(ValidationError, match="frozen"):
        setattr(owner, attribute, value)
    assert getattr(owner, attribute) == before


# --- environment -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "env", "expected"), [
    ("${KEY}", {"KEY": "v"}, "v"),
    ("pre-${KEY}-post", {"KEY": "v"}, "pre-v-post"),
    ("${A}${B}", {"A": "1", "B": "2"}, "12"),
    ("${KEY:-fallback}", {"KEY": "v"}, "v"),
    ("${KEY:-fallback}", {}, "fallback"),
    ("${KEY:-fallback}", {"KEY": ""}, "fallback"),
    ("${KEY:-}", {}, ""),
    ("${KEY:-http://host:8000/v1}", {}, "http://host:8000/v1"),
    ("${KEY}", {"KEY": ""}, ""),
    ("$KEY and {KEY}", {"KEY": "v"}, "$KEY and {KEY}"),
    (5, {}, 5),
    (None, {}, None),
    ({"a": ["${KEY}", 1, {"b": "${KEY}"}]}, {"KEY": "v"}, {"a": ["v", 1, {"b": "v"}]}),
])
def test_interpolation(value: Any, env: dict[str, str], expected: Any) -> None:
    assert interpolate_env(value, env) == expected


@pytest.mark.parametrize("tree", [
    {"upstream": {"api_key": "${MISSING_UPSTREAM_KEY}"}},
    {"server": {"api_keys": ["${MISSING_UPSTREAM_KEY}"]}},
    {"models": {"gpt-4o": {"context_window": "${MISSING_UPSTREAM_KEY}"}}},
])
def test_missing_variable_is_a_config_error_naming_it(tree: dict[str, Any]) -> None:
    assert "MISSING_UPSTREAM_KEY" in invalid(tree)


def test_interpolated_text_is_validated_as_the_field_type() -> None:
    settings = settings_from_mapping({"server": {"port": "${PORT:-9000}"}}, env={"PORT": "8123"})
    assert settings.server.port == 8123
    assert "server.port" in invalid({"server": {"port": "${PORT}"}}, env={"PORT": "http"})


@pytest.mark.parametrize(("text", "file_threshold", "expected"), [
    ("0.6", None, 0.6),
    ("0.9", 0.7, 0.9),
    (" 0.95 ", None, 0.95),
    ("0", 0.9, 0.0),
    ("1.5", None, 1.5),
])
def test_compaction_threshold_env_overrides_the_file(text: str, file_threshold: float | None, expected: float,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    tree = {} if file_threshold is None else {"compaction": {"threshold": file_threshold}}
    with caplog.at_level(logging.WARNING):
        settings = settings_from_mapping(tree, env={"COMPACTION_THRESHOLD": text})
    assert settings.compaction.threshold == expected
    assert "COMPACTION_THRESHOLD" not in caplog.text


@pytest.mark.parametrize("text", ["eighty", "", "0,8", "nan", "-0.5", "80%"])
def test_unparsable_compaction_threshold_falls_back_with_a_warning(text: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="proxy.config"):
        settings = settings_from_mapping({"compaction": {"threshold": 0.9}}, env={"COMPACTION_THRESHOLD": text})
    assert settings.compaction.threshold == 0.8
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "COMPACTION_THRESHOLD" in warnings[0].getMessage()


def test_threshold_override_keeps_a_malformed_section_reportable() -> None:
    assert "compaction:" in invalid({"compaction": ["threshold"]}, env={"COMPACTION_THRESHOLD": "0.7"})


# --- models ------------------------------------------------------------------------------------------------

_MODELS = settings_from_mapping(
    {"models": {"default": {"context_window": 32000}, "gpt-4o": {"context_window": 8192}}}, env={})


@pytest.mark.parametrize(("name", "window"), [
    ("gpt-4o", 8192),
    ("gpt-4o-mini", 32000),   # exact names only: no prefix matching
    ("GPT-4O", 32000),
    ("", 32000),
    (None, 32000),
])
def test_model_for(name: str | None, window: int) -> None:
    assert _MODELS.model_for(name).context_window == window


# --- secrets -----------------------------------------------------------------------------------------------

_SECRETS = ("sk-upstream-0e1f2a", "proxy-key-7c3d9b", "sk-summarizer-55aa")
_SECRET_SETTINGS = settings_from_mapping({
    "server": {"api_keys": ["${PROXY_KEY}"]},
    "upstream": {"api_key": "${UPSTREAM_KEY}"},
    "compaction": {"summarizer": {"upstream": {"base_url": "http://summaries", "api_key": _SECRETS[2]}}},
}, env={"UPSTREAM_KEY": _SECRETS[0], "PROXY_KEY": _SECRETS[1]})


def test_api_keys_are_secret_strings() -> None:
    upstream_key = _SECRET_SETTINGS.upstream.api_key
    summarizer_upstream = _SECRET_SETTINGS.compaction.summarizer.upstream
    assert summarizer_upstream is not None and summarizer_upstream.api_key is not None
    assert isinstance(upstream_key, SecretStr) and upstream_key.get_secret_value() == _SECRETS[0]
    assert [key.get_secret_value() for key in _SECRET_SETTINGS.server.api_keys] == [_SECRETS[1]]
    assert summarizer_upstream.api_key.get_secret_value() == _SECRETS[2]


@pytest.mark.parametrize("render", [
    repr, str, lambda s: s.model_dump_json(), lambda s: json.dumps(s.model_dump(mode="json")),
    lambda s: repr(s.model_dump()),
], ids=["repr", "str", "model_dump_json", "dump_json_mode", "dump_python"])
def test_secrets_never_appear_in_output(render: Any) -> None:
    text = render(_SECRET_SETTINGS)
    assert "**********" in text
    assert not [secret for secret in _SECRETS if secret in text]


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_upstream_key_means_pass_through(blank: str) -> None:
    assert settings_from_mapping({"upstream": {"api_key": blank}}, env={}).upstream.api_key is None


def test_blank_proxy_key_is_rejected() -> None:
    assert "server.api_keys: " in invalid({"server": {"api_keys": ["${PROXY_KEY:-}"]}})


# --- files -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "fragment"), [
    ("server: [unclosed\n", "not valid YAML"),
    ("server:\n  port: 1\n   host: x\n", "not valid YAML"),
    ("- server\n- upstream\n", "mapping at the top level"),
    ("just text\n", "mapping at the top level"),
    (b"server:\n  host: \xff\xfe\n", "not UTF-8"),
    ("server:\n  port: 0x\n", "server.port"),
])
def test_bad_files_are_config_errors(tmp_path: Path, content: str | bytes, fragment: str) -> None:
    path = tmp_path / "config.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_settings(path, env={})


@pytest.mark.parametrize("name", ["missing.yaml", "."])
def test_unreadable_paths_are_config_errors(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_settings(tmp_path / name, env={})


@pytest.mark.parametrize("threshold,target", [("0.4", 0.25), ("0.5", 0.3125), ("0.9", 0.5)])
def test_threshold_from_environment_below_the_target_moves_the_target(threshold: str, target: float) -> None:
    settings = settings_from_mapping({}, env={"COMPACTION_THRESHOLD": threshold})
    assert settings.compaction.threshold == float(threshold)
    assert settings.compaction.target == target


@pytest.mark.parametrize("api", ["auto", "responses", "chat"])
def test_what_the_upstream_speaks_to_responses_clients(api: str) -> None:
    settings = settings_from_mapping({"dialects": {"responses": {"upstream_api": api}}}, env={})
    assert settings.dialects.responses.upstream_api == api


@pytest.mark.parametrize("api", ["auto", "messages", "chat"])
def test_what_the_upstream_speaks_to_messages_clients(api: str) -> None:
    settings = settings_from_mapping({"dialects": {"messages": {"upstream_api": api}}}, env={})
    assert settings.dialects.messages.upstream_api == api
    assert settings_from_mapping({}, env={}).dialects.messages.upstream_api == "messages"
    # An upstream that speaks the API may run its context management: with auto, until it shows it speaks chat only.
    managed = {"dialects": {"messages": {"upstream_api": "auto", "upstream_context_management": True}}}
    assert settings_from_mapping(managed, env={}).dialects.messages.upstream_context_management


@pytest.mark.parametrize(("tree", "fragment"), [
    ({"dialects": {"responses": {"upstream_api": "guess"}}}, "upstream_api"),
    ({"dialects": {"messages": {"upstream_api": "responses"}}}, "upstream_api"),
    ({"dialects": {"chat": {}}}, "chat"),
    ({"dialects": {"messages": {"upstream_api": "chat", "upstream_context_management": True}}},
     "upstream_context_management: true needs an upstream that speaks the Messages API"),
    ({"dialects": {"responses": {"upstream_api": "chat", "upstream_compaction": True}}},
     "upstream_compaction: true needs an upstream that speaks the Responses API"),
])
def test_dialect_settings_are_checked(tree: dict[str, Any], fragment: str) -> None:
    assert fragment in invalid(tree)
