"""proxy.core.credentials: which proxy key a client presents, key matching, and the credential headers kept."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from multidict import CIMultiDict

from proxy.core.credentials import (
    PROXY_KEY_HEADER,
    UPSTREAM_CREDENTIAL_HEADERS,
    credential_headers,
    presented_credentials,
    presented_key,
    presents_one_of,
)


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({PROXY_KEY_HEADER: " proxy-key "}, "proxy-key"),
    ({PROXY_KEY_HEADER: "proxy-key", "Authorization": "Bearer upstream"}, "proxy-key"),
    ({PROXY_KEY_HEADER: "   ", "Authorization": "Bearer upstream"}, "upstream"),
    ({"Authorization": "Bearer tok"}, "tok"),
    ({"Authorization": "bEaReR  tok  "}, "tok"),
    ({"Authorization": "Bearer "}, None),
    ({"Authorization": "Bearer"}, None),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, None),
    ({"Authorization": "Basic dXNlcjpwYXNz", "x-api-key": "xk"}, "xk"),
    ({"Authorization": "Bearer tok", "x-api-key": "xk"}, "tok"),
    ({"x-api-key": ""}, None),
    ({"x-api-key": " xk "}, " xk "),  # the x-api-key fallback is taken as sent, unstripped
    ({PROXY_KEY_HEADER: "k\udcff"}, "k\udcff"),
    ({"Authorization": "Bearer " + "k" * 100_000}, "k" * 100_000),
])
def test_presented_key(headers: dict[str, str], expected: str | None) -> None:
    assert presented_key(headers) == expected


def test_presented_key_folds_header_names_in_a_case_insensitive_mapping() -> None:
    assert presented_key(CIMultiDict({"AUTHORIZATION": "Bearer tok"})) == "tok"
    assert presented_key(CIMultiDict({"X-Proxy-Api-Key": "pk", "authorization": "Bearer tok"})) == "pk"
    assert presented_key(CIMultiDict({"X-API-KEY": "xk"})) == "xk"


KEYS = [b"first", b"second", "ключ".encode(), "k\udcff".encode("utf-8", "surrogatepass")]


@pytest.mark.parametrize(("headers", "expected"), [
    ({"Authorization": "Bearer second"}, True),
    ({PROXY_KEY_HEADER: "first"}, True),
    ({"x-api-key": "ключ"}, True),
    ({PROXY_KEY_HEADER: "k\udcff"}, True),
    ({PROXY_KEY_HEADER: "k\ufffd"}, False),  # a replacement character is not the surrogate
    ({"Authorization": "Bearer secon"}, False),
    ({"Authorization": "Bearer second2"}, False),
    ({"Authorization": "Bearer SECOND"}, False),
    ({"Authorization": "Basic second"}, False),
    ({}, False),
])
def test_presents_one_of(headers: dict[str, str], expected: bool) -> None:
    assert presents_one_of(headers, KEYS) is expected


def test_presents_one_of_without_keys_and_with_a_blank_key() -> None:
    assert presents_one_of({"Authorization": "Bearer first"}, []) is False
    # A blank accepted key matches a client that sends none: why config refuses blank keys.
    assert presents_one_of({}, [b""]) is True


class CountingKeys(list[bytes]):
    def __init__(self, keys: list[bytes]) -> None:
        super().__init__(keys)
        self.seen: list[bytes] = []

    def __iter__(self) -> Iterator[bytes]:
        for key in super().__iter__():
            self.seen.append(key)
            yield key


def test_presents_one_of_compares_every_key_even_after_a_match() -> None:
    keys = CountingKeys([b"first", b"second", b"third"])
    assert presents_one_of({"Authorization": "Bearer first"}, keys) is True
    assert keys.seen == [b"first", b"second", b"third"]


def test_presents_one_of_refuses_str_keys() -> None:
    with pytest.raises(TypeError):
        presents_one_of({"Authorization": "Bearer first"}, ["first"])  # type: ignore[list-item]


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({"Content-Type": "application/json", "OpenAI-Organization": "org"}, None),
    ({"api-key": "   "}, None),
    ({"Authorization": "Bearer a"}, '[["authorization","Bearer a"]]'),
    ({"X-Api-Key": " b ", "Authorization": "Bearer a", "Other": "z"},
     '[["authorization","Bearer a"],["x-api-key","b"]]'),
    ({"API-KEY": "c", PROXY_KEY_HEADER: "p", "x-api-key": "b"},
     '[["api-key","c"],["x-api-key","b"],["x-proxy-api-key","p"]]'),
    ({"Authorization": "Bearer \ud800"}, '[["authorization","Bearer \ud800"]]'),
    ({"Authorization": 'Bearer "quoted" é'}, '[["authorization","Bearer \\"quoted\\" é"]]'),
])
def test_presented_credentials(headers: dict[str, str], expected: str | None) -> None:
    assert presented_credentials(headers) == expected


def test_presented_credentials_ignore_header_order_and_name_case() -> None:
    one = presented_credentials({"Authorization": "Bearer a", "x-api-key": "b"})
    assert one == presented_credentials({"X-API-KEY": "b", "authorization": "Bearer a"})
    assert one != presented_credentials({"Authorization": "Bearer a", "x-api-key": "c"})


def test_presented_credentials_refuse_a_non_str_value() -> None:
    with pytest.raises(AttributeError):
        presented_credentials({"Authorization": None})  # type: ignore[dict-item]


def test_credential_headers_keep_only_what_identifies_the_caller() -> None:
    headers: Mapping[str, str] = CIMultiDict({
        "Authorization": " Bearer a ", "X-Api-Key": "b", "OpenAI-Organization": "org", "openai-project": "proj",
        "Api-Key": "c", PROXY_KEY_HEADER: "proxy", "Content-Type": "application/json", "Cookie": "s=1",
    })
    assert credential_headers(headers) == {"Authorization": " Bearer a ", "X-Api-Key": "b",
                                           "OpenAI-Organization": "org", "openai-project": "proj", "Api-Key": "c"}
    assert credential_headers({}) == {}
    assert PROXY_KEY_HEADER not in UPSTREAM_CREDENTIAL_HEADERS
