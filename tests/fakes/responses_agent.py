"""An agent on the Responses API, as the official SDK drives one: each round's tool calls answered with the file
they ask for, the whole history resent (store: false), JSON or streamed. Shared by tests and benchmarks."""

from __future__ import annotations

from typing import Any

import openai

INSTRUCTION = "Read every file of the project, one round at a time, and report what each one defines."
TOOLS = [{"type": "function", "name": "read_file", "description": "Read a file of the project.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def file_text(call_id: str) -> str:
    return "\n".join(f"def function_{call_id}_{line}(value): return value * {line}  # FACT-{line}"
                     for line in range(8))


async def respond(client: openai.AsyncOpenAI, items: list[Any], *, stream: bool) -> tuple[list[Any], str]:
    """One turn: the output items as the client keeps them (as sent, unset fields left out), and x-compaction."""
    if not stream:
        raw = await client.responses.with_raw_response.create(model="fake-responses", input=items, tools=TOOLS)
        output = raw.parse().output
        return [item.model_dump(exclude_unset=True) for item in output], raw.headers.get("x-compaction", "none")
    raw_stream = await client.responses.with_raw_response.create(model="fake-responses", input=items, tools=TOOLS,
                                                                 stream=True)
    completed = [event.response async for event in raw_stream.parse() if event.type == "response.completed"]
    assert len(completed) == 1
    outcome = raw_stream.headers.get("x-compaction", "none")
    return [item.model_dump(exclude_unset=True) for item in completed[0].output], outcome


async def run_agent(client: openai.AsyncOpenAI, rounds: int, *, stream: bool) -> list[str]:
    items: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    outcomes = []
    for _ in range(rounds):
        output, outcome = await respond(client, items, stream=stream)
        outcomes.append(outcome)
        calls = [item for item in output if item["type"] == "function_call"]
        assert len(calls) == 2
        items += output
        items += [{"type": "function_call_output", "call_id": call["call_id"], "output": file_text(call["call_id"])}
                  for call in calls]
    return outcomes
