"""What the journey reads of any client request, whichever API it came in: the `Call` each dialect parses into."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, Self, TypeGuard

from multidict import CIMultiDict

from proxy.dialects.body import decode_body
from proxy.errors import BadRequest
from proxy.headers import MODE

MODES = ("off", "auto", "force", "shadow")


class Call(Protocol):
    """A parsed client request. Its body is kept as sent: forwarded byte for byte when nothing is compacted."""

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers to forward (the proxy's own request headers, x-compaction-mode, taken out)."""
        ...

    @property
    def query(self) -> str:
        """The raw query string, forwarded as it came."""
        ...

    @property
    def mode(self) -> str:
        """The client's x-compaction-mode for this request, "" when it gave none (the configured mode applies)."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    @property
    def compaction_requested(self) -> bool:
        """Whether the client asks for its conversation compacted now and for nothing else (a Responses
        `compaction_trigger`): the proxy answers that itself."""
        ...

    @property
    def compact_threshold(self) -> int | None:
        """The prompt size, in tokens, past which the client asks for compaction (a Responses `context_management`
        entry), or None when it names none."""
        ...

    @property
    def summary_instructions(self) -> str | None:
        """What the client asks a summary of its conversation to attend to (Anthropic's compaction
        `instructions`), or None."""
        ...

    @property
    def edit_outcomes(self) -> Mapping[str, str]:
        """What each context-management edit the client asked of the proxy did, by edit type (Anthropic's
        clearing edits): `applied`, or why not."""
        ...

    @property
    def pauses_after_compaction(self) -> bool:
        """Whether a turn the proxy compacts is answered with the compaction alone, nothing sampled after it
        (Anthropic's `pause_after_compaction`)."""
        ...

    def reserved_output(self, default: int) -> int:
        """The output tokens the request asks room for, `default` when it names none."""
        ...


def json_object(body: bytes) -> dict[str, Any]:
    """The body's JSON object, read through the guards of `dialects.body`; BadRequest for anything else."""
    payload = decode_body(body)
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    return payload


def client_mode(headers: Mapping[str, str]) -> tuple[str, CIMultiDict[str]]:
    """The client's x-compaction-mode ("" for none: the configured mode applies), and the headers to forward
    without it (the header is the proxy's, not the upstream's)."""
    mode = headers.get(MODE, "").strip().lower()
    if mode and mode not in MODES:
        raise BadRequest(f"{MODE} must be one of {', '.join(MODES)}", param=MODE)
    forwarded = CIMultiDict(headers)
    forwarded.popall(MODE, None)
    return mode, forwarded


@dataclass(frozen=True)
class JsonCall:
    """A request whose body is one JSON object, as the client sent it: what every dialect's call has in common."""

    body: bytes
    payload: dict[str, Any]
    headers: Mapping[str, str]
    query: str
    mode: str
    compaction_requested: bool = False

    @classmethod
    def parse(cls, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None) -> Self:
        """The request read; `payload` is the body's object when it was read already (dialects.body_memo)."""
        payload = json_object(body) if payload is None else payload
        mode, forwarded = client_mode(headers)
        return cls(body, payload, forwarded, query, mode)

    @cached_property
    def model(self) -> str:
        return str(self.payload.get("model") or "")

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    @property
    def compact_threshold(self) -> int | None:
        return None

    @property
    def summary_instructions(self) -> str | None:
        return None

    @property
    def pauses_after_compaction(self) -> bool:
        return False

    @property
    def edit_outcomes(self) -> Mapping[str, str]:
        return {}

    def positive(self, *keys: str) -> int | None:
        """The first of `keys` whose value is a whole number above 0 (an output cap a client set), or None."""
        return next((value for key in keys if is_positive(value := self.payload.get(key))), None)


def is_positive(value: Any) -> TypeGuard[int]:
    """A whole number above 0, as a client's cap or threshold must be (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
