"""Message fingerprints: canonical JSON digests, prefix hash chains and tenant namespaces."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson


def canonical_json(value: Any) -> bytes:
    """Stable bytes for a JSON value: sorted keys, no insignificant whitespace, UTF-8."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        # Values orjson refuses (integers beyond 64 bits, NaN from lenient parsing) still need a stable form.
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def message_digest(message: Any) -> bytes:
    return hashlib.blake2b(canonical_json(message), digest_size=32).digest()


def hash_chain(messages: Sequence[Any], namespace: str) -> list[str]:
    """h[i] = H(h[i-1], digest(messages[i])); h[-1] is the namespace. Returns h[0..n-1] as hex.

    Entry i fingerprints the prefix messages[: i + 1], so a stored prefix of length k has key chain[k - 1].
    """
    state = hashlib.blake2b(namespace.encode(), digest_size=32).digest()
    chain = []
    for message in messages:
        state = hashlib.blake2b(state + message_digest(message), digest_size=32).digest()
        chain.append(state.hex())
    return chain


def tenant_namespace(api_key: str | None, tenant: str | None = None) -> str:
    """A tenant's store namespace: never the key itself, only a one-way hash of it."""
    if tenant:
        source = b"tenant:" + tenant.encode()
    elif api_key:
        source = b"key:" + api_key.encode()
    else:
        source = b"anonymous"
    return hashlib.sha256(b"compaction-proxy/" + source).hexdigest()[:32]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The credential a client presented: a bearer token, else an x-api-key header."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or None


def namespace_for(headers: Mapping[str, str], tenant_header: str | None) -> str:
    tenant = headers.get(tenant_header) if tenant_header else None
    return tenant_namespace(presented_key(headers), tenant)
