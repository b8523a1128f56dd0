"""Credentials a client presents: to the proxy (its access key) and to the upstream (its own key)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from proxy.core.fingerprint import HASH_ERRORS, canonical_json

# A client may present its proxy key here, keeping Authorization for its own upstream key.
PROXY_KEY_HEADER = "x-proxy-api-key"
# Every header a client identifies itself with, to the proxy or to the upstream.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", PROXY_KEY_HEADER)
# What travels with a request the proxy makes on a caller's behalf (the summariser's, window discovery's): only what
# identifies the caller, never the rest of the client's request.
UPSTREAM_CREDENTIAL_HEADERS = ("authorization", "x-api-key", "openai-organization", "openai-project", "api-key")


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The proxy key a client presented: x-proxy-api-key, else a bearer token, else an x-api-key header."""
    dedicated = headers.get(PROXY_KEY_HEADER, "").strip()
    if dedicated:
        return dedicated
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or None


def presents_one_of(headers: Mapping[str, str], keys: Sequence[bytes]) -> bool:
    """True when the key a client presented (see presented_key) is one of `keys`."""
    presented = (presented_key(headers) or "").encode("utf-8", HASH_ERRORS)
    # Every key compared, in constant time, so the time taken does not say which one nearly matched.
    return any([hmac.compare_digest(presented, key) for key in keys])


def presented_credentials(headers: Mapping[str, str]) -> str | None:
    """Every credential header a client sent, in a canonical form (names folded, sorted); None without any."""
    found = sorted((name.lower(), value.strip()) for name, value in headers.items()
                   if name.lower() in CREDENTIAL_HEADERS and value.strip())
    return canonical_json(found).decode("utf-8", HASH_ERRORS) if found else None


def credential_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's identifying headers. x-proxy-api-key is not one of them, and a proxy key in any of them is
    removed on the way out by upstream.request_headers, as from every upstream request."""
    return {name: value for name, value in headers.items() if name.lower() in UPSTREAM_CREDENTIAL_HEADERS}
