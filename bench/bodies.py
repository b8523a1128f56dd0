"""Request bodies the load generator sends: a ~50-token chat, a paced stream, a ~100k-token agent history."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from bench.api_bodies import HISTORY_KEYS, PATHS, history_in, request_head, with_turn

SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in one short paragraph."}
# Stands for the new message's words while the rest of a body is encoded once.
_MARK = "bench-new-message-words-go-here"
STREAM_CHUNKS = 20
STREAM_INTERVAL_MS = 10
HOLD_CHUNKS = 600           # held streams are closed by the client long before the upstream runs out
HOLD_INTERVAL_MS = 1000


@dataclass(frozen=True)
class Shape:
    """One kind of request: its model (which picks the proxy's window), history, and streaming pace."""

    name: str
    model: str
    long_history: bool = False
    chunks: int = 0           # 0: not streamed
    interval_ms: int = 0
    api: str = "chat"         # bench.api_bodies.APIS: the client API it is sent in

    @property
    def path(self) -> str:
        return PATHS[self.api]

    @property
    def stream(self) -> bool:
        return self.chunks > 0


SHAPES = {shape.name: shape for shape in (
    Shape("small", "bench-small"),
    Shape("stream", "bench-stream", chunks=STREAM_CHUNKS, interval_ms=STREAM_INTERVAL_MS),
    Shape("long", "bench-long", long_history=True),
    Shape("reuse", "bench-reuse", long_history=True),
    Shape("hold", "bench-stream", chunks=HOLD_CHUNKS, interval_ms=HOLD_INTERVAL_MS),
    Shape("long-responses", "bench-long", long_history=True, api="responses"),
    Shape("long-messages", "bench-long", long_history=True, api="messages"),
    Shape("reuse-responses", "bench-reuse", long_history=True, api="responses"),
    Shape("reuse-messages", "bench-reuse", long_history=True, api="messages"),
)}


@functools.cache
def long_history() -> tuple[dict[str, Any], ...]:
    """400 messages, ~95k tokens (cl100k): user, assistant tool call, tool result, assistant text, repeated,
    with a few long ones; deterministic (bench.tokens.synthetic_history, seed 7)."""
    from bench.tokens import synthetic_history

    return tuple(synthetic_history())


def history(shape: Shape) -> list[dict[str, Any]]:
    return list(long_history()) if shape.long_history else [SYSTEM]


def new_message(shape: Shape, index: int) -> dict[str, Any]:
    """The one message that differs between requests, so no two bodies are the same."""
    if shape.long_history:
        return {"role": "user", "content": f"Next step {index}: run the failing test again and tell me what broke."}
    return {"role": "user", "content": f"Request {index}: explain in two sentences why reusing a keep-alive "
                                       "connection makes a small HTTP request cheaper than opening a new one."}


class Bodies:
    """Builds request `index` of a shape cheaply: the shared prefix is encoded once."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        said = history(shape)
        head = request_head(shape.api, shape.model, shape.stream, said)
        marked = {**new_message(shape, 0), "content": _MARK}
        encoded = json.dumps({**head, HISTORY_KEYS[shape.api]: with_turn(shape.api, history_in(shape.api, said),
                                                                            marked)},
                             separators=(",", ":")).encode()
        # Around the new message's words: the rest is the same bytes on every request.
        self._before, _, self._after = encoded.partition(json.dumps(_MARK).encode())

    def body(self, index: int) -> bytes:
        return self._before + json.dumps(new_message(self.shape, index)["content"]).encode() + self._after

    def payload(self, index: int) -> dict[str, Any]:
        return dict(json.loads(self.body(index)))

    @functools.cached_property
    def bytes_per_token(self) -> float:
        """JSON bytes per token of request 0 (proxy.tokens, cl100k): the fake upstream's usage reports
        len(body) / this, so the proxy's calibration ratio stays near 1."""
        from proxy.core.tokens import TokenCounter

        # Counted in chat's shape whatever the API: the same conversation, the same tokens.
        tokens = TokenCounter("cl100k_base").count_request({"messages": [*history(self.shape),
                                                                          new_message(self.shape, 0)]})
        return len(self.body(0)) / max(1, tokens)

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json",
                   "x-bench-bytes-per-token": f"{self.bytes_per_token:.4f}"}
        if self.shape.stream:
            headers |= {"x-bench-chunks": str(self.shape.chunks), "x-bench-interval-ms": str(self.shape.interval_ms)}
        return headers
