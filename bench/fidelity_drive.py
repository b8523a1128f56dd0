"""Drive a generated conversation through an OpenAI-compatible endpoint turn by turn, as a stateless agent client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import openai

from bench.fidelity_facts import Conversation, Fact, drive_points, probe_message
from bench.fidelity_filler import Message

SEED = 1234  # the sampling seed of every request the bench sends (tests/e2e_real/model_server.SEED)
DRIVE_MAX_TOKENS = 1  # the script supplies the next assistant turn: the model's reply is discarded
PROBE_MAX_TOKENS = 48
NEW_SUMMARY = ("proactive", "reactive", "prepared")


@dataclass(frozen=True)
class Turn:
    """What one driving request saw."""

    point: int          # index of the conversation's last message sent
    compaction: str     # the x-compaction header ("direct" when there is no proxy)
    reason: str | None  # x-compaction-reason
    seconds: float
    cleared: int = 0  # x-compaction-cleared: tool results the proxy replaced by a placeholder
    pair_summaries: int = 0  # x-compaction-pair-summaries: tool rounds it sent as their summaries


@dataclass(frozen=True)
class Answer:
    content: str
    compaction: str
    seconds: float


async def ask(client: openai.AsyncOpenAI, model: str, messages: Sequence[Message], max_tokens: int) -> Answer:
    """One greedy, seeded, non-streaming chat completion; the reply text and the proxy's x-compaction header.

    An error answer is an empty reply (graded wrong) with `error-STATUS` as its compaction, so one refused
    probe does not end a long run.
    """
    started = time.monotonic()
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=list(messages), max_tokens=max_tokens, temperature=0,  # type: ignore[arg-type]
            seed=SEED)
    except openai.APIStatusError as error:
        return Answer("", f"error-{error.status_code}", time.monotonic() - started)
    completion = raw.parse()
    content = completion.choices[0].message.content or "" if completion.choices else ""
    return Answer(content, raw.headers.get("x-compaction", "direct"), time.monotonic() - started)


async def drive(client: openai.AsyncOpenAI, model: str, conversation: Conversation, cycles: int,
                on_turn: Callable[[int], None] | None = None) -> AsyncIterator[Turn]:
    """Send the history after every round and yield each turn, until `cycles` of them brought a new summary.

    `on_turn(point)`, when given, is called before each request (the bench uses it to mark which upstream
    requests belong to which turn).
    """
    made = 0
    for point in drive_points(conversation.messages):
        if on_turn is not None:
            on_turn(point)
        started = time.monotonic()
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=conversation.messages[:point + 1],  # type: ignore[arg-type]
                max_tokens=DRIVE_MAX_TOKENS, temperature=0, seed=SEED)
            compaction, reason = raw.headers.get("x-compaction", "direct"), raw.headers.get("x-compaction-reason")
            stages = (int(raw.headers.get("x-compaction-cleared", 0)),
                      int(raw.headers.get("x-compaction-pair-summaries", 0)))
        except openai.APIStatusError as error:  # recorded; the next turn may well succeed
            compaction, reason, stages = f"error-{error.status_code}", error.message[:200], (0, 0)
        turn = Turn(point, compaction, reason, time.monotonic() - started, *stages)
        yield turn
        made += turn.compaction in NEW_SUMMARY
        if made >= cycles:
            return


def planted_by(conversation: Conversation, point: int) -> list[Fact]:
    """The facts planted in the history up to and including message `point`."""
    return [fact for fact in conversation.facts if fact.index <= point]


def with_probe(history: Sequence[Message], fact: Fact) -> list[Message]:
    return [*history, probe_message(fact)]
