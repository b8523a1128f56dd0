"""proxy.core.tenants: store namespaces as one-way hashes of credential, tenant and model, and per request."""

from __future__ import annotations

import hashlib
import json

import pytest
from multidict import CIMultiDict

from proxy.core.credentials import presented_credentials
from proxy.core.tenants import has_credentials, journal_owner, namespace_for, tenant_namespace


def expected_namespace(credential: str, tenant: str, model: str) -> str:
    fields = json.dumps([credential, tenant, model], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(b"compaction-proxy/namespace/" + fields.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@pytest.mark.parametrize(("args", "fields"), [
    (("sk-one",), ("sk-one", "", "")),
    ((None,), ("", "", "")),
    (("sk-one", "team-a"), ("sk-one", "team-a", "")),
    (("sk-one", "team-a", "gpt-4o"), ("sk-one", "team-a", "gpt-4o")),
    (("sk-one", None, "gpt-4o"), ("sk-one", "", "gpt-4o")),
    (("sk-\udcff", "t\ud800", "m"), ("sk-\udcff", "t\ud800", "m")),
    (('quote"and\\slash', "é", "\n"), ('quote"and\\slash', "é", "\n")),
    (("k" * 1_000_000,), ("k" * 1_000_000, "", "")),
])
def test_tenant_namespace_hashes_the_three_fields(args: tuple[str | None, ...], fields: tuple[str, str, str]) -> None:
    namespace = tenant_namespace(*args)
    assert namespace == expected_namespace(*fields)
    assert len(namespace) == 32 and int(namespace, 16) >= 0


def test_none_and_empty_are_the_same_field() -> None:
    assert tenant_namespace(None, None, None) == tenant_namespace("", "", "") == tenant_namespace("")
    assert tenant_namespace("k", None, "m") == tenant_namespace("k", "", "m")


@pytest.mark.parametrize(("left", "right"), [
    (("ab", "c", None), ("a", "bc", None)),  # field boundaries are kept
    (("k", "m", None), ("k", None, "m")),  # a tenant is not a model
    (("k", None, None), (None, "k", None)),  # a tenant header cannot pose as a credential
    (("k", "t", "m"), ("k", "t", "m2")),
    (("k\ud800", None, None), ("k\ufffd", None, None)),  # a lone surrogate is not its replacement
    (('a","b', None, None), ("a", "b", None)),  # quoting cannot forge a field split
])
def test_distinct_fields_give_distinct_namespaces(left: tuple[str | None, str | None, str | None],
                                                  right: tuple[str | None, str | None, str | None]) -> None:
    assert tenant_namespace(*left) != tenant_namespace(*right)


@pytest.mark.parametrize(("headers", "tenant_header", "model", "credential", "tenant"), [
    ({"Authorization": "Bearer a"}, None, None, '[["authorization","Bearer a"]]', None),
    ({"Authorization": "Bearer a", "X-Tenant": "t"}, None, None, '[["authorization","Bearer a"]]', None),
    ({"Authorization": "Bearer a", "X-Tenant": "t"}, "x-tenant", "m", '[["authorization","Bearer a"]]', "t"),
    ({"Authorization": "Bearer a", "x-tenant": "t"}, "X-TENANT", None, '[["authorization","Bearer a"]]', "t"),
    ({"X-Tenant": "t"}, "x-tenant", None, None, "t"),
    ({"Authorization": "Bearer a"}, "x-tenant", None, '[["authorization","Bearer a"]]', None),
    ({"Authorization": "Bearer a", "x-tenant": "t"}, "", None, '[["authorization","Bearer a"]]', None),
    ({"x-tenant": "t\udcff"}, "x-tenant", None, None, "t\udcff"),
])
def test_namespace_for(headers: dict[str, str], tenant_header: str | None, model: str | None, credential: str | None,
                       tenant: str | None) -> None:
    assert presented_credentials(headers) == credential
    assert namespace_for(headers, tenant_header, model) == tenant_namespace(credential, tenant, model)


def test_namespace_for_separates_credentials_not_header_order() -> None:
    one = namespace_for({"Authorization": "Bearer a", "x-api-key": "b", "x-tenant": "t"}, "x-tenant", "m")
    assert one == namespace_for(CIMultiDict({"X-Api-Key": "b", "X-Tenant": "t", "authorization": "Bearer a"}),
                                "x-tenant", "m")
    assert one != namespace_for({"Authorization": "Bearer other", "x-api-key": "b", "x-tenant": "t"}, "x-tenant", "m")
    assert one != namespace_for({"Authorization": "Bearer a", "x-api-key": "b", "x-tenant": "u"}, "x-tenant", "m")
    assert one != namespace_for({"Authorization": "Bearer a", "x-api-key": "b", "x-tenant": "t"}, "x-tenant", "n")


def test_namespace_for_takes_the_first_of_differently_cased_tenant_headers() -> None:
    headers = {"X-Tenant": "first", "x-tenant": "second"}
    assert namespace_for(headers, "x-tenant") == tenant_namespace(None, "first")


def test_a_namespace_asked_for_again_is_not_hashed_again() -> None:
    """Every request that may be compacted asks for its namespace: the same few callers, hashed once each."""
    first = tenant_namespace("sk-cached", "team", "model-a")
    hits = tenant_namespace.cache_info().hits
    assert tenant_namespace("sk-cached", "team", "model-a") == first == expected_namespace("sk-cached", "team",
                                                                                           "model-a")
    assert tenant_namespace.cache_info().hits == hits + 1
    assert tenant_namespace("sk-cached", "team", "model-b") != first


def test_tenant_namespace_refuses_a_non_str_field_that_is_not_json() -> None:
    with pytest.raises(TypeError):
        tenant_namespace(b"bytes")  # type: ignore[arg-type]


# --- journal owners: who may read which conversations ------------------------------------------------------------

OWNER_CASES = [
    # (headers of the writer, headers of the reader, the same owner?)
    ({"Authorization": "Bearer k1"}, {"x-api-key": "k1"}, True),
    ({"Authorization": "Bearer k1"}, {"authorization": "BEARER  k1 "}, True),
    ({"Authorization": "Bearer k1"}, {"Authorization": "k1"}, True),
    ({"Authorization": "Bearer k1"}, {"Authorization": "Basic k1"}, False),
    ({"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}, False),
    ({"Authorization": "Bearer k1"}, {"Authorization": "Bearer k1", "x-api-key": "k2"}, False),
    ({"Authorization": "Bearer k1", "x-api-key": "k2"}, {"x-api-key": "k1", "api-key": "k2"}, True),
    ({"Authorization": "Bearer k1", "x-tenant": "a"}, {"Authorization": "Bearer k1", "X-Tenant": "a"}, True),
    ({"Authorization": "Bearer k1", "x-tenant": "a"}, {"Authorization": "Bearer k1", "x-tenant": "A"}, False),
    ({"Authorization": "Bearer k1", "x-tenant": "a"}, {"Authorization": "Bearer k1"}, False),
    ({"Authorization": "Bearer k1", "x-other": "a"}, {"Authorization": "Bearer k1"}, True),  # not the tenant header
    ({}, {"Authorization": "Bearer  "}, True),  # no credential value: the anonymous owner
]


@pytest.mark.parametrize(("writer", "reader", "same"), OWNER_CASES)
def test_journal_owner_is_the_credential_values_and_the_tenant(writer: dict[str, str], reader: dict[str, str],
                                                                same: bool) -> None:
    assert (journal_owner(writer, "x-tenant") == journal_owner(reader, "x-tenant")) is same


def test_journal_owner_never_holds_the_key() -> None:
    owner = journal_owner({"Authorization": "Bearer sk-secret-value"}, None)
    assert len(owner) == 24 and "secret" not in owner and int(owner, 16) >= 0


@pytest.mark.parametrize(("headers", "has"), [({}, False), ({"Authorization": "Bearer "}, False),
                                             ({"x-api-key": "  "}, False), ({"x-api-key": "k"}, True),
                                             ({"x-proxy-api-key": "p"}, True), ({"x-tenant": "a"}, False)])
def test_has_credentials_needs_a_value(headers: dict[str, str], has: bool) -> None:
    assert has_credentials(headers) is has
