"""Tenant namespaces: whose stored summaries are whose, as a one-way hash of credential, tenant and model."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import lru_cache

from proxy.core.credentials import CREDENTIAL_HEADERS, presented_credentials
from proxy.core.fingerprint import canonical_json


@lru_cache(maxsize=1024)
def tenant_namespace(credential: str | None, tenant: str | None = None, model: str | None = None) -> str:
    """A store namespace: a one-way hash of who asks (credential), for whom (tenant) and of which model.

    The tenant only subdivides a credential's namespace: a header is client-controlled, so it can never reach
    into the namespace of a client holding another credential. Cached: the same few callers ask on every request
    that may be compacted.
    """
    fields = [credential or "", tenant or "", model or ""]
    return hashlib.sha256(b"compaction-proxy/namespace/" + canonical_json(fields)).hexdigest()[:32]


def namespace_for(headers: Mapping[str, str], tenant_header: str | None, model: str | None = None) -> str:
    """The namespace of a request: its credentials together with the tenant header, and its model."""
    tenant = _header(headers, tenant_header) if tenant_header else None
    return tenant_namespace(presented_credentials(headers), tenant, model)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # Case-insensitive for any mapping, as HTTP header names are.
    lowered = name.lower()
    return next((value for key, value in headers.items() if key.lower() == lowered), None)


def journal_owner(headers: Mapping[str, str], tenant_header: str | None) -> str:
    """Whose journal entries a request's are, or whose a reader may see: a one-way hash of the credential values
    it presents (a bearer token's scheme dropped, so `Authorization: Bearer k` and `x-api-key: k` are one owner)
    and its tenant. Without any credential the owner is the anonymous one, which only operators read."""
    values = tuple(sorted({_credential_value(name, value) for name, value in headers.items()
                           if name.lower() in CREDENTIAL_HEADERS and value.strip()} - {""}))
    tenant = (_header(headers, tenant_header) or "") if tenant_header else ""
    return _owner_digest(values, tenant)


@lru_cache(maxsize=1024)
def _owner_digest(values: tuple[str, ...], tenant: str) -> str:
    # Cached: the same few callers ask on every request, and hashing is most of the journal's cost per request.
    return hashlib.sha256(b"compaction-proxy/owner/" + canonical_json([list(values), tenant])).hexdigest()[:24]


def has_credentials(headers: Mapping[str, str]) -> bool:
    """Whether a request presents any credential value at all (a reader without one is not anyone)."""
    return any(_credential_value(name, value) for name, value in headers.items()
               if name.lower() in CREDENTIAL_HEADERS)


def _credential_value(name: str, value: str) -> str:
    value = value.strip()
    if name.lower() == "authorization":
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer":
            return token.strip()
    return value
