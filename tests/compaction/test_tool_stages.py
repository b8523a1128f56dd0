"""proxy.compaction.tool_stages: the stage-2 policy the settings give (the stages themselves, through the proxy, are
tests/e2e/test_tool_results_e2e.py)."""

from __future__ import annotations

import pytest

from proxy.compaction.tool_stages import pair_policy
from proxy.config import settings_from_mapping


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
