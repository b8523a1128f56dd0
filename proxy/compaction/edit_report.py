"""What a request's context-management edits did, told the three ways an operator or a client looks: the
x-compaction-edits header, one log line and the context_edits metric (the body says it too, in the API's shape)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping

from proxy.headers import EDITS
from proxy.metrics import Metrics
from proxy.request_context import current_request_id

log = logging.getLogger("proxy.pipeline")
# The client's own compaction request (a compaction edit or entry), beside the clearing edits by their types.
COMPACTION = "compaction"
# Labels and header values come from the proxy's own words; anything else is not reported (bounded label sets).
_WORD = re.compile(r"[a-z0-9_]{1,40}")


def compaction_outcome(trigger: str, failed: bool) -> str:
    """What became of a compaction the client asked for past its threshold ("off": the proxy may not compact the
    request, its compaction or its mode off)."""
    if failed:
        return "failed"
    if trigger == "off":
        return "off"
    return "applied" if trigger in ("proactive", "reactive", "forced", "requested", "prepared") else \
        "reused" if trigger == "reused" else "not_triggered"


def report_edits(outcomes: Mapping[str, str], route: str, metrics: Metrics) -> dict[str, str]:
    """Count and log `outcomes` (edit → outcome); the header that tells the client."""
    told = {edit: outcome for edit, outcome in outcomes.items() if _WORD.fullmatch(edit) and _WORD.fullmatch(outcome)}
    if not told:
        return {}
    for edit, outcome in told.items():
        metrics.labelled(metrics.context_edits, edit, outcome).inc()
    level = logging.WARNING if "failed" in told.values() else logging.INFO
    log.log(level, json.dumps({"event": "context_edits", "request_id": current_request_id(), "route": route,
                               "edits": told}))
    return {EDITS: ", ".join(f"{edit}={outcome}" for edit, outcome in told.items())}
