"""The proxy's own `compaction` items: a compacted conversation sealed into `encrypted_content`, opened again later.

Self-contained (the conversation travels in the item, no store is asked), so any replica opens it, and an envelope
can carry nothing but what its sender already holds: a forged one names no other tenant's data. Bounded and checked
like any client input; anything else in `encrypted_content` is not ours and travels untouched.

Version 2 (`cpx2.`) holds the whole compacted conversation — the items kept before the summary, the summary, the
items kept after it — so one item stands for all of it, as a compaction item must for a client that drops
everything before it (Codex keeps only its user messages). Version 1 (`cpx1.`) held the summary alone; it is still
opened, for items issued before version 2.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

PREFIX_V1 = "cpx1."
PREFIX = "cpx2."  # "compaction proxy, envelope version 2": the one sealed now
# A request body is bounded before anything reads it; this bounds one envelope within it (base64 adds a third).
MAX_ENVELOPE_CHARS = 96 * 1024 * 1024


@dataclass(frozen=True)
class Sealed:
    """A compacted conversation in the client's own items: the kept head, the summary's text, the kept tail."""

    before: tuple[Any, ...]
    summary: str | None
    after: tuple[Any, ...]


def seal(sealed: Sealed) -> str:
    payload = {"v": 2, "before": list(sealed.before), "summary": sealed.summary, "after": list(sealed.after)}
    encoded = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(encoded).decode().rstrip("=")


def opened(value: Any) -> Sealed | None:
    """The conversation in one of the proxy's envelopes; None for anything else (another issuer's, broken, large)."""
    if not isinstance(value, str) or len(value) > MAX_ENVELOPE_CHARS:
        return None
    version = 2 if value.startswith(PREFIX) else 1 if value.startswith(PREFIX_V1) else None
    if version is None:
        return None
    encoded = value[len(PREFIX):]
    try:
        payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or payload.get("v") != version:
        return None
    if version == 1 and not isinstance(payload.get("summary"), str):
        return None
    return _read(payload)


def _read(payload: dict[str, Any]) -> Sealed | None:
    summary = payload.get("summary")
    before, after = payload.get("before", []), payload.get("after", [])
    if not (summary is None or isinstance(summary, str)) or not _items(before) or not _items(after):
        return None
    return Sealed(tuple(before), summary, tuple(after))


def _items(value: Any) -> bool:
    """A list of JSON objects: what an input list holds (each item is checked again where the dialect reads it)."""
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)
