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


async def respond(client: openai.AsyncOpenAI, items: list[Any], *, stream: bool,
                  compact_threshold: int | None = None) -> tuple[list[Any], str]:
    """One turn: the output items as the client keeps them (as sent, unset fields left out), and x-compaction.
    With `compact_threshold`, the request asks for compaction past it (`context_management`)."""
    managed: dict[str, Any] = {} if compact_threshold is None else {
        "context_management": [{"type": "compaction", "compact_threshold": compact_threshold}]}
    if not stream:
        raw = await client.responses.with_raw_response.create(model="fake-responses", input=items, tools=TOOLS,
                                                              **managed)
        output = raw.parse().output
        return [item.model_dump(exclude_unset=True) for item in output], raw.headers.get("x-compaction", "none")
    raw_stream = await client.responses.with_raw_response.create(model="fake-responses", input=items, tools=TOOLS,
                                                                 stream=True, **managed)
    completed = [event.response async for event in raw_stream.parse() if event.type == "response.completed"]
    assert len(completed) == 1
    outcome = raw_stream.headers.get("x-compaction", "none")
    return [item.model_dump(exclude_unset=True) for item in completed[0].output], outcome


async def run_agent(client: openai.AsyncOpenAI, rounds: int, *, stream: bool, compact_threshold: int | None = None,
                    sent: list[int] | None = None) -> list[str]:
    """`rounds` turns of the loop; with `compact_threshold`, the client asks for compaction and, as OpenAI's guide
    allows, drops every item before the latest compaction item it was answered with. `sent` gathers the number of
    items each request carried."""
    items: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    outcomes = []
    for _ in range(rounds):
        if sent is not None:
            sent.append(len(items))
        output, outcome = await respond(client, items, stream=stream, compact_threshold=compact_threshold)
        outcomes.append(outcome)
        calls = [item for item in output if item["type"] == "function_call"]
        assert len(calls) == 2
        items += output
        latest = [index for index, item in enumerate(items) if item.get("type") == "compaction"]
        items = items[latest[-1]:] if latest else items
        items += [{"type": "function_call_output", "call_id": call["call_id"], "output": file_text(call["call_id"])}
                  for call in calls]
    return outcomes
