"""Prometheus metrics, one registry per application (no process-wide singletons), or shared by worker processes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

CONTENT_TYPE = CONTENT_TYPE_LATEST
# prometheus-client's own switch: set, every metric value lives in a file of this directory, one per process.
MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)


def multiprocess_dir() -> str | None:
    """The directory worker processes share their metrics through (set by `--workers`), or None."""
    return os.environ.get(MULTIPROCESS_DIR_VARIABLE) or None


class Metrics:
    """Every metric of the proxy. With `--workers N` the values are kept in files shared by the workers
    (prometheus-client's multiprocess mode), so a scrape answered by any worker reports the sum of all of them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        shared = multiprocess_dir()
        if shared is None:
            self._exposed = self.registry
        else:
            # The metrics below still register in self.registry, but their values are read back from the files:
            # exposing self.registry would show this worker's share only.
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=shared)  # type: ignore[no-untyped-call]
        self.chat_requests = Counter(
            "compaction_proxy_chat_requests", "Chat completions by what compaction did (x-compaction)",
            ["compaction"], registry=self.registry)
        self.compactions = Counter(
            "compaction_proxy_compactions", "Summaries built, by trigger", ["trigger"], registry=self.registry)
        self.summarizer_calls = Counter(
            "compaction_proxy_summarizer_calls", "Summariser model calls, by result", ["result"],
            registry=self.registry)
        self.summarizer_tokens = Counter(
            "compaction_proxy_summarizer_tokens", "Tokens billed to summaries", ["kind"], registry=self.registry)
        self.compaction_failures = Counter(
            "compaction_proxy_compaction_failures", "Summaries that could not be built, by trigger and error",
            ["trigger", "error"], registry=self.registry)
        self.compaction_seconds = Histogram(
            "compaction_proxy_compaction_seconds", "Time to build one summary", registry=self.registry,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.overhead_seconds = Histogram(
            "compaction_proxy_overhead_seconds",
            "The proxy's own time on a chat request before forwarding it (fingerprint, reuse lookup, planning; "
            "a summary built on the way excluded)", registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
        self.store_seconds = Histogram(
            "compaction_proxy_store_seconds", "Time of one summary store operation, by operation", ["operation"],
            registry=self.registry, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2))
        self.store_errors = Counter(
            "compaction_proxy_store_errors", "Summary store operations that failed", ["operation"],
            registry=self.registry)
        self.upstream_errors = Counter(
            "compaction_proxy_upstream_errors", "Requests the upstream could not answer", ["kind"],
            registry=self.registry)

        self.requests = Counter(
            "compaction_proxy_requests", "Requests answered, by route, status and what compaction did",
            ["route", "status", "compaction"], registry=self.registry)
        self.slow_readers_cut = Counter(
            "compaction_proxy_slow_readers_cut", "Streams cut because the client took no bytes for "
            "server.write_timeout", registry=self.registry)
        # Across workers: the sum over the workers alive (a dead worker's files are dropped by the supervisor).
        self.open_streams = Gauge(
            "compaction_proxy_open_streams", "Streamed answers being relayed right now", registry=self.registry,
            multiprocess_mode="livesum")
        self.reuse_lookups = Counter(
            "compaction_proxy_reuse_lookups",
            "Stored-summary lookups, by result (hit, miss, or prepared: a summary made ahead spliced in)", ["result"],
            registry=self.registry)
        self.overflow_errors = Counter(
            "compaction_proxy_overflow_errors", "Context-overflow answers seen from the upstream, by attempt",
            ["attempt"], registry=self.registry)
        self.compaction_tokens = Histogram(
            "compaction_proxy_compaction_tokens", "Tokens of the summarised prefix before and after a compaction",
            ["stage"], registry=self.registry,
            buckets=(256, 1024, 4096, 16384, 65536, 262144, 1048576))
        self.upstream_seconds = Histogram(
            "compaction_proxy_upstream_response_seconds", "Time until the upstream's response headers arrived",
            registry=self.registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))

        self.shadow_decisions = Counter(
            "compaction_proxy_shadow_decisions", "What compaction would have done in shadow mode", ["decision"],
            registry=self.registry)
        self.shadow_saved_tokens = Counter(
            "compaction_proxy_shadow_saved_tokens", "Prompt tokens compaction would have saved in shadow mode",
            registry=self.registry)

        self.tool_result_tokens_freed = Counter(
            "compaction_proxy_tool_result_tokens_freed", "Prompt tokens the tool-result stages freed in requests "
            "forwarded, by stage: cleared (stage 1), pair_summaries (stage 2)", ["stage"], registry=self.registry)
        self.pair_summaries = Counter(
            "compaction_proxy_pair_summaries", "Tool-round summaries (stage 2), in rounds, by outcome: made (stored), "
            "applied (swapped into a request), mismatch (a stored summary whose round changed: skipped), failed",
            ["outcome"], registry=self.registry)
        self.pair_summary_calls = Counter(
            "compaction_proxy_pair_summary_calls", "Summariser calls for tool-round summaries, by result (ok, error)",
            ["result"], registry=self.registry)
        self.pair_summary_tokens = Counter(
            "compaction_proxy_pair_summary_tokens", "Tokens billed to tool-round summaries, by kind (prompt, "
            "completion); whole-history summaries are counted in summarizer_tokens", ["kind"], registry=self.registry)
        self.context_edits = Counter(
            "compaction_proxy_context_edits", "Context-management edits clients asked of the proxy (Anthropic's "
            "clearing edits; `compaction` for a compaction asked for), by edit and outcome", ["edit", "outcome"],
            registry=self.registry)

        self.config_reloads = Counter(
            "compaction_proxy_config_reloads", "Config reloads (SIGHUP or a changed file), by result: applied, "
            "unchanged or refused", ["result"], registry=self.registry)

    def labelled(self, metric: _Metric, *values: str) -> _Metric:
        """`metric.labels(*values)`, looked up once: a label's child is the same object every time, and the
        lookup (values checked, a lock taken) costs a request more than the increment does. Label values are
        bounded sets (routes, statuses, outcomes), so the cache is too."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def upstream_errors_counter(self) -> Callable[[str], None]:
        """A callback for the upstream client: one failure of a kind ("timeout", "unreachable") counted."""
        return lambda kind: self.labelled(self.upstream_errors, kind).inc()

    def upstream_latency(self) -> Callable[[float], None]:
        """A callback for the upstream client: seconds until one response's headers arrived."""
        return self.upstream_seconds.observe

    def store_latency(self) -> Callable[[str, float], None]:
        """A callback for the timed store: one operation's seconds, by operation."""
        return lambda operation, seconds: self.labelled(self.store_seconds, operation).observe(seconds)

    def store_errors_counter(self) -> Callable[[str], None]:
        """A callback for the summary store and flights: one failed operation ("lookup", "put", "acquire") counted."""
        return lambda operation: self.labelled(self.store_errors, operation).inc()

    def summary(self) -> dict[str, Any]:
        """The few counters the dashboard shows, summed over labels (and over workers, as /metrics is)."""
        found: dict[str, Any] = {"requests": 0, "compactions": {}, "failures": 0,
                                 "summarizer_seconds": {"count": 0, "sum": 0.0}}
        for family in self._exposed.collect():
            for sample in family.samples:
                name, value = sample.name, sample.value
                if name == "compaction_proxy_requests_total":
                    found["requests"] += int(value)
                elif name == "compaction_proxy_compactions_total":
                    trigger = sample.labels.get("trigger", "")
                    found["compactions"][trigger] = found["compactions"].get(trigger, 0) + int(value)
                elif name == "compaction_proxy_compaction_failures_total":
                    found["failures"] += int(value)
                elif name == "compaction_proxy_compaction_seconds_count":
                    found["summarizer_seconds"]["count"] += int(value)
                elif name == "compaction_proxy_compaction_seconds_sum":
                    found["summarizer_seconds"]["sum"] += float(value)
        return found

    def exposition(self) -> bytes:
        return generate_latest(self._exposed)
