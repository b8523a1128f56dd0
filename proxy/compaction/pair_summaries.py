"""Stage 2: old tool rounds summarised in the background, in batches, and swapped in while they match exactly."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.backoff import Backoff
from proxy.core.elision import elide_text
from proxy.core.messages import Message, content_text, valid_text, with_text
from proxy.core.pair_policy import PairSummaryPolicy, Swapped
from proxy.core.pair_reply import BadReply, parsed_summaries
from proxy.core.tokens import TokenCounter
from proxy.core.tool_rounds import (
    Swap,
    ToolRound,
    described,
    round_results,
    swapped_results,
    textual,
    tool_rounds,
    with_round_summaries,
)
from proxy.core.usage import token_count
from proxy.metrics import Metrics
from proxy.request_context import current_request_id
from proxy.store.single_flight import SingleFlight
from proxy.store.store import CompactedPrefix, SummaryStore
from proxy.summarizer.summarizer import ChatModel
from proxy.summarizer.templates import PAIR_SUMMARIES, Templates
from proxy.summarizer.tool_call import reported

log = logging.getLogger("proxy.pair_summaries")

# (summariser model name, client headers, output token limit, the part of it that must fit whole) -> a model to call.
# Its requests must go out plain (structured_output "off"): the reply is a JSON list, not the summary's schema.
ModelFactory = Callable[[str, Mapping[str, str], int, int], ChatModel]
# Round summaries share the summary store: each is a record whose prefix_hash is this and the round's key.
RECORD_PREFIX = "round:"
STAGE = "pair_summaries"  # the stage label of compaction_proxy_tool_result_tokens_freed
_REMEMBERED = 10_000  # rounds whose fate this process remembers, so most requests read nothing from the store
_LIST_TOKENS = 8  # what one summary adds to the reply's JSON list besides its text: quotes, a comma, escapes
_CHARS_PER_TOKEN = 16  # a stored summary longer than this per token allowed is refused before it is counted
_ARGUMENT_TOKENS = 512  # a call's arguments (a whole file written, say) are shown to the summariser up to this
_CUT = " …"


@dataclass(frozen=True)
class _Known:
    """What this process knows of a round: the fingerprint its summary was made of and the two texts it is sent
    as (first result, pointer); no texts when it was tried and left whole (its summary was no shorter)."""

    fingerprint: str
    texts: tuple[str, str] | None = None


@dataclass(frozen=True)
class _Job:
    """One batch to summarise: a conversation's old rounds not known to be summarised, oldest first."""

    namespace: str
    flight: str
    rounds: tuple[ToolRound, ...]
    messages: tuple[Message, ...]
    window: int
    model: str
    headers: Mapping[str, str]


class PairSummaries:
    """Summaries of old tool rounds: made in the background after a response, applied to later requests."""

    def __init__(self, store: SummaryStore, model_factory: ModelFactory, templates: Templates,
                 counter: TokenCounter, metrics: Metrics, policy: PairSummaryPolicy) -> None:
        self._store = store
        self._model_factory = model_factory
        self._templates = templates
        self._counter = counter
        self._metrics = metrics
        self._policy = policy
        self._flights = SingleFlight()
        self._tasks: set[asyncio.Task[int]] = set()
        self._backoff = Backoff()
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()

    def under(self, policy: PairSummaryPolicy) -> PairSummaries:
        """These summaries under another policy (a model's own settings), sharing with these what is known, what
        is running and what is backed off; close() on either cancels the batches of both."""
        if policy == self._policy:
            return self
        other = copy.copy(self)
        other._policy = policy
        return other

    async def applied(self, messages: list[Message], namespace: str, *,
                      within: Collection[int] | None = None) -> Swapped:
        """`messages` (the client's own, as read) with each old round whose stored summary was made of exactly
        these calls and results swapped for it; rounds that changed are left whole and counted as mismatches.
        With `within`, only rounds whose results all stand at those positions (the ones clearing replaces)."""
        if not self._policy.enabled:
            return Swapped(messages)
        rounds = self._candidates(messages)
        if within is not None:
            where = frozenset(within)
            rounds = [tool_round for tool_round in rounds if where.issuperset(tool_round.result_indices)]
        known = await self._lookup(namespace, rounds) if rounds else {}
        swaps: list[Swap] = []
        mismatches = 0
        for tool_round in rounds:
            entry = known.get(tool_round.key)
            if entry is None or entry.texts is None:
                continue
            if entry.fingerprint != tool_round.fingerprint:
                mismatches += 1
                continue
            if self._saving(messages, tool_round, entry.texts) > 0:  # a hostile store's long "summary" is no saving
                swaps.append((tool_round, *entry.texts))
        self._count(applied=len(swaps), mismatch=mismatches)
        if not swaps:
            return Swapped(messages, mismatches=mismatches)
        indices = frozenset(index for tool_round, _, _ in swaps for index in tool_round.result_indices)
        sent = _with_reports(messages, with_round_summaries(messages, swaps), indices)
        freed = sum(self._counter.count_message(messages[index]) - self._counter.count_message(sent[index])
                    for index in indices)
        self._metrics.labelled(self._metrics.tool_result_tokens_freed, STAGE).inc(max(freed, 0))
        return Swapped(sent, len(swaps), freed, mismatches, indices)

    def start(self, messages: list[Message], namespace: str, *, window: int, model: str,
              headers: Mapping[str, str], passed: Collection[str] = ()) -> asyncio.Task[Any] | None:
        """After a response, given the client's messages (forwarded ones are recognised, not summarised again):
        when the old rounds not yet summarised hold more than the cutoff's share of `window`, a background task
        summarising the oldest of them in one summariser call; the running one when this conversation has one
        already; None when nothing is due. Rounds with a call id in `passed` (cleared without a summary: one
        arriving now would rewrite a prefix already sent) are left. The task never raises: it answers the rounds
        it stored."""
        if not self._policy.enabled or window <= 0:
            return None
        rounds = tool_rounds(messages, self._counter.count_message)
        if not rounds:
            return None
        flight = f"{namespace}:{rounds[0].key}"  # one batch at a time per conversation
        if (running := self._flights.running(flight)) is not None:
            return running
        left = frozenset(passed)
        due = [tool_round for tool_round in self._candidates(messages, rounds)
               if not self._settled(self._recall(namespace, tool_round.key), messages, tool_round)
               and left.isdisjoint(tool_round.call_ids)]
        if not self._due(due, window):
            return None
        decision = self._backoff.decide(flight)
        if not decision.allowed:
            log.info(json.dumps({"event": "pair_summaries_skipped", "request_id": current_request_id(),
                                 "reason": "backoff", "failures": decision.level}))
            return None
        job = _Job(namespace, flight, tuple(due), tuple(messages), window, model, dict(headers))
        task = self._flights.start(flight, lambda: self._run(job))
        if task not in self._tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Cancel the batches being summarised, and wait until they have stopped."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- which rounds, and what is known of them -------------------------------------------------------------

    def _candidates(self, messages: Sequence[Message], rounds: Sequence[ToolRound] | None = None) -> list[ToolRound]:
        """The old rounds worth a summary, less any whose key another round shares (a client that reuses call ids):
        one record per key could not tell them apart, and each summary would overwrite the other's."""
        rounds = tool_rounds(messages, self._counter.count_message) if rounds is None else rounds
        keys = Counter(tool_round.key for tool_round in rounds)
        return [tool_round for tool_round in self._policy.old(rounds)
                if keys[tool_round.key] == 1 and self._worth(messages, tool_round)]

    def _worth(self, messages: Sequence[Message], tool_round: ToolRound) -> bool:
        """Big enough to gain from a summary, and text only: an image in a result would be lost with it."""
        return (tool_round.result_tokens or 0) >= self._policy.min_result_tokens and textual(messages, tool_round)

    def _due(self, rounds: Sequence[ToolRound], window: int) -> bool:
        return sum(tool_round.result_tokens or 0 for tool_round in rounds) > self._policy.cutoff * window

    @staticmethod
    def _settled(entry: _Known | None, messages: Sequence[Message], tool_round: ToolRound) -> bool:
        """Summarised or tried already; or swapped already (messages that were forwarded, not the client's)."""
        if entry is None:
            return False
        return entry.fingerprint == tool_round.fingerprint or (
            entry.texts is not None and messages[tool_round.result_indices[0]].get("content") == entry.texts[0])

    def _recall(self, namespace: str, key: str) -> _Known | None:
        entry = self._known.get((namespace, key))
        if entry is not None:
            self._known.move_to_end((namespace, key))
        return entry

    def _remember(self, namespace: str, key: str, entry: _Known) -> None:
        self._known[(namespace, key)] = entry
        self._known.move_to_end((namespace, key))
        while len(self._known) > _REMEMBERED:
            self._known.popitem(last=False)

    async def _lookup(self, namespace: str, rounds: Sequence[ToolRound]) -> dict[str, _Known]:
        """What is known of each round (by key): remembered, else read from the store, at most max_lookups reads,
        all at once. A store that fails is counted and read as holding nothing."""
        found: dict[str, _Known] = {}
        asked: list[ToolRound] = []
        for tool_round in rounds:
            entry = self._recall(namespace, tool_round.key)
            if entry is not None and (entry.fingerprint == tool_round.fingerprint
                                      or len(asked) >= self._policy.max_lookups):
                found[tool_round.key] = entry
            elif len(asked) < self._policy.max_lookups:
                asked.append(tool_round)
        records = await asyncio.gather(*(self._store.get(namespace, RECORD_PREFIX + tool_round.key)
                                         for tool_round in asked), return_exceptions=True)
        failures = 0
        for tool_round, record in zip(asked, records, strict=True):
            failures += isinstance(record, BaseException)
            entry = self._decoded(record, tool_round)
            if entry is not None and entry.fingerprint == tool_round.fingerprint:
                self._remember(namespace, tool_round.key, entry)
            entry = entry or self._recall(namespace, tool_round.key)
            if entry is not None:
                found[tool_round.key] = entry
        if failures:
            log.warning(json.dumps({"event": "pair_summaries_store_failed", "request_id": current_request_id(),
                                    "operation": "lookup", "failures": failures}))
            self._metrics.store_errors.labels("lookup").inc(failures)
        return found

    def _decoded(self, record: object, tool_round: ToolRound) -> _Known | None:
        """A stored summary of the round, checked: the store may be broken, or written by someone hostile."""
        if not isinstance(record, CompactedPrefix) or record.prefix_hash != RECORD_PREFIX + tool_round.key \
                or len(record.replacement) != 1:
            return None
        summary, fingerprint = record.replacement[0].get("content"), record.replacement[0].get("fingerprint")
        limit = self._policy.max_summary_tokens
        if not isinstance(summary, str) or not isinstance(fingerprint, str) or not summary.strip() \
                or len(summary) > limit * _CHARS_PER_TOKEN or self._counter.count_text(summary) > limit:
            return None
        return _Known(fingerprint, self._texts(tool_round, valid_text(summary)))

    def _texts(self, tool_round: ToolRound, summary: str) -> tuple[str, str]:
        """What the round's first result says once summarised, and what each of its other results says."""
        names = list(tool_round.tools)
        return self._render("result", names=names, summary=summary), self._render("pointer", names=names)

    def _render(self, part: str, **variables: Any) -> str:
        return self._templates.render(PAIR_SUMMARIES, **{"part": part, "names": [], "summary": "", "rounds": [],
                                                         "limit": 0, **variables})

    def _saving(self, messages: Sequence[Message], tool_round: ToolRound, texts: tuple[str, str]) -> int:
        """The tokens swapping the round's results for `texts` saves (negative when it costs)."""
        before = sum(self._counter.count_each(round_results(messages, tool_round)))
        return before - sum(self._counter.count_each(swapped_results(messages, tool_round, *texts)))

    # --- the background batch ---------------------------------------------------------------------------------

    async def _run(self, job: _Job) -> int:
        """One batch, start to end: the rounds summarised. Whatever fails stays in here: logged, counted, and
        the conversation backed off (its next attempts skipped: 1, then 3, 7, ...)."""
        started = time.monotonic()
        batch: list[ToolRound] = []
        try:
            async with asyncio.timeout(self._policy.timeout):
                known = await self._lookup(job.namespace, job.rounds)
                left = [tool_round for tool_round in job.rounds
                        if not self._settled(known.get(tool_round.key), job.messages, tool_round)]
                if not self._due(left, job.window):
                    return 0  # summarised elsewhere (another replica, an earlier turn) since
                batch = self._batch(job, left)
                summaries, usage = await self._ask(job, batch)
                made = await self._keep(job, batch, summaries, usage, started)
        except Exception as error:  # noqa: BLE001  # a background task has nobody to raise to: logged, counted
            self._backoff.failed(job.flight)
            self._failed(job, batch, error, started)
            return 0
        self._backoff.succeeded(job.flight)
        return made

    def _batch(self, job: _Job, rounds: Sequence[ToolRound]) -> list[ToolRound]:
        """The oldest rounds, up to batch_size, whose results take at most half the window (the first one always:
        its results are elided to fit)."""
        room, used, batch = job.window // 2, 0, list[ToolRound]()
        for tool_round in rounds[:self._policy.batch_size]:
            tokens = tool_round.result_tokens or 0
            if batch and used + tokens > room:
                break
            batch.append(tool_round)
            used += tokens
        return batch

    def _prompt(self, job: _Job, batch: Sequence[ToolRound]) -> str:
        def shortened(text: str, tokens: int | None) -> str:
            return elide_text(text, tokens, self._counter.count_text, marker) if tokens is not None else text

        marker = self._templates.elision_marker
        results = sum(len(tool_round.result_indices) for tool_round in batch)
        over = sum(tool_round.result_tokens or 0 for tool_round in batch) > job.window // 2
        cap = max(job.window // 2 // results, 1) if over else None  # one round alone, bigger than half the window
        rounds = [described(job.messages, tool_round) for tool_round in batch]
        for described_round in rounds:
            for call in described_round["calls"]:
                call["arguments"] = shortened(call["arguments"], _ARGUMENT_TOKENS)
            for result in described_round["results"]:
                result["text"] = shortened(result["text"], cap)
        return self._render("prompt", rounds=rounds, limit=self._policy.max_summary_tokens)

    async def _ask(self, job: _Job, batch: Sequence[ToolRound]) -> tuple[list[str], Mapping[str, Any]]:
        """One summariser call for the batch: its summaries (checked, see parsed_summaries) and its usage."""
        limit = len(batch) * (self._policy.max_summary_tokens + _LIST_TOKENS) + _LIST_TOKENS
        model = self._model_factory(job.model, job.headers, limit, limit)
        prompt = self._prompt(job, batch)
        try:
            reply, usage = await model.complete(None, [{"role": "user", "content": prompt}])
        except Exception:
            self._metrics.pair_summary_calls.labels("error").inc()
            raise
        self._metrics.pair_summary_calls.labels("ok").inc()
        for kind in ("prompt", "completion"):
            self._metrics.pair_summary_tokens.labels(kind).inc(token_count(usage.get(f"{kind}_tokens")) or 0)
        return parsed_summaries(reply, len(batch)), usage

    async def _keep(self, job: _Job, batch: Sequence[ToolRound], summaries: Sequence[str],
                    usage: Mapping[str, Any], started: float) -> int:
        """Store each summary shorter than the results it replaces; a round whose summary is not is left whole
        (and remembered, so it is not tried again)."""
        kept: list[tuple[ToolRound, _Known, CompactedPrefix]] = []
        for tool_round, text in zip(batch, summaries, strict=True):
            summary = self._cut(text)
            texts = self._texts(tool_round, summary)
            before = sum(self._counter.count_each(round_results(job.messages, tool_round)))
            saving = self._saving(job.messages, tool_round, texts)
            if saving <= 0:
                self._remember(job.namespace, tool_round.key, _Known(tool_round.fingerprint))
                continue
            stored = {"role": "tool", "content": summary, "fingerprint": tool_round.fingerprint}
            kept.append((tool_round, _Known(tool_round.fingerprint, texts), CompactedPrefix(
                RECORD_PREFIX + tool_round.key, len(tool_round.result_indices), (stored,), before, before - saving,
                job.model, time.time())))
        await asyncio.gather(*(self._store.put(job.namespace, record) for _, _, record in kept))
        for tool_round, entry, _ in kept:
            self._remember(job.namespace, tool_round.key, entry)
        self._count(made=len(kept), failed=len(batch) - len(kept))
        log.info(json.dumps({
            "event": "pair_summaries", "request_id": current_request_id(), "summarizer_model": job.model,
            "rounds": len(batch), "made": len(kept), "left_whole": len(batch) - len(kept),
            "replaced_tokens": sum(record.tokens_before for _, _, record in kept),
            "replacement_tokens": sum(record.tokens_after for _, _, record in kept),
            "summarizer_prompt_tokens": token_count(usage.get("prompt_tokens")) or 0,
            "summarizer_completion_tokens": token_count(usage.get("completion_tokens")) or 0,
            "duration_ms": round((time.monotonic() - started) * 1000, 1)}))
        return len(kept)

    def _cut(self, text: str) -> str:
        """`text` within max_summary_tokens: its start kept (a model wrote more than it was asked for)."""
        limit, count = self._policy.max_summary_tokens, self._counter.count_text
        total = count(text)
        if total <= limit:
            return text
        chars = len(text) * limit // total
        while chars > 0:
            cut = text[:chars].rstrip() + _CUT
            if count(cut) <= limit:
                return cut
            chars = chars * 9 // 10
        return _CUT.strip()

    def _count(self, **outcomes: int) -> None:
        """Rounds counted by outcome (made, applied, mismatch, failed)."""
        for outcome, rounds in outcomes.items():
            if rounds:
                self._metrics.labelled(self._metrics.pair_summaries, outcome).inc(rounds)

    def _failed(self, job: _Job, batch: Sequence[ToolRound], error: Exception, started: float) -> None:
        rounds = len(batch) or min(len(job.rounds), self._policy.batch_size)
        self._count(failed=rounds)
        log.warning(json.dumps({
            "event": "pair_summaries_failed", "request_id": current_request_id(), "summarizer_model": job.model,
            "error": type(error).__name__, "reason": str(error) if isinstance(error, BadReply) else None,
            "rounds": rounds, "duration_ms": round((time.monotonic() - started) * 1000, 1)}))


def _with_reports(messages: Sequence[Message], sent: list[Message], indices: Collection[int]) -> list[Message]:
    """`sent` with each swapped result followed by what its output reported (its error and settings lines,
    verbatim): a small model's summary paraphrases an error it was asked to keep (the fidelity benchmark saw
    Qwen2.5-Coder-1.5B turn `E1464: duplicate journal key cd0e87` into an AssertionError it made up)."""
    for index in indices:
        said = reported(content_text(messages[index].get("content")))
        if said:
            sent[index] = with_text(sent[index], f"{content_text(sent[index].get('content'))}\n(The output "
                                                 f"reported {said}.)")
    return sent
