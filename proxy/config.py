"""Settings: one YAML file validated once into frozen pydantic models, with ${ENV} interpolation."""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from proxy.config_file import ConfigError as ConfigError  # re-exported: it is every caller's config error
from proxy.config_file import read_tree

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 0.8
TARGET_SHARE_OF_THRESHOLD = 0.625  # the default target (0.5) over the default threshold (0.8)
MIB = 1024 * 1024
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerConfig(_Frozen):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(64 * MIB, gt=0)
    api_keys: tuple[SecretStr, ...] = ()
    tenant_header: str | None = None
    # Seconds a client may take to send a complete request head, from connecting or from its first byte.
    header_timeout: float = Field(10.0, gt=0)
    # Seconds an idle keep-alive connection stays open between requests.
    keepalive_timeout: float = Field(75.0, gt=0)
    # Seconds the whole request body may take to arrive; a stalled upload is dropped, its memory freed.
    body_timeout: float = Field(60.0, gt=0)
    # Seconds SIGTERM waits for requests and streams in progress to finish before cancelling them.
    shutdown_grace_seconds: float = Field(30.0, ge=0)
    # Seconds between checks of the config file for changes (then reloaded); 0 = reload on SIGHUP only.
    reload_poll_seconds: float = Field(1.0, ge=0)
    # The event loop: "auto" is uvloop when it is installed (it is a dependency where it builds), else asyncio's.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # Operator keys: they see what the proxy runs in front of (/readyz details); not accepted as proxy keys.
    admin_keys: tuple[SecretStr, ...] = ()
    # Seconds one write to a client may wait for it to take the bytes; a slower reader's stream is cut and its
    # upstream connection released (a client reading at a byte a second must not hold the pool). Below the wait of
    # a request queued for a pooled connection (upstream.pool_timeout + connect_timeout, 15 s by default), so that
    # such a request gets the connection of a reader that was cut.
    write_timeout: float = Field(10.0, gt=0)

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        # `api_keys: ${PROXY_API_KEYS:-}` takes every key from one variable; unset or empty means none.
        if isinstance(value, str):
            return tuple(key.strip() for key in value.split(",")) if value.strip() else ()
        return value

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _no_blank_key(cls, keys: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        # A blank accepted key would match a client that sends no key at all.
        if any(not key.get_secret_value().strip() for key in keys):
            raise ValueError("a blank key would let every client in (is an environment variable unset?)")
        return keys


class UpstreamConfig(_Frozen):
    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr | None = None
    connect_timeout: float = Field(10.0, gt=0)
    idle_timeout: float = Field(300.0, gt=0)
    max_connections: int = Field(1000, ge=1)
    # Seconds a request may queue for a free connection when all max_connections are busy (connecting aside).
    pool_timeout: float = Field(5.0, gt=0)
    # Seconds an idle pooled connection may be reused. Below the upstream's own keep-alive (5 s for vLLM and
    # SGLang under uvicorn, for llama.cpp's server and for Node): a connection the upstream closes as a POST is
    # written loses that POST, which is never sent again (it may have been received).
    keepalive_timeout: float = Field(4.0, gt=0)
    # Ask the upstream for its models' context windows (vLLM, llama.cpp, LiteLLM, OpenRouter say so).
    discover_windows: bool = True
    discovery_ttl_seconds: float = Field(default=3600.0, gt=0)
    # The proxy's own access keys (server.api_keys), never to be sent to this upstream. Not a config key:
    # Settings copies them here, so every client of this upstream (chat, summariser, discovery) withholds them.
    _withheld_keys: tuple[SecretStr, ...] = PrivateAttr(default=())

    @property
    def withheld_keys(self) -> tuple[str, ...]:
        return tuple(key.get_secret_value() for key in self._withheld_keys)

    def withholding(self, keys: tuple[SecretStr, ...]) -> UpstreamConfig:
        """A copy that withholds `keys` from the upstream."""
        copy = self.model_copy()
        copy._withheld_keys = keys
        return copy

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, value: Any) -> Any:
        # `${OPENAI_API_KEY:-}` with the variable unset means "pass the client's key through".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class SummarizerConfig(_Frozen):
    model: str | None = None
    upstream: UpstreamConfig | None = None
    max_output_tokens: int = Field(4096, gt=0)
    # Reasoning models reject max_tokens; older servers know nothing else.
    output_limit_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    # None sends no temperature (some models accept only their default); 0 makes summaries repeatable.
    temperature: float | None = Field(None, ge=0, le=2)
    # A deadline for the whole summary (every call of it), not for one call.
    timeout: float = Field(180.0, gt=0)
    # Calls one summary may make (the tool-result ladder, chunks and merges together).
    max_calls: int = Field(32, ge=1)
    # Ask for the summary schema through response_format. `auto` does so only for a model whose plain replies
    # keep failing to parse: constrained replies kept fewer facts in the benchmark (proxy.structured_output).
    structured_output: Literal["auto", "json_schema", "json_object", "off"] = "auto"
    # prefix: the summariser request is the conversation's own messages and tools plus one instruction, so the
    # upstream's prefix cache serves the history; transcript: the history as text in a system prompt of its own.
    # auto: prefix when the summariser is the conversation's own model at its own upstream, else transcript.
    layout: Literal["auto", "prefix", "transcript"] = "auto"
    # Add to each summary, verbatim, the user messages, failing commands with their error lines and files worked
    # on that it left out (proxy.evidence): small models drop exact values first.
    evidence: bool = True


class ClearConfig(_Frozen):
    """Stage 1: old tool results replaced by a placeholder in what is forwarded (no model call)."""

    enabled: bool = True
    # Clear once the prompt and the reserved output pass this share of the window, or compaction.threshold if that
    # is lower: the small tool always comes before the summary.
    trigger: float = Field(0.6, gt=0, lt=1)
    # The most recent results kept whole. A clearing clears all the others at once, so the next one comes only when
    # the prompt passes the trigger again: between the two every request starts with the same bytes.
    keep: int = Field(8, ge=0)
    # Tokens: clear nothing for less (a cleared prefix busts the cache once). A clearing frees half the room at least
    # whatever this says; raise it to clear more rarely still.
    clear_at_least: int = Field(0, ge=0)
    exclude_tools: tuple[str, ...] = ()
    clear_inputs: bool = False  # the cleared calls' arguments too


class SummarizePairsConfig(_Frozen):
    """Stage 2: old tool rounds summarised one by one in the background, swapped in when they match exactly (with
    clearing on, in place of the placeholders of the rounds it clears). Off by default: measured on a 200-call agent
    (bench/agents.py --only tool-stages), it passes most tool output through the summariser once, for no fewer
    whole-history summaries than clearing alone."""

    enabled: bool = False
    batch_size: int = Field(10, ge=1, le=50)
    keep_recent: int = Field(8, ge=0)  # the most recent rounds never summarised (with clearing on: the current one)
    # Summarise once the unsummarised rounds' results pass this share of the window.
    cutoff: float = Field(0.25, gt=0, lt=1)
    max_summary_tokens: int = Field(200, ge=16)  # per round


class ToolResultsConfig(_Frozen):
    clear: ClearConfig = ClearConfig()
    summarize_pairs: SummarizePairsConfig = SummarizePairsConfig()


class CompactionConfig(_Frozen):
    enabled: bool = True
    # shadow: decide and report (headers, log line, metrics) but forward every request unchanged.
    mode: Literal["auto", "shadow"] = "auto"
    threshold: float = Field(DEFAULT_THRESHOLD, ge=0)
    target: float = Field(0.5, gt=0, lt=1)
    reserved_output_tokens: int = Field(1024, ge=0)
    tail_budget: float = Field(0.25, ge=0, lt=1)
    # Earlier user messages kept verbatim after a compaction (the latest is always kept), newest first.
    instruction_budget: float = Field(0.1, ge=0, lt=1)
    background: bool = True
    # A summary started in the background once a request passes this share of the threshold (0.75 of 0.8: at 0.6
    # of the window; of a client's own threshold likewise), kept aside and spliced in when one passes the
    # threshold: in an agent loop it is ready before it is needed. null: started one turn before the threshold,
    # so the next request waits for what is left of it.
    prepare_at: float | None = Field(0.75, gt=0, lt=1)
    # Requests far below every limit (by their byte count, against a stated window) relayed unread: no parsing,
    # fingerprinting or counting, and no point in the journal's chart (compaction.glance).
    glance: bool = True
    prompts_dir: Path | None = None
    summarizer: SummarizerConfig = SummarizerConfig()
    # The smaller tools before the whole-history summary (stages 1 and 2); models.<name>.tool_results overrides.
    tool_results: ToolResultsConfig = ToolResultsConfig()

    @property
    def proactive(self) -> bool:
        return self.enabled and 0 < self.threshold < 1

    @model_validator(mode="after")
    def _target_below_threshold(self) -> CompactionConfig:
        if self.proactive and self.target >= self.threshold:
            raise ValueError(f"target ({self.target}) must be below threshold ({self.threshold})")
        return self

    @property
    def prepare_share(self) -> float | None:
        """Where a summary is prepared, as a share of the threshold's tokens; None: one turn ahead instead."""
        return self.prepare_at if self.proactive and self.background else None


class ModelConfig(_Frozen):
    context_window: int = Field(128000, gt=0)
    manages_own_context: bool = False
    tool_results: ToolResultsConfig | None = None  # this model's stages 1 and 2; compaction.tool_results if unset


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class StoreConfig(_Frozen):
    kind: Literal["memory", "sqlite", "redis"] = "memory"
    path: Path | None = None
    # A secret, since it may carry a password (redis://user:password@host:6379/0); dumps masked.
    url: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    key_prefix: str = Field("compaction-proxy:", max_length=200)
    ttl_seconds: float = Field(7 * 24 * 3600, gt=0)
    max_entries: int = Field(10000, ge=1)
    # The memory store's bound in bytes of stored records, beside max_entries: one summary can be large.
    max_bytes: int = Field(64 * MIB, ge=1)
    max_value_bytes: int = Field(MIB, gt=0)
    # A summary's cross-replica lock lives this long unless its holder renews it (every third of it).
    lock_ttl_seconds: float = Field(30.0, ge=0.05)
    # Redis: socket connect/read timeout, so an unreachable Redis costs a request this much at most, once. SQLite:
    # how long a read or write waits for a locked file before it is a miss (read) or not kept (write).
    timeout_seconds: float = Field(1.0, gt=0)

    @field_validator("url", "password", mode="before")
    @classmethod
    def _blank_secret_is_none(cls, value: Any) -> Any:
        # `${REDIS_PASSWORD:-}` with the variable unset means "no password".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("username", mode="before")
    @classmethod
    def _blank_username_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(_REDIS_SCHEMES):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _kind_has_its_location(self) -> StoreConfig:
        if self.kind == "sqlite" and self.path is None:
            raise ValueError("kind 'sqlite' needs a path")
        if self.kind == "redis" and self.url is None:
            raise ValueError("kind 'redis' needs a url (is an environment variable unset?)")
        if self.password is not None and self.url is not None and _url_has_password(self.url.get_secret_value()):
            raise ValueError("give the redis password in the url or in password, not both")
        return self


def _url_has_password(url: str) -> bool:
    """True when a redis URL carries a password, in its authority (user:password@) or as ?password=."""
    authority = url.partition("://")[2].partition("/")[0]
    query = url.partition("?")[2]
    return ":" in authority.rpartition("@")[0] or any(part.startswith("password=") for part in query.split("&"))


class JournalConfig(_Frozen):
    """The compaction journal: what each conversation was sent instead, kept in the configured store."""

    enabled: bool = True
    # Events in all (summaries, stage events, failures): past this the oldest goes first.
    max_events: int = Field(2000, ge=1)
    # Conversations listed: past this the least recently seen goes, with its requests.
    max_conversations: int = Field(1000, ge=1)
    # Requests kept per conversation (the points of its chart): past this the oldest goes.
    max_points: int = Field(200, ge=1)
    # The memory journal's bound in bytes (summaries and points); past it the oldest event or the least recently
    # seen conversation goes. SQLite and Redis keep to the counts above.
    max_bytes: int = Field(32 * MIB, ge=1)
    # Seconds an entry is kept; unset = the store's ttl_seconds.
    ttl_seconds: float | None = Field(None, gt=0)


class LoggingConfig(_Frozen):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # "json": every line one JSON object (time, level, logger, then an event's own fields or `message`), for a log
    # collector; "text": time, level, logger and message, for a person.
    format: Literal["text", "json"] = "text"
    # One JSON line per request on the `proxy.access` logger (probes at DEBUG); request ids are returned either way.
    access_log: bool = True
    # How long access lines may wait to be written together (one write to stderr for many requests, as nginx's and
    # Envoy's access logs buffer); any other log line writes them first, so the order holds. 0: each as it comes.
    access_log_flush_seconds: float = Field(default=0.5, ge=0, le=10)


class ResponsesDialectConfig(_Frozen):
    # What the upstream speaks to Responses API clients: the Responses API itself, only chat completions (each
    # request then goes as a chat completion and its answer comes back in the Responses shape), or "auto": the
    # Responses API until the upstream answers that it has no such route (404 or 405), chat completions from then on.
    upstream_api: Literal["auto", "responses", "chat"] = "responses"
    # Whether the upstream runs OpenAI's compaction itself (OpenAI's own API does): then a request asking for it — a
    # `context_management` entry, `truncation: "auto"`, Codex's `compaction_trigger`, POST /responses/compact — is
    # forwarded untouched. Off (every other upstream), the proxy honours that contract itself.
    upstream_compaction: bool = False

    @model_validator(mode="after")
    def _compacting_only_where_spoken(self) -> ResponsesDialectConfig:
        if self.upstream_compaction and self.upstream_api == "chat":
            raise ValueError("upstream_compaction: true needs an upstream that speaks the Responses API "
                             "(upstream_api: responses or auto); a chat-completions upstream compacts nothing")
        return self


class MessagesDialectConfig(_Frozen):
    # What the upstream speaks to Anthropic Messages API clients (Claude Code, the `anthropic` SDK): the Messages API
    # itself, only chat completions (each request then goes as a chat completion and its answer comes back in the
    # Messages shape), or "auto": the Messages API until the upstream answers that it has no such route (404 or
    # 405), chat completions from then on.
    upstream_api: Literal["auto", "messages", "chat"] = "messages"
    # Whether the upstream runs Anthropic's context management itself (Anthropic's own API does): then a request's
    # `context_management` edits and on-demand `compaction` are forwarded untouched, and the proxy compacts only
    # requests that ask for no edit that changes anything. Off (every other upstream), the proxy applies them: the
    # clearing edits, the compaction edit (its `compaction` block, its pause) and on-demand compaction.
    upstream_context_management: bool = False

    @model_validator(mode="after")
    def _managed_only_where_spoken(self) -> MessagesDialectConfig:
        if self.upstream_context_management and self.upstream_api == "chat":
            raise ValueError("upstream_context_management: true needs an upstream that speaks the Messages API "
                             "(upstream_api: messages or auto); a chat-completions upstream runs none of it")
        return self


class DialectsConfig(_Frozen):
    responses: ResponsesDialectConfig = ResponsesDialectConfig()
    messages: MessagesDialectConfig = MessagesDialectConfig()


def _default_models() -> dict[str, ModelConfig]:
    return {"default": ModelConfig()}


class Settings(_Frozen):
    server: ServerConfig = ServerConfig()
    # Validated even when defaulted, so the proxy keys reach every upstream config (see _withhold_proxy_keys).
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig, validate_default=True)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig, validate_default=True)
    models: dict[str, ModelConfig] = Field(default_factory=_default_models)
    store: StoreConfig = StoreConfig()
    journal: JournalConfig = JournalConfig()
    logging: LoggingConfig = LoggingConfig()
    dialects: DialectsConfig = DialectsConfig()

    @field_validator("upstream")
    @classmethod
    def _withhold_proxy_keys(cls, upstream: UpstreamConfig, info: ValidationInfo) -> UpstreamConfig:
        return _withholding_proxy_keys(upstream, info)

    @field_validator("compaction")
    @classmethod
    def _withhold_proxy_keys_from_summaries(cls, compaction: CompactionConfig, info: ValidationInfo) \
            -> CompactionConfig:
        summarizer = compaction.summarizer
        if summarizer.upstream is None:
            return compaction  # summaries go through `upstream`, which withholds them already
        upstream = _withholding_proxy_keys(summarizer.upstream, info)
        return compaction.model_copy(update={"summarizer": summarizer.model_copy(update={"upstream": upstream})})

    @field_validator("models")
    @classmethod
    def _has_default(cls, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        return models if "default" in models else {**models, "default": ModelConfig()}

    def model_for(self, name: str | None) -> ModelConfig:
        """Per-model facts: an exact entry, else `default`."""
        return self.models.get(name or "", self.models["default"])

    def tool_results_for(self, name: str | None) -> ToolResultsConfig:
        """The model's own tool-result stages where it sets them, else the global ones."""
        return self.model_for(name).tool_results or self.compaction.tool_results


def _withholding_proxy_keys(upstream: UpstreamConfig, info: ValidationInfo) -> UpstreamConfig:
    # `server` is declared before the fields that call this, so it is validated (or failed) already.
    server = info.data.get("server")
    keys = (*server.api_keys, *server.admin_keys) if isinstance(server, ServerConfig) else ()
    return upstream.withholding(keys) if keys else upstream


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach: 127.0.0.0/8, ::1 (also v4-mapped) and localhost."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def open_relay_problem(settings: Settings, host: str | None = None) -> str | None:
    """Why serving `settings` on `host` (default server.host) would hand the operator's key to anyone, or None.

    An upstream key with no proxy keys lets every caller spend that key; on loopback only local users can.
    """
    if settings.server.api_keys:
        return None
    keyed = [name for name, upstream in (("upstream.api_key", settings.upstream),
                                         ("compaction.summarizer.upstream.api_key",
                                          settings.compaction.summarizer.upstream))
             if upstream is not None and upstream.api_key is not None]
    listen = settings.server.host if host is None else host
    if not keyed or is_loopback(listen):
        return None
    return (f"refusing to start as an open relay: {' and '.join(keyed)} is set, server.api_keys is empty and "
            f"the proxy listens on {listen!r}, beyond loopback, so anyone who can reach it would spend that key. "
            "Set server.api_keys (e.g. api_keys: ${PROXY_API_KEYS} with PROXY_API_KEYS=key1,key2), or listen on "
            "127.0.0.1, or leave the upstream key unset so each client sends its own.")


def interpolate_env(value: Any, env: Mapping[str, str]) -> Any:
    """Replace ${VAR} and ${VAR:-fallback} in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {key: interpolate_env(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate_env(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, fallback = match.group(1), match.group(2)
        if fallback is not None:
            # As in the shell: `:-` also replaces a variable that is set but empty.
            return env.get(name) or fallback
        if name in env:
            return env[name]
        raise ConfigError(f"environment variable {name} is referenced but not set")

    return _ENV_REFERENCE.sub(substitute, value)


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    text = env.get("COMPACTION_THRESHOLD")
    if text is None:
        return raw
    try:
        threshold = float(text)
        if threshold < 0 or math.isnan(threshold):
            raise ValueError(text)
    except ValueError:
        log.warning("COMPACTION_THRESHOLD=%r is not a number >= 0; using %s", text, DEFAULT_THRESHOLD)
        threshold = DEFAULT_THRESHOLD
    section = raw.get("compaction")
    if section is not None and not isinstance(section, dict):
        return raw  # validation reports the malformed section by its path
    compaction = dict(section or {})
    compaction["threshold"] = threshold
    target = compaction.get("target", CompactionConfig.model_fields["target"].default)
    if 0 < threshold < 1 and isinstance(target, int | float) and target >= threshold:
        # An operator lowering the threshold from the environment should not have to edit the file as well.
        compaction["target"] = round(threshold * TARGET_SHARE_OF_THRESHOLD, 4)
        log.warning("COMPACTION_THRESHOLD=%s is not above compaction.target (%s); using target %s",
                    threshold, target, compaction["target"])
    return {**raw, "compaction": compaction}


def _describe(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        path = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        message = "unknown key" if problem["type"] == "extra_forbidden" else problem["msg"]
        lines.append(f"{path}: {message}")
    return "invalid config:\n  " + "\n  ".join(lines)


def settings_from_mapping(raw: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> Settings:
    """Validate an already-parsed config tree (tests build Settings this way)."""
    env = os.environ if env is None else env
    tree = interpolate_env(dict(raw or {}), env)
    tree = _apply_env_overrides(tree, env)
    try:
        return Settings.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


def load_settings(path: str | Path | None, env: Mapping[str, str] | None = None) -> Settings:
    """Read (with proxy.config_file's bounds) and validate the YAML file at `path`; no path means every default."""
    return settings_from_mapping({} if path is None else read_tree(Path(path)), env)
