"""A stateless client's long conversation: each turn resends the whole history through the official SDK."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import openai

from tests.e2e_real.model_server import SEED

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}
MODEL = "smollm2-135m"
NOUNS = ("garden", "river", "lantern", "teapot", "bicycle", "harbor", "violin", "meadow", "compass", "orchard",
         "castle", "pebble", "window", "ladder", "market")
ADJECTIVES = ("red", "quiet", "tall", "golden", "narrow", "ancient", "bright", "wooden", "sleepy", "hidden")
VERBS = ("holds", "hides", "guards", "lights", "follows", "paints", "carries")


def locker_code(index: int) -> int:
    return 4000 + index * 37


def user_note(index: int, sentences: int, rng: random.Random) -> dict[str, Any]:
    """A user turn of about 9 tokens a sentence, opening with a fact worth keeping."""
    filler = " ".join(f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
                      f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}." for _ in range(sentences))
    return {"role": "user", "content": f"Note {index}: the locker code for room {index} is {locker_code(index)}. "
                                       f"{filler} Please confirm the code for room {index}."}


def long_history(turns: int, sentences: int, seed: int) -> list[dict[str, Any]]:
    """System, then `turns` user/assistant pairs, then one more user note: a history as a client would resend it."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [SYSTEM]
    for index in range(turns):
        history.append(user_note(index, sentences, rng))
        history.append({"role": "assistant", "content": f"Room {index} uses code {locker_code(index)}."})
    return [*history, user_note(turns, sentences, rng)]


@dataclass(frozen=True)
class TurnResult:
    """What the client saw for one turn."""

    index: int
    compaction: str
    tokens_before: int | None
    tokens_after: int | None
    seconds: float
    content: str
    finish_reason: str | None
    history_messages: int


def _header_int(headers: Any, name: str) -> int | None:
    value = headers.get(name)
    return int(value) if value is not None else None


async def ask(client: openai.AsyncOpenAI, history: list[dict[str, Any]], *, index: int, stream: bool,
              max_tokens: int) -> TurnResult:
    """One chat completion over the whole history; the reply is read as the SDK hands it to an application.

    Greedy (temperature 0) and seeded: the reply depends on the history alone, and the server's sampling state
    after it is the same whatever ran before (see model_server.SEED).
    """
    started = time.monotonic()
    options: dict[str, Any] = {"model": MODEL, "messages": history, "max_tokens": max_tokens, "temperature": 0,
                               "seed": SEED}
    if stream:
        async with client.chat.completions.with_streaming_response.create(stream=True, **options) as raw:
            headers = raw.headers
            pieces: list[str] = []
            finish: str | None = None
            async for chunk in await raw.parse():
                for choice in chunk.choices:
                    pieces.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
            content = "".join(pieces)
    else:
        raw_answer = await client.chat.completions.with_raw_response.create(**options)
        headers = raw_answer.headers
        completion = raw_answer.parse()
        content = completion.choices[0].message.content or ""
        finish = completion.choices[0].finish_reason
    return TurnResult(index, headers.get("x-compaction", "missing"),
                      _header_int(headers, "x-compaction-tokens-before"),
                      _header_int(headers, "x-compaction-tokens-after"),
                      time.monotonic() - started, content, finish, len(history))


async def converse(client: openai.AsyncOpenAI, turns: int, *, sentences: int, seed: int, stream: bool,
                   max_tokens: int) -> tuple[list[TurnResult], list[dict[str, Any]]]:
    """Grow a conversation turn by turn, appending each reply, as a stateless client does."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [SYSTEM]
    results: list[TurnResult] = []
    for index in range(turns):
        history.append(user_note(index, sentences, rng))
        result = await ask(client, history, index=index, stream=stream, max_tokens=max_tokens)
        results.append(result)
        history.append({"role": "assistant", "content": result.content})
    return results, history
