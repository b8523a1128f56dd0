"""`client.messages.create` (the `anthropic` SDK) through the proxy in `upstream_api: chat` mode, in front of the real
llama.cpp server (SmolLM2-135M, n_ctx 2048), which has no Messages API: a conversation past its n_ctx is answered
every turn, whole and streamed."""

from __future__ import annotations

import random
from typing import Any

import anthropic
import pytest

from proxy.app import start_server
from proxy.config import settings_from_mapping
from proxy.core.tokens import TokenCounter
from tests.e2e_real.conversation import MODEL, SYSTEM, user_note
from tests.e2e_real.model_server import LlamaServer
from tests.e2e_real.test_real_model import MAX_TOKENS, proxy_config
from tests.fakes.messages_agent import anthropic_client

pytestmark = pytest.mark.real_model

TURNS = 11


async def turn(client: anthropic.AsyncAnthropic, history: list[dict[str, Any]], *, stream: bool) -> tuple[str, str]:
    """The reply's text as the SDK hands it to an application, and what compaction did."""
    # Greedy, as every turn of this suite: this SDK has no `temperature` argument, the bridge sends it on.
    options: dict[str, Any] = {"model": MODEL, "system": SYSTEM["content"], "messages": history,
                               "max_tokens": MAX_TOKENS, "extra_body": {"temperature": 0}}
    if not stream:
        raw = await client.messages.with_raw_response.create(**options)
        message = await raw.parse()
        assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.input_tokens > 0
        return "".join(block.text for block in message.content if block.type == "text"), \
            raw.headers.get("x-compaction", "none")
    async with client.messages.stream(**options) as events:
        text = "".join([piece async for piece in events.text_stream])
        final = await events.get_final_message()
        outcome = events.response.headers.get("x-compaction", "none")
    # No usage asserted: llama-cpp-python's server reports none in a stream (it ignores stream_options), and the
    # bridge makes none up (message_start's 0 stands).
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert "".join(block.text for block in final.content if block.type == "text") == text
    return text, outcome


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_messages_conversation_past_n_ctx_is_answered_every_turn(llama_server: LlamaServer,
                                                                         stream: bool) -> None:
    config = {**proxy_config(llama_server.base_url, llama_server.n_ctx, {}),
              "dialects": {"messages": {"upstream_api": "chat"}}}
    proxy = await start_server(settings_from_mapping(config, env={}), host="127.0.0.1", port=0)
    client = anthropic_client(proxy.url, timeout=600)
    rng, history, outcomes = random.Random(5), [], []
    try:
        for index in range(TURNS):
            history.append(user_note(index, 30, rng))
            text, outcome = await turn(client, history, stream=stream)
            assert text.strip(), f"turn {index} got no text"
            outcomes.append(outcome)
            history.append({"role": "assistant", "content": text})
    finally:
        await proxy.stop()
    total = TokenCounter().count_messages(history)
    print(f"\nMessages over chat, {'stream' if stream else 'json'}: {TURNS} turns, history {total} tokens "
          f"({total / llama_server.n_ctx:.1f}x n_ctx), x-compaction {outcomes}")
    assert total > 1.5 * llama_server.n_ctx
    assert "failed" not in outcomes and {"proactive", "reactive", "reused"} & set(outcomes)
