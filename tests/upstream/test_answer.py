"""What happens after the answer (learning from its usage) never harms the answer: a stream ends whole, a body is
sent as the upstream wrote it, whatever the learning hook raises."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.compaction.pipeline import Pipeline
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def broken_learning(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The end-of-answer hook raises, as a bug in it would; the usages it was given are recorded."""
    seen: list[Any] = []

    def learn(self: Pipeline[Any], journey: Any, usage: Any) -> None:
        seen.append(usage)
        raise RuntimeError("a bug in learning")

    monkeypatch.setattr(Pipeline, "_learn", learn)
    return seen


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_a_failing_learning_hook_leaves_the_answer_whole(stream: bool, broken_learning: list[Any],
                                                               fake: FakeUpstream, make_proxy: ProxyFactory,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session, session.post(
            f"{proxy.url}/v1/chat/completions", json={**BODY, "stream": stream}) as response:
        body = await response.read()
        assert response.status == 200
    if stream:
        assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
    else:
        assert b"echo: hello" in body
    assert broken_learning, "the hook ran"
    assert "learning from an answer failed" in caplog.text
