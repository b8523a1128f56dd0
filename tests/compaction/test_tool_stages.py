"""proxy.compaction.tool_stages: the stage-2 policy the settings give (the stages themselves, through the proxy, are
tests/e2e/test_tool_results_e2e.py)."""

from __future__ import annotations

import pytest

from proxy.compaction.pair_summaries import PairSummaries
from proxy.compaction.runtime import load_templates
from proxy.compaction.tool_stages import ToolStages, _Reported, pair_policy
from proxy.config import settings_from_mapping
from proxy.core.calibration import Calibration
from proxy.core.tokens import TokenCounter
from proxy.metrics import Metrics
from proxy.store.store import MemoryStore
from proxy.summarizer import tool_call


@pytest.mark.parametrize(("summarizer_timeout", "pairs"), [
    (None, {}),
    (900.0, {"batch_size": 4, "keep_recent": 2, "cutoff": 0.1, "max_summary_tokens": 64}),
], ids=["defaults", "set"])
def test_a_batch_may_take_as_long_as_a_summary(summarizer_timeout: float | None, pairs: dict[str, object]) -> None:
    summarizer = {} if summarizer_timeout is None else {"timeout": summarizer_timeout}
    settings = settings_from_mapping({"upstream": {"base_url": "http://127.0.0.1:9/v1"}, "compaction": {
        "summarizer": summarizer, "tool_results": {"summarize_pairs": {"enabled": True, **pairs}}}}, env={})
    policy = pair_policy(settings)
    assert policy.timeout == settings.compaction.summarizer.timeout
    assert {key: getattr(policy, key) for key in pairs} == pairs and policy.enabled


@pytest.mark.parametrize("text", ["E   ReconcileError: E1464 dup\nok", "PORT=8080\nHOST=a", "nothing to say", ""])
def test_what_a_result_reported_is_remembered_as_evidence_reads_it(text: str) -> None:
    remembered = _Reported(size=2)
    assert remembered(text) == remembered("".join(list(text))) == tool_call.reported(text)  # a fresh copy too


def test_the_memory_of_reports_is_bounded_oldest_first() -> None:
    remembered = _Reported(size=2)
    for text in ("error: one", "error: two", "error: one", "error: three"):
        remembered(text)
    assert list(remembered._known) == [hash("error: one"), hash("error: three")]  # "two" was the oldest


def test_stage_two_under_each_models_settings_is_made_once_whatever_the_model_names() -> None:
    """A model with tool-result settings of its own gets stage 2 under them, every other model the global ones;
    each is built once, however many model names clients send."""
    settings = settings_from_mapping({"upstream": {"base_url": "http://127.0.0.1:9/v1"}, "compaction": {
        "tool_results": {"summarize_pairs": {"enabled": True, "keep_recent": 6}}},
        "models": {"own": {"tool_results": {"clear": {"enabled": True},
                                            "summarize_pairs": {"enabled": True, "keep_recent": 3}}}}}, env={})
    counter = TokenCounter()
    pairs = PairSummaries(MemoryStore(8, 60.0), lambda model: None, load_templates(settings), counter, Metrics(),
                          pair_policy(settings))
    stages = ToolStages(settings, counter, Calibration(), pairs)
    views = {model: stages._pairs_for(model) for model in ("own", *(f"model-{n}" for n in range(50)))}
    assert all(views[f"model-{n}"] is views["model-0"] for n in range(50))
    assert views["model-0"]._policy == stages._pairs_for("other")._policy
    assert views["model-0"]._policy.keep_recent in (1, 6) and views["own"]._policy.keep_recent == 1
    assert views["own"] is not views["model-0"]
    assert stages._pairs_for("own") is views["own"] and len(stages._pair_views) == 2
