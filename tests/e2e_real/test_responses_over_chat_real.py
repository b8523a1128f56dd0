"""`client.responses.create` through the proxy in `upstream_api: chat` mode, in front of the real llama.cpp server
(SmolLM2-135M, n_ctx 2048), which has no Responses API: a conversation past its n_ctx is answered every turn."""

from __future__ import annotations

import random
from typing import Any

import openai
import pytest

from proxy.app import start_server
from proxy.config import settings_from_mapping
from proxy.core.tokens import TokenCounter
from tests.e2e_real.conversation import MODEL, SYSTEM, user_note
from tests.e2e_real.model_server import LlamaServer
from tests.e2e_real.test_real_model import MAX_TOKENS, proxy_config
from tests.sdk import async_client

pytestmark = pytest.mark.real_model

TURNS = 11


async def turn(client: openai.AsyncOpenAI, history: list[dict[str, Any]], *, stream: bool) -> tuple[str, str]:
    """The reply's text as the SDK hands it to an application, and what compaction did."""
    options: dict[str, Any] = {"model": MODEL, "instructions": SYSTEM["content"], "input": history,
                               "max_output_tokens": MAX_TOKENS, "temperature": 0}
    if not stream:
        raw = await client.responses.with_raw_response.create(**options)
        return raw.parse().output_text, raw.headers.get("x-compaction", "none")
    raw_stream = await client.responses.with_raw_response.create(stream=True, **options)
    text, done = "", []
    async for event in raw_stream.parse():
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            done.append(event.response)
    assert len(done) == 1 and done[0].output_text == text
    return text, raw_stream.headers.get("x-compaction", "none")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_responses_conversation_past_n_ctx_is_answered_every_turn(llama_server: LlamaServer,
                                                                          stream: bool) -> None:
    config = {**proxy_config(llama_server.base_url, llama_server.n_ctx, {}),
              "dialects": {"responses": {"upstream_api": "chat"}}}
    proxy = await start_server(settings_from_mapping(config, env={}), host="127.0.0.1", port=0)
    client = async_client(proxy.url, timeout=600)
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
    print(f"\nResponses over chat, {'stream' if stream else 'json'}: {TURNS} turns, history {total} tokens "
          f"({total / llama_server.n_ctx:.1f}x n_ctx), x-compaction {outcomes}")
    assert total > 1.5 * llama_server.n_ctx
    assert "failed" not in outcomes and {"proactive", "reactive", "reused"} & set(outcomes)
