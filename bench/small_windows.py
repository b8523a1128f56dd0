"""Small context windows: a 20-turn conversation through the proxy with the built-in prompts, per model and n_ctx."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.small_windows_report import Run, Turn, failure_report, table, write_json
from proxy.app import start_server
from proxy.config import settings_from_mapping
from proxy.summarizer.templates import default_templates
from tests.e2e_real.model_files import fetch_model
from tests.e2e_real.model_server import (
    DEFAULT_CACHE_DIR,
    SEED,
    LlamaServer,
    find_llama_python,
    locate_model,
    start_llama_server,
)
from tests.e2e_real.recorder import Exchange, Recorder
from tests.sdk import async_client

SYSTEM = ("You are a coding assistant helping a developer with their Python project. Answer concisely and "
          "refer to the files, names and numbers the user gave you.")
MAX_TOKENS = 128
WINDOW_CONFIGS = ("none", "n_ctx")
SUMMARY_TIMEOUT: float | None = None  # compaction.summarizer.timeout when --summary-timeout is given
LOG_DIR = DEFAULT_CACHE_DIR.parent / "logs"
# What a new user's project conversation looks like: each turn adds details (paths, names, numbers, errors) that a
# later turn may need, 80-150 tokens each.
USER_TURNS = (
    "I maintain a Python 3.11 service called shipyard that tracks container inventory for three warehouses. It "
    "uses FastAPI 0.110, SQLAlchemy 2.0 with asyncpg, and PostgreSQL 15. The code lives in src/shipyard/, with "
    "routes in src/shipyard/api/routes.py and models in src/shipyard/db/models.py. Can you explain how I should "
    "structure the dependency that hands each request its own AsyncSession?",
    "Here is what I have now in src/shipyard/db/session.py: engine = create_async_engine(settings.database_url, "
    "pool_size=5) and async def get_session(): async with SessionLocal() as session: yield session. Under load "
    "with 40 concurrent requests I see 'QueuePool limit of size 5 overflow 10 reached, connection timed out, "
    "timeout 30.00'. What pool settings would you start with for a 4-worker uvicorn deployment?",
    "Thanks. The warehouses are named north, harbor and delta, and each container row has a code like "
    "NRT-000123, a status (empty, loaded, in_transit, damaged) and a last_seen timestamp in UTC. I want an "
    "endpoint GET /containers?status=loaded&warehouse=harbor that pages with a cursor instead of OFFSET, because "
    "the table has 2.3 million rows. How would you write the query with SQLAlchemy 2.0 select()?",
    "The cursor should be opaque to clients. I was thinking of base64-encoding the pair (last_seen, id) as JSON. "
    "Our API guidelines in docs/api.md say page size defaults to 50 and must never exceed 200, and the response "
    "has the shape {\"items\": [...], \"next_cursor\": null or string}. Can you sketch the Pydantic v2 response "
    "model and the function that decodes the cursor, raising HTTP 400 on garbage?",
    "I added an index: CREATE INDEX ix_containers_wh_status_seen ON containers (warehouse, status, last_seen "
    "DESC, id DESC). EXPLAIN ANALYZE for the harbor/loaded query now shows an Index Scan taking 3.1 ms instead of "
    "a Seq Scan at 840 ms. Should the Alembic migration create it CONCURRENTLY, and how do I do that given Alembic "
    "runs migrations inside a transaction by default?",
    "Next problem: tests. We use pytest 8 with pytest-asyncio in auto mode, and tests/conftest.py creates a fresh "
    "database per session with testcontainers. A test in tests/api/test_containers.py fails with 'RuntimeError: "
    "Task got Future attached to a different loop' when it calls the client fixture. The engine is created at "
    "import time in session.py. What is the cause and what is the cleanest fix?",
    "That fixed it, I now build the engine in a lifespan handler and store it on app.state.engine. Our CI runs on "
    "GitHub Actions with a postgres:15 service container, and the whole suite of 312 tests takes 6 minutes 40 "
    "seconds. About 4 minutes of that is recreating the schema for each test module. How can I make each test run "
    "inside a transaction that is rolled back instead?",
    "Another teammate, Priya, wants to add a background job that marks containers as missing when last_seen is "
    "older than 72 hours. She proposes Celery with Redis, but we already run arq for email jobs in "
    "src/shipyard/jobs/worker.py. The job must not run twice at the same time across our two worker hosts. What "
    "would you recommend, and how do we make the job safe against overlap?",
    "We decided on arq with a Redis lock named shipyard:lock:mark-missing and a TTL of 600 seconds. The job "
    "updates rows in batches of 1000 with UPDATE ... WHERE id IN (SELECT id ... FOR UPDATE SKIP LOCKED). On "
    "staging one batch took 12 seconds because of a trigger, audit_containers_trg, that writes a row to "
    "container_audit for every update. Is there a way to batch the audit writes?",
    "The audit trigger is owned by the compliance team, so I cannot change it; constraint from them: every status "
    "change must produce exactly one audit row with the user id or the string 'system'. I can set a session "
    "variable with SET LOCAL shipyard.actor = 'system' before the update. How does the trigger read it, and is "
    "SET LOCAL safe with asyncpg connection pooling?",
    "Switching topics to deployment. We build a Docker image from python:3.11-slim, and the image is 1.2 GB "
    "because the build installs gcc and libpq-dev for asyncpg and psycopg2. Our Dockerfile is in deploy/Dockerfile "
    "and is a single stage. The registry is ghcr.io/acme/shipyard. How would you turn it into a multi-stage build "
    "and roughly how small can it get?",
    "With the multi-stage build the image is 210 MB. The container now fails to start on Kubernetes with "
    "'ImportError: libpq.so.5: cannot open shared object file: No such file or directory'. I only copied "
    "/usr/local/lib/python3.11/site-packages from the builder stage. We actually use asyncpg everywhere except "
    "scripts/backfill.py which still imports psycopg2. What is the smallest fix?",
    "I removed psycopg2 and rewrote scripts/backfill.py with asyncpg, so libpq is gone. Now the readiness probe "
    "at /healthz fails for the first 20 seconds after a deploy because the app runs Alembic migrations on startup. "
    "The deployment has 3 replicas and maxSurge 1. My lead, Tomas, says migrations must never run from the app "
    "process. How should we run them on Kubernetes instead?",
    "We will use a Helm pre-upgrade hook Job that runs alembic upgrade head with the same image. The chart is in "
    "deploy/chart/shipyard and values.yaml sets image.tag from the git SHA. One migration, 0042_add_damage_notes, "
    "adds a NOT NULL column damage_notes TEXT to containers, which has 2.3 million rows. Will that lock the table "
    "on PostgreSQL 15, and how long might it take?",
    "Good to know that a constant default is instant. Back to the API: clients complain that GET /containers "
    "returns 500 when the cursor was produced before we added the id tiebreaker, because the old cursors only hold "
    "last_seen. The error in the logs is 'KeyError: id' raised in decode_cursor at src/shipyard/api/paging.py line "
    "31. Should I support old cursors or reject them with 400?",
    "We will reject them with HTTP 400 and the error code invalid_cursor, as docs/api.md requires for malformed "
    "input. I also want metrics: request counts by route and status, and a histogram of query time for the "
    "containers listing. We already expose Prometheus metrics on port 9102 with prometheus_client. How do I "
    "label by route template rather than raw path, so cardinality stays bounded?",
    "The histogram buckets default to 5 ms up to 10 s. Our p99 for the listing is 45 ms and the SLO in "
    "docs/slo.md says 99 percent of listing requests under 150 ms over 28 days. Which buckets would you choose, "
    "and how would you write the PromQL for the SLO burn rate over 1 hour and 6 hours for a multiwindow alert?",
    "One more thing from security review: the auditors want every write endpoint to require an API key with the "
    "scope containers:write, and reads to need containers:read. Keys are stored hashed with argon2 in the "
    "api_keys table, and lookups currently take 80 ms each because of the hashing. How can we keep the check "
    "fast without weakening the storage of keys?",
    "We went with a key prefix of 8 characters stored in clear as the lookup column, plus the argon2 hash of the "
    "whole key, and a 60-second in-process cache of verified keys. Priya asks whether the cache breaks key "
    "revocation, because the compliance team requires revoked keys to stop working within 5 minutes. Does it, "
    "and what would you change?",
    "Finally, can you write me a short checklist of everything we changed in this conversation that I should "
    "put in the release notes for shipyard 2.4.0? Please include the pool settings, the new index, the cursor "
    "format and its 400 error code, the arq job and its lock name, the image size, the migration Job, and the "
    "API key scopes, each in one line.",
)


class TurnLog(logging.Handler):
    """Keeps the proxy's log records of INFO and above, tagged with the turn being served when they were made."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.turn = -1
        self.records: list[tuple[int, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((self.turn, record))

    def lines(self, turn: int) -> list[str]:
        return [f"{record.levelname} {record.name} {record.getMessage()}" for tagged, record in self.records
                if tagged == turn]

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for turn, record in self.records:
            try:
                payload = json.loads(record.getMessage())
            except ValueError:
                continue
            if isinstance(payload, dict) and payload.get("event") == name:
                found.append({"turn": turn, **payload})
        return found

    def failures(self) -> list[dict[str, Any]]:
        """compaction_failed events (one per failed summary, background ones included), each with the error's
        message from the plain-text warning logged next to it in the same turn."""
        warnings = [(turn, record.getMessage()) for turn, record in self.records
                    if record.levelno >= logging.WARNING and record.getMessage().startswith(
                        ("compaction failed", "background summary failed"))]
        found = self.events("compaction_failed")
        for failure in found:
            match = next((message for turn, message in warnings if turn == failure["turn"]), None)
            if match is not None:
                warnings.remove((failure["turn"], match))
                failure["message"] = match
        return found


def user_turn(index: int) -> str:
    text = USER_TURNS[index % len(USER_TURNS)]
    return text if index < len(USER_TURNS) else f"(Follow-up {index}) {text}"


def is_context_error(exchange: Exchange) -> bool:
    """The server refused the prompt as too long: a 400 context_length_exceeded, or an empty 200 stream."""
    if exchange.error_code == "context_length_exceeded":
        return True
    error = (exchange.answer or {}).get("error")
    message = str(error.get("message", "")) if isinstance(error, dict) else ""
    return "exceed context window" in message or (exchange.streamed and exchange.status == 200 and not
                                                   exchange.answered)


def describe(exchange: Exchange, chat_turns: set[str]) -> dict[str, Any]:
    """One upstream request as the bench reports it: a chat turn (its last message is a user turn) or a summary."""
    error = (exchange.answer or {}).get("error")
    usage = exchange.usage or {}
    return {"kind": "chat" if is_chat_turn(exchange, chat_turns) else "summariser", "status": exchange.status,
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
            "max_tokens": exchange.requested_output, "messages": len(exchange.request.get("messages") or ()),
            "context_error": is_context_error(exchange), "finish_reason": exchange.finish_reason,
            "error": str(error.get("message", ""))[:300] if isinstance(error, dict) else None,
            "seconds": round(exchange.seconds, 2)}


def is_chat_turn(exchange: Exchange, chat_turns: set[str]) -> bool:
    # Told apart by content, not by the summariser prompt's wording, which is being rewritten.
    messages = exchange.request.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    return last.get("role") == "user" and last.get("content") in chat_turns


def proxy_config(upstream: str, n_ctx: int, window_config: str) -> dict[str, Any]:
    """What a new user writes: the upstream, and at most the model's window. Built-in prompts, default settings."""
    config: dict[str, Any] = {"upstream": {"base_url": upstream}}
    if SUMMARY_TIMEOUT is not None:  # a machine shared with other work needs longer than a new user would
        config["compaction"] = {"summarizer": {"timeout": SUMMARY_TIMEOUT}}
    if window_config == "n_ctx":
        config["models"] = {"default": {"context_window": n_ctx}}
    return config


async def ask(client: openai.AsyncOpenAI, model: str, history: list[dict[str, Any]],
              max_tokens: int = MAX_TOKENS) -> tuple[int, str, str, Any, str]:
    """(status, x-compaction, content, usage, error) of one non-streamed turn over the whole history."""
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=history, max_tokens=max_tokens, temperature=0, seed=SEED)  # type: ignore[arg-type]
    except openai.APIStatusError as error:
        return error.status_code, error.response.headers.get("x-compaction", "missing"), "", None, \
            error.response.text[:500]
    except openai.APIConnectionError as error:
        return 0, "missing", "", None, f"{type(error).__name__}: {error}"
    completion = raw.parse()
    content = completion.choices[0].message.content or "" if completion.choices else ""
    return raw.http_response.status_code, raw.headers.get("x-compaction", "missing"), content, completion.usage, ""


async def converse(server: LlamaServer, model_name: str, window_config: str, turns: int,
                   token_count: dict[str, int], max_tokens: int = MAX_TOKENS) -> Run:
    """One conversation: client -> proxy (built-in prompts) -> recorder -> llama.cpp server."""
    recorder = Recorder(server.url)
    turn_log = TurnLog()
    proxy_logger = logging.getLogger("proxy")
    proxy_logger.addHandler(turn_log)
    level = proxy_logger.level
    proxy_logger.setLevel(logging.INFO)
    started = time.monotonic()
    results: list[Turn] = []
    chat_turns = {user_turn(index) for index in range(turns)}
    try:
        async with recorder.serving() as upstream:
            config = proxy_config(upstream, server.n_ctx, window_config)
            proxy = await start_server(settings_from_mapping(config, env={}), host="127.0.0.1", port=0)
            try:
                # A new user's client: the SDK's default timeout, no retries so every refusal is seen once.
                client = async_client(proxy.url, api_key="sk-bench")
                history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
                for index in range(turns):
                    turn_log.turn = index
                    text = user_turn(index)
                    history.append({"role": "user", "content": text})
                    seen = len(recorder.exchanges)
                    began = time.monotonic()
                    status, compaction, content, usage, error = await ask(client, model_name, history, max_tokens)
                    seconds = time.monotonic() - began
                    answered = status == 200 and bool(content.strip())
                    results.append(Turn(
                        index, status, answered, compaction, getattr(usage, "prompt_tokens", None),
                        getattr(usage, "completion_tokens", None), round(seconds, 2), token_count.get(text, 0),
                        len(history), content, error,
                        [describe(exchange, chat_turns) for exchange in recorder.exchanges[seen:] if exchange.is_chat],
                        turn_log.lines(index)))
                    mark = "ok " if answered else "FAIL"
                    print(f"  turn {index:2d} {mark} {status} x-compaction={compaction:9s} "
                          f"prompt={getattr(usage, 'prompt_tokens', '-')} {seconds:5.1f}s "
                          f"upstream={[(e['kind'][0], e['status']) for e in results[-1].upstream_requests]}",
                          flush=True)
                    # A stateless client keeps its history whatever happened; a failed turn gets no reply to keep,
                    # and the user asks the next question anyway.
                    history.append({"role": "assistant", "content": content or "(no answer)"})
                await client.close()
            finally:
                await proxy.stop()
    finally:
        proxy_logger.removeHandler(turn_log)
        proxy_logger.setLevel(level)
    chats = [exchange for exchange in recorder.exchanges if exchange.is_chat]
    context_errors = [exchange for exchange in chats if is_context_error(exchange)]
    chat_errors = sum(is_chat_turn(exchange, chat_turns) for exchange in context_errors)
    return Run(model_name, server.n_ctx, window_config, proxy_config("<recorder>", server.n_ctx, window_config),
               results, time.monotonic() - started, turn_log.events("compaction"), turn_log.failures(),
               len(context_errors), chat_errors, len(context_errors) - chat_errors,
               sum(not is_chat_turn(exchange, chat_turns) for exchange in chats))


def model_path(name: str) -> Path:
    if name == "smollm2":
        return locate_model(os.environ)
    return fetch_model(name, progress=lambda message: print(message, file=sys.stderr, flush=True))


def count_tokens(server: LlamaServer, texts: Sequence[str]) -> dict[str, int]:
    """Each user turn's tokens by the served model's own tokenizer (content only, no chat framing)."""
    import urllib.request

    counts: dict[str, int] = {}
    for text in texts:
        request = urllib.request.Request(f"{server.url}/extras/tokenize/count", json.dumps({"input": text}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            counts[text] = int(json.loads(response.read())["count"])
    return counts


def builtin_framing_tokens(server: LlamaServer) -> int:
    """Tokens of the built-in summariser prompt (empty transcript) and instruction, by the served tokenizer."""
    templates = default_templates()
    text = templates.compaction_prompt("") + "\n" + templates.compaction_instruction()
    return count_tokens(server, [text])[text]


async def bench(models: Sequence[str], contexts: Sequence[int], windows: Sequence[str], turns: int,
                json_path: Path | None = None) -> list[Run]:
    python = find_llama_python(os.environ)
    runs: list[Run] = []
    for name in models:
        path = model_path(name)
        for n_ctx in contexts:
            log_path = LOG_DIR / f"small_windows-{name}-{n_ctx}.log"
            print(f"{name} n_ctx {n_ctx}: starting the model server (log {log_path})", flush=True)
            server = start_llama_server(python, path, log_path=log_path, n_ctx=n_ctx)
            try:
                counts = count_tokens(server, [user_turn(index) for index in range(turns)])
                framing = builtin_framing_tokens(server)
                print(f"  built-in summariser prompt + instruction: {framing} tokens", flush=True)
                for window in windows:
                    print(f"{name} n_ctx {n_ctx} window configured: {window}", flush=True)
                    run = await converse(server, name, window, turns, counts)
                    run.framing_tokens = framing
                    runs.append(run)
                    # After every run: a slow model's later runs can be cut short without losing the earlier ones.
                    if json_path is not None:
                        write_json(json_path, runs)
                    print(f"  -> {run.answered}/{turns} answered in {run.seconds:.0f}s", flush=True)
            finally:
                server.stop()
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.small_windows", description=__doc__)
    parser.add_argument("--models", default="smollm2,qwen-0.5b", help="comma-separated: smollm2, qwen-0.5b, ...")
    parser.add_argument("--n-ctx", default="1024,2048", help="comma-separated server context sizes")
    parser.add_argument("--windows", default=",".join(WINDOW_CONFIGS),
                        help="comma-separated: none (no context_window configured), n_ctx (configured = n_ctx)")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--summary-timeout", type=float, help="compaction.summarizer.timeout (default: the proxy's)")
    parser.add_argument("--json", type=Path, help="write every run, turn by turn, to this file")
    options = parser.parse_args(argv)
    # The proxy's own loggers at INFO, as the CLI configures them; the compaction lines are kept per turn.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    global SUMMARY_TIMEOUT
    SUMMARY_TIMEOUT = options.summary_timeout
    windows = [window for window in options.windows.split(",") if window]
    unknown = set(windows) - set(WINDOW_CONFIGS)
    if unknown:
        parser.error(f"unknown window config(s) {sorted(unknown)}; known: {', '.join(WINDOW_CONFIGS)}")
    runs = asyncio.run(bench([name for name in options.models.split(",") if name],
                             [int(value) for value in options.n_ctx.split(",") if value], windows, options.turns,
                             options.json))
    print()
    print(table(runs))
    print()
    print(failure_report(runs))
    if options.json:
        print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
