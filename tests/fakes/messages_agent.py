"""An agent on Anthropic's Messages API, as the official SDK drives one: each round's tool_use blocks answered with
the file they ask for, the whole history resent with the assistant turns kept as returned (thinking blocks
included, signed), JSON or streamed. Shared by tests and benchmarks."""

from __future__ import annotations

from typing import Any

import anthropic

INSTRUCTION = "Read every file of the project, one round at a time, and report what each one defines."
SYSTEM = "You are a careful code reader."
MODEL = "fake-messages"
MAX_TOKENS = 1024
TOOLS = [{"name": "read_file", "description": "Read a file of the project.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def anthropic_client(base: str, api_key: str = "sk-ant-test", **options: Any) -> anthropic.AsyncAnthropic:
    """The SDK pointed at a base URL on loopback (it adds /v1/messages itself); plain HTTP, so no TLS to set up."""
    return anthropic.AsyncAnthropic(api_key=api_key, base_url=base, max_retries=0,
                                    http_client=anthropic.DefaultAsyncHttpxClient(verify=False), **options)


def file_text(tool_use_id: str) -> str:
    return "\n".join(f"def function_{tool_use_id}_{line}(value): return value * {line}  # FACT-{line}"
                     for line in range(13))


async def respond(client: anthropic.AsyncAnthropic, messages: list[Any], *,
                  stream: bool) -> tuple[list[dict[str, Any]], str]:
    """One turn: the content blocks as the client keeps them (unset fields left out), and x-compaction."""
    request: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "system": SYSTEM, "tools": TOOLS,
                               "messages": messages}
    if not stream:
        raw = await client.messages.with_raw_response.create(**request)
        message = await raw.parse()
        return [block.model_dump(exclude_unset=True) for block in message.content], raw.headers.get(
            "x-compaction", "none")
    # The SDK's streaming helper: it joins the deltas (thinking, signature, partial JSON) into the final message.
    async with client.messages.stream(**request) as events:
        message = await events.get_final_message()
        outcome = events.response.headers.get("x-compaction", "none")
    return [block.model_dump(exclude_unset=True) for block in message.content], outcome


async def run_agent(client: anthropic.AsyncAnthropic, rounds: int, *, stream: bool,
                    sent: list[int] | None = None) -> list[str]:
    """`rounds` turns of the loop, each answered with one tool_result per tool_use in a single user message; the
    x-compaction header of each ("none" when absent). `sent` gathers the number of messages each request carried."""
    messages: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    outcomes = []
    for _ in range(rounds):
        if sent is not None:
            sent.append(len(messages))
        content, outcome = await respond(client, messages, stream=stream)
        outcomes.append(outcome)
        uses = [block for block in content if block["type"] == "tool_use"]
        assert uses, f"the model stopped calling tools: {content}"
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "content": file_text(use["id"])} for use in uses]})
    return outcomes
