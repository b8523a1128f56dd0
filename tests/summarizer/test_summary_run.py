"""One summary's request machinery: the part's ask swapped in and out, the stated limit, usage summed."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.tokens import TokenCounter
from proxy.summarizer.summary_run import SummarizerError, SummaryRun
from proxy.summarizer.templates import Templates

Message = dict[str, Any]


class Model:
    """Replies with the output limit it was given; `limited` models ask for less."""

    def __init__(self, ask: int = 256, limitable: bool = True) -> None:
        self.max_output_tokens, self.limitable = ask, limitable
        self.context_window = 1024

    def limited(self, tokens: int) -> Model:
        if not self.limitable:
            raise AssertionError("a model that cannot be limited is never asked to be")
        return Model(min(tokens, self.max_output_tokens))

    async def complete(self, system: str | None, messages: list[Message]) -> tuple[Message, Any]:
        return {"role": "assistant", "content": f"limit {self.max_output_tokens}"}, \
            {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


@pytest.fixture
def templates(tmp_path: Any) -> Templates:
    return Templates(user_dir=tmp_path / "no-user-prompts")


@pytest.mark.parametrize(("asks", "expected"), [((None,), 256), ((150,), 150), ((150, None), 256),
                                                ((150, 100), 100), ((4096,), 256)])
async def test_asking_states_the_innermost_ask(asks: tuple[int | None, ...], expected: int,
                                               templates: Templates) -> None:
    run = SummaryRun(Model(), templates, TokenCounter())
    with run.asking(asks[0]):
        if len(asks) > 1:
            with run.asking(asks[1]):
                reply = await run.ask("T", "now")
        else:
            reply = await run.ask("T", "now")
    assert reply == f"limit {expected}"
    assert run.limited is False and run.model is run.own_model
    assert run.usage == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12} and run.calls == 1


async def test_the_summary_s_own_ask_is_back_after_a_failed_part(templates: Templates) -> None:
    run = SummaryRun(Model(), templates, TokenCounter(), max_calls=1)
    await run.ask("T", "now")
    with pytest.raises(SummarizerError, match="more than 1 summariser calls"), run.asking(100):
        assert run.limited
        await run.ask("T", "now")
    assert run.model is run.own_model


async def test_a_model_that_cannot_be_limited_keeps_its_own_ask(templates: Templates) -> None:
    model = Model(limitable=False)
    model.limited = None  # type: ignore[assignment,method-assign]
    run = SummaryRun(model, templates, TokenCounter())
    with run.asking(100):
        assert await run.ask("T", "now") == "limit 256" and not run.limited
