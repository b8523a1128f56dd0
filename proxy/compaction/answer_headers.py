"""What an answer's headers say compaction did (x-compaction and its company), and the request's journal point."""

from __future__ import annotations

import json
import logging
from typing import Generic

from proxy.compaction import edit_report
from proxy.compaction.journey import C, Journey
from proxy.compaction.journey_tokens import JourneyTokens
from proxy.compaction.recorder import Recorder
from proxy.config import Settings
from proxy.dialects.dialect import Dialect
from proxy.headers import (
    CLEARED,
    CLEARED_TOKENS,
    COMPACTION,
    ELIDED,
    PAIR_SUMMARIES,
    REASON,
    TOKENS_AFTER,
    TOKENS_BEFORE,
)
from proxy.metrics import Metrics
from proxy.request_context import current_request_id
from proxy.upstream.attempt import Attempt

log = logging.getLogger("proxy.pipeline")


class AnswerHeaders(Generic[C]):
    """The headers of one pipeline's answers."""

    def __init__(self, settings: Settings, dialect: Dialect[C], metrics: Metrics, recorder: Recorder,
                 tokens: JourneyTokens) -> None:
        self._settings = settings
        self._dialect = dialect
        self._metrics = metrics
        self._recorder = recorder
        self._tokens = tokens

    def of(self, journey: Journey[C]) -> dict[str, str]:
        """A journey's: what it did, the tokens before and after, what the stages and elision did; journaled."""
        headers = {COMPACTION: "failed" if journey.failed else journey.trigger,
                   **self.edits_told(journey.call, journey.trigger, failed=journey.failed)}
        before = journey.tokens_before  # the request as the client sent it: counted once, if it is asked for
        if journey.conversation.record is not None or journey.elided:
            before = before or self._tokens.original(journey)
            headers[TOKENS_BEFORE] = str(before)
            headers[TOKENS_AFTER] = str(self._tokens.estimate(journey))
        if journey.elided:
            headers[ELIDED] = str(journey.elided)
        if journey.cleared and journey.cleared.results:  # (told once per answer, so counted here)
            headers[CLEARED], headers[CLEARED_TOKENS] = str(journey.cleared.results), str(journey.cleared.freed)
            self._metrics.labelled(self._metrics.tool_result_tokens_freed, "cleared").inc(journey.cleared.freed)
        if journey.swapped:
            headers[PAIR_SUMMARIES] = str(journey.swapped.applied)
        if journey.reason is not None:
            headers[REASON] = journey.reason
        self._journal(journey, headers, before)
        return headers

    def untouched(self, call: C, attempt: Attempt) -> dict[str, str]:
        """A request forwarded as it came; one the proxy could not help says why."""
        reason = self._dialect.left_alone(call) if self._settings.compaction.enabled else None
        if reason is None:
            return {COMPACTION: "none", **self.edits_told(call, "off", failed=False)}
        if attempt.overflow:
            self._metrics.labelled(self._metrics.overflow_errors, "first").inc()
            log.warning(json.dumps({"event": "compaction_not_applicable", "request_id": current_request_id(),
                                    "reason": reason, "route": self._dialect.name}))
        return {COMPACTION: "not-applicable", REASON: reason}

    def edits_told(self, call: C, trigger: str, *, failed: bool) -> dict[str, str]:
        """What the client's context edits did (`trigger` "off": the proxy may not compact this request)."""
        outcomes = dict(call.edit_outcomes)
        if call.compact_threshold is not None or call.compaction_requested:
            outcomes[edit_report.COMPACTION] = edit_report.compaction_outcome(trigger, failed)
        return edit_report.report_edits(outcomes, self._dialect.name, self._metrics)

    def _journal(self, journey: Journey[C], headers: dict[str, str], before: int) -> None:
        """The request in the journal, and x-compaction-id on its answer (see Recorder.request)."""
        if (origin := journey.origin) is None:
            return
        record, freed = journey.conversation.record, journey.cleared.freed if journey.cleared else 0
        summary = (journey.conversation.namespace, record.prefix_hash) if record is not None else None
        self._recorder.safely("journal_request", lambda: self._recorder.request(
            origin, headers, summary=summary, limits=journey.limits, freed=freed,
            failure=journey.failure if journey.failed else None,
            tokens_before=before or self._tokens.original(journey),
            tokens_after=self._tokens.estimate(journey)))
