"""The proxy's own `compaction` items: a summary sealed into `encrypted_content`, opened again on a later request.

Self-contained (the summary travels in the item, no store is asked), so any replica opens it, and an envelope can
carry nothing but text its sender already holds: a forged one names no other tenant's data. Bounded and checked
like any client input; anything else in `encrypted_content` is not ours and travels untouched.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

PREFIX = "cpx1."  # "compaction proxy, envelope version 1"
MAX_ENVELOPE_CHARS = 1024 * 1024


def seal(summary: str) -> str:
    payload = json.dumps({"v": 1, "summary": summary}, ensure_ascii=False).encode()
    return PREFIX + base64.urlsafe_b64encode(payload).decode().rstrip("=")


def opened(value: Any) -> str | None:
    """The summary in one of the proxy's envelopes; None for anything else (another issuer's, broken, too large)."""
    if not isinstance(value, str) or not value.startswith(PREFIX) or len(value) > MAX_ENVELOPE_CHARS:
        return None
    encoded = value[len(PREFIX):]
    try:
        payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return None
    summary = payload.get("summary") if isinstance(payload, dict) and payload.get("v") == 1 else None
    return summary if isinstance(summary, str) else None
