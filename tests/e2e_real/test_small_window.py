"""A new user's setup at a small window: SmolLM2 at n_ctx 1024, built-in prompts, every turn must be answered."""

from __future__ import annotations

import json

from bench.small_windows import Run, converse
from tests.e2e_real.model_server import LlamaServer

# Eight turns of ~110 tokens with 48-token replies pass the 1024-token window at about the sixth turn, so the
# conversation needs at least one compaction; shorter replies than the bench's keep it near 40 s on 2 cores.
TURNS = 8
MAX_TOKENS = 48
COMPACTED = {"proactive", "reactive", "reused"}


def explain(run: Run) -> str:
    """Each turn's outcome, with the proxy's log lines (their budget figures) for the turns that failed."""
    lines = [f"{'ok  ' if turn.answered else 'FAIL'} turn {turn.index}: {turn.status} x-compaction={turn.compaction} "
             f"prompt_tokens={turn.prompt_tokens} {turn.error[:160]}" for turn in run.turns]
    for turn in run.turns:
        if not turn.answered:
            lines += [f"  turn {turn.index} log: {line[:600]}" for line in turn.proxy_log]
    lines.append(f"summary failures: {json.dumps(run.summary_failures)[:1500]}")
    return "\n".join(lines)


async def test_built_in_prompts_answer_every_turn_at_n_ctx_1024(llama_server_1024: LlamaServer) -> None:
    # No context_window in the config, as a new user writes it: the proxy learns the window from the first
    # refusal (a reactive compaction), then compacts proactively.
    run = await converse(llama_server_1024, "smollm2", "none", TURNS, {}, max_tokens=MAX_TOKENS)
    failed = [turn.index for turn in run.turns if not turn.answered]
    assert not failed, f"turns {failed} of {TURNS} were not answered:\n{explain(run)}"
    assert any(turn.compaction in COMPACTED for turn in run.turns), \
        f"the conversation never compacted, so it tested nothing:\n{explain(run)}"
