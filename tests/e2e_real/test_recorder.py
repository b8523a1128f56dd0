"""The recording pass-through's one change to what it forwards: the suite's seed on an unseeded completion."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e_real.model_server import SEED
from tests.e2e_real.recorder import with_seed


def test_unseeded_completion_gets_the_suite_seed_and_nothing_else() -> None:
    request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256}
    seeded = with_seed(request)
    assert seeded is not None and json.loads(seeded) == {**request, "seed": SEED}


@pytest.mark.parametrize("request_body", [
    {"model": "m", "messages": [], "seed": 7},   # the sender's own seed stands
    {},                                          # not JSON, or empty
    {"input": "text to count"},                  # not a completion
])
def test_other_requests_are_forwarded_unchanged(request_body: dict[str, Any]) -> None:
    assert with_seed(request_body) is None
