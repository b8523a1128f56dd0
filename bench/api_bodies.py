"""The bench's agent history in each client API's shape: chat messages, Responses input items (Codex, the Agents
SDK) and Anthropic messages (Claude Code), each resent whole with one new user turn."""

from __future__ import annotations

import json
from typing import Any

APIS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
HISTORY_KEYS = {"chat": "messages", "responses": "input", "messages": "messages"}


def request_head(api: str, model: str, stream: bool, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The request's fields beside its history: a Responses or Messages request carries the chat history's system
    message as its instructions (`instructions`, `system`), as those clients do."""
    if api == "chat":
        return {"model": model, "stream": stream}
    system = next((message["content"] for message in history if message["role"] == "system"), None)
    if api == "responses":
        return {"model": model, "stream": stream, "store": False, **({"instructions": system} if system else {})}
    return {"model": model, "stream": stream, "max_tokens": 1024, **({"system": system} if system else {})}


def history_in(api: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat history as the API's history list (its system message left to request_head)."""
    if api == "chat":
        return history
    spoken = [message for message in history if message["role"] != "system"]
    return responses_items(spoken) if api == "responses" else anthropic_messages(spoken)


def new_turn(api: str, message: dict[str, Any]) -> dict[str, Any]:
    """A new user message (chat's shape) as the API's next history item."""
    if api == "messages":
        return {"role": "user", "content": [{"type": "text", "text": message["content"]}]}
    return message


def with_turn(api: str, history: list[dict[str, Any]], message: dict[str, Any]) -> list[dict[str, Any]]:
    """The API's history with a new user message (chat's shape) after it, as that API's clients send it: Claude
    Code sends a turn's tool results and the user's words in one user message, so in Messages the words join a
    history that ends with the user's tool results."""
    turn = new_turn(api, message)
    if api == "messages" and history and history[-1]["role"] == "user":
        last = history[-1]
        return [*history[:-1], {**last, "content": [*last["content"], *turn["content"]]}]
    return [*history, turn]


def responses_items(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """User and assistant text as messages, each tool call and result as its own item."""
    items: list[dict[str, Any]] = []
    for message in history:
        if message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message["content"]})
            continue
        if message.get("content"):
            items.append({"role": message["role"], "content": message["content"]})
        for call in message.get("tool_calls") or ():
            items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                          "arguments": call["function"]["arguments"]})
    return items


def anthropic_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Alternating user and assistant messages of blocks: tool calls as tool_use, results as tool_result blocks of
    the next user message."""
    out: list[dict[str, Any]] = []
    for message in history:
        if message["role"] == "tool":
            blocks: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": message["tool_call_id"],
                                             "content": message["content"]}]
            speaker = "user"
        else:
            blocks = [{"type": "text", "text": message["content"]}] if message.get("content") else []
            blocks += [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"] or "{}")}
                       for call in message.get("tool_calls") or ()]
            speaker = message["role"]
        if out and out[-1]["role"] == speaker:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": speaker, "content": blocks})
    return out
