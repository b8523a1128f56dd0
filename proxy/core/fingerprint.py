"""Message fingerprints: canonical JSON digests and prefix hash chains."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import orjson

# Bytes for hashing any str: a lone surrogate (valid JSON "\ud800", or a header byte aiohttp could not decode) has
# no UTF-8 form, and "surrogatepass" gives it a distinct one instead of raising.
HASH_ERRORS = "surrogatepass"
_KEYWORDS = {True: "true", False: "false", None: "null"}


def canonical_json(value: Any) -> bytes:
    """Stable bytes for a JSON value: sorted keys, no insignificant whitespace, UTF-8. Total on JSON values."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        pass
    # Values orjson refuses (integers beyond 64 bits, NaN from lenient parsing, lone surrogates, more than 254
    # levels) still need a stable form.
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        text = dumps_iteratively(value, sort_keys=True, ensure_ascii=False)
    return text.encode("utf-8", HASH_ERRORS)


class _Literal(str):
    """Text queued between values while encoding; never a value itself."""


def dumps_iteratively(value: Any, *, sort_keys: bool = False, separators: tuple[str, str] = (",", ":"),
                      ensure_ascii: bool = True, default: Callable[[Any], Any] | None = None) -> str:
    """json.dumps without recursion, for values nested too deep for it: the same text json.dumps would give."""
    item_separator, key_separator = separators
    pieces: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if type(item) is _Literal:
            pieces.append(item)
        elif isinstance(item, dict):
            pairs = sorted(item.items(), key=lambda pair: pair[0]) if sort_keys else list(item.items())
            pending.append(_Literal("}"))
            for index in range(len(pairs) - 1, -1, -1):
                key, child = pairs[index]
                pending.append(child)
                key_text = json.dumps(_key(key), ensure_ascii=ensure_ascii)
                pending.append(_Literal((item_separator if index else "") + key_text + key_separator))
            pieces.append("{")
        elif isinstance(item, list | tuple):
            pending.append(_Literal("]"))
            for index in range(len(item) - 1, -1, -1):
                pending.append(item[index])
                if index:
                    pending.append(_Literal(item_separator))
            pieces.append("[")
        elif item is None or isinstance(item, str | int | float):
            pieces.append(json.dumps(item, ensure_ascii=ensure_ascii))
        elif default is not None:
            pending.append(default(item))
        else:
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
    return "".join(pieces)


def _key(key: Any) -> str:
    """A dict key as json.dumps writes it."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return _KEYWORDS[key]
    if isinstance(key, int | float):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def message_digest(message: Any) -> bytes:
    return digest_of(canonical_json(message))


def digest_of(canonical: bytes) -> bytes:
    """The digest of a message's canonical JSON."""
    return hashlib.blake2b(canonical, digest_size=32).digest()


def chain_root(namespace: str) -> bytes:
    """h[-1] of a chain: the state before its first message."""
    return hashlib.blake2b(namespace.encode("utf-8", HASH_ERRORS), digest_size=32).digest()


def chain_link(state: bytes, digest: bytes) -> bytes:
    """h[i] from h[i-1] and the digest of messages[i]."""
    return hashlib.blake2b(state + digest, digest_size=32).digest()


def hash_chain(messages: Sequence[Any], namespace: str) -> list[str]:
    """h[i] = H(h[i-1], digest(messages[i])); h[-1] is the namespace. Returns h[0..n-1] as hex.

    Entry i fingerprints the prefix messages[: i + 1], so a stored prefix of length k has key chain[k - 1].
    """
    state = chain_root(namespace)
    chain = []
    for message in messages:
        state = chain_link(state, message_digest(message))
        chain.append(state.hex())
    return chain
