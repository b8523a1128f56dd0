"""What a request's context edits did, told in a header, a log line and a metric."""

from __future__ import annotations

import json
import logging

import pytest

from proxy.compaction.edit_report import compaction_outcome, report_edits
from proxy.metrics import Metrics


@pytest.mark.parametrize(("trigger", "failed", "outcome"), [
    ("proactive", False, "applied"), ("reactive", False, "applied"), ("requested", False, "applied"),
    ("prepared", False, "applied"),
    ("reused", False, "reused"), ("none", False, "not_triggered"), ("off", False, "off"),
    ("proactive", True, "failed"), ("none", True, "failed")])
def test_what_became_of_an_asked_compaction(trigger: str, failed: bool, outcome: str) -> None:
    assert compaction_outcome(trigger, failed) == outcome


def sample(metrics: Metrics, edit: str, outcome: str) -> float | None:
    return metrics.registry.get_sample_value("compaction_proxy_context_edits_total",
                                             {"edit": edit, "outcome": outcome})


def test_each_outcome_is_counted_logged_and_told(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    outcomes = {"clear_tool_uses_20250919": "applied", "compaction": "failed"}
    with caplog.at_level(logging.INFO, logger="proxy.pipeline"):
        headers = report_edits(outcomes, "messages", metrics)
    assert headers == {"x-compaction-edits": "clear_tool_uses_20250919=applied, compaction=failed"}
    assert sample(metrics, "clear_tool_uses_20250919", "applied") == 1.0
    assert sample(metrics, "compaction", "failed") == 1.0
    [record] = caplog.records
    assert record.levelno == logging.WARNING  # something failed
    assert json.loads(record.getMessage())["edits"] == outcomes


def test_nothing_to_tell_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="proxy.pipeline"):
        assert report_edits({}, "messages", Metrics()) == {}
    assert caplog.records == []


def test_words_outside_the_proxys_own_are_not_told() -> None:
    metrics = Metrics()
    headers = report_edits({"Evil\r\nHeader": "applied", "clear": "x" * 100, "compaction": "off"}, "chat", metrics)
    assert headers == {"x-compaction-edits": "compaction=off"}
    assert sample(metrics, "Evil\r\nHeader", "applied") is None
