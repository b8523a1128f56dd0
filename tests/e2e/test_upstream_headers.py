"""Header rules both ways: hop-by-hop headers dropped, end-to-end headers kept, keys and encodings handled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict
from yarl import URL

from proxy.app import RunningServer
from proxy.config import UpstreamConfig
from proxy.upstream.upstream import ACCEPT_ENCODING, Upstream, request_headers, response_headers
from tests.fakes.openai_upstream import FakeUpstream

HOP_BY_HOP = [
    ("Connection", "keep-alive"),
    ("Keep-Alive", "timeout=5, max=100"),
    ("Proxy-Connection", "keep-alive"),
    ("Proxy-Authenticate", "Basic realm=gateway"),
    ("Proxy-Authorization", "Basic dXNlcjpwYXNz"),
    ("TE", "trailers"),
    ("Trailer", "X-Checksum"),
    ("Transfer-Encoding", "chunked"),
    ("Upgrade", "h2c"),
]
END_TO_END = [
    ("Content-Type", "application/json"),
    ("x-request-id", "req_42"),
    ("OpenAI-Organization", "org-1"),
    ("openai-processing-ms", "7"),
    ("x-ratelimit-remaining-tokens", "149000"),
    ("retry-after", "3"),
    ("anthropic-version", "2023-06-01"),
    ("User-Agent", "OpenAI/Python 1.40"),
]


def names(headers: Mapping[str, str]) -> set[str]:
    return {name.lower() for name in headers}


def both_ways(headers: Mapping[str, str]) -> list[CIMultiDict[str]]:
    return [request_headers(headers, None), request_headers(headers, "sk-proxy"),
            response_headers(headers, decoded=False), response_headers(headers, decoded=True)]


@pytest.mark.parametrize(("name", "value"), HOP_BY_HOP)
@pytest.mark.parametrize("case", [str, str.lower, str.upper])
def test_hop_by_hop_headers_are_dropped_both_ways(name: str, value: str, case: type[str]) -> None:
    headers = CIMultiDict([(case(name), value), ("x-request-id", "req_1")])
    for result in both_ways(headers):
        assert name.lower() not in names(result)
        assert result["x-request-id"] == "req_1"


@pytest.mark.parametrize("incoming", [
    CIMultiDict([("Connection", "close, X-Internal-Trace"), ("X-Internal-Trace", "abc"), ("x-keep", "1")]),
    CIMultiDict([("Connection", "keep-alive"), ("connection", " x-internal-trace ,, "),
                 ("x-internal-trace", "abc"), ("X-Keep", "1")]),
    {"Connection": "X-Internal-Trace", "X-Internal-Trace": "abc", "X-Keep": "1"},
], ids=["one-value", "repeated-connection", "plain-dict"])
def test_headers_named_in_connection_are_dropped(incoming: Mapping[str, str]) -> None:
    for result in both_ways(incoming):
        assert "x-internal-trace" not in names(result) and "connection" not in names(result)
        assert result["x-keep"] == "1"


@pytest.mark.parametrize(("name", "value"), END_TO_END)
def test_end_to_end_headers_are_kept_both_ways(name: str, value: str) -> None:
    for result in both_ways(CIMultiDict([(name, value), ("Connection", "close")])):
        assert result.getall(name) == [value]


@pytest.mark.parametrize(("name", "value"), [
    ("Host", "proxy.internal:8080"),
    ("Content-Length", "1234"),
    ("Content-Encoding", "gzip"),     # the server already decoded the request body the proxy forwards
])
def test_request_drops_what_the_client_recomputes(name: str, value: str) -> None:
    result = request_headers(CIMultiDict([(name, value), ("Content-Type", "application/json")]), None)
    assert name.lower() not in names(result) and result["Content-Type"] == "application/json"


@pytest.mark.parametrize("client_value", [None, "br", "gzip, deflate, br, zstd", "identity"])
def test_accept_encoding_is_what_the_proxy_decodes(client_value: str | None) -> None:
    incoming = CIMultiDict() if client_value is None else CIMultiDict([("Accept-Encoding", client_value)])
    result = request_headers(incoming, None)
    assert result.getall("accept-encoding") == [ACCEPT_ENCODING] == ["gzip, deflate"]


@pytest.mark.parametrize(("incoming", "api_key", "expected_authorization", "expected_x_api_key"), [
    ([("Authorization", "Bearer sk-client")], None, ["Bearer sk-client"], []),
    ([("x-api-key", "sk-client")], None, [], ["sk-client"]),
    ([("Authorization", "Bearer sk-client"), ("X-Api-Key", "sk-client")], None, ["Bearer sk-client"], ["sk-client"]),
    ([], None, [], []),
    ([("Authorization", "Bearer sk-client")], "sk-proxy", ["Bearer sk-proxy"], []),
    ([("authorization", "Bearer a"), ("Authorization", "Bearer b")], "sk-proxy", ["Bearer sk-proxy"], []),
    ([("X-API-KEY", "sk-client")], "sk-proxy", ["Bearer sk-proxy"], []),
    ([], "sk-proxy", ["Bearer sk-proxy"], []),
    ([("Authorization", "Bearer sk-client")], "", ["Bearer sk-client"], []),
])
def test_configured_api_key_replaces_the_clients(incoming: list[tuple[str, str]], api_key: str | None,
                                                 expected_authorization: list[str],
                                                 expected_x_api_key: list[str]) -> None:
    result = request_headers(CIMultiDict(incoming), api_key)
    assert result.getall("authorization", []) == expected_authorization
    assert result.getall("x-api-key", []) == expected_x_api_key


def test_request_headers_do_not_mutate_the_input() -> None:
    incoming = CIMultiDict([("Authorization", "Bearer sk-client"), ("Host", "h"), ("Connection", "close")])
    request_headers(incoming, "sk-proxy")
    assert list(incoming.items()) == [("Authorization", "Bearer sk-client"), ("Host", "h"), ("Connection", "close")]


@pytest.mark.parametrize(("decoded", "kept"), [
    (False, {"content-length": "120", "content-encoding": "gzip"}),
    (True, {}),
])
def test_response_length_and_encoding_go_only_when_decoded(decoded: bool, kept: dict[str, str]) -> None:
    upstream = CIMultiDict([("Content-Length", "120"), ("Content-Encoding", "gzip"),
                            ("Content-Type", "application/json")])
    result = response_headers(upstream, decoded=decoded)
    assert {name: result[name] for name in ("content-length", "content-encoding") if name in result} == kept
    assert result["Content-Type"] == "application/json"


def _kept_by_name(headers: list[tuple[str, str]], dropped: set[str]) -> list[tuple[str, str]]:
    """The rule the header steps keep, written the plain way: every header whose lower-cased name is not dropped,
    hop-by-hop or named by any Connection header, in order."""
    named = {token.strip().lower() for name, value in headers if name.lower() == "connection"
             for token in value.split(",")}
    gone = dropped | {name.lower() for name, _ in HOP_BY_HOP} | named
    return [(name, value) for name, value in headers if name.lower() not in gone]


_NAMES = st.sampled_from(["Connection", "Keep-Alive", "TE", "Upgrade", "Content-Length", "Content-Encoding", "Host",
                          "Accept-Encoding", "X-Trace", "x-keep", "Vary", "Set-Cookie", "Transfer-Encoding"])
_CASED = st.tuples(_NAMES, st.sampled_from([str, str.lower, str.upper, str.swapcase])).map(
    lambda pair: pair[1](pair[0]))
_VALUES = st.one_of(st.sampled_from(["close", "x-trace, X-KEEP", " vary ,, upgrade ", "keep-alive", "1", ""]),
                    st.text(alphabet="abc-, ", max_size=12))


@given(st.lists(st.tuples(_CASED, _VALUES), max_size=12))
def test_both_ways_keep_exactly_what_the_plain_rule_keeps(headers: list[tuple[str, str]]) -> None:
    incoming = CIMultiDict(headers)
    assert list(response_headers(incoming, decoded=False).items()) == _kept_by_name(headers, set())
    assert list(response_headers(incoming, decoded=True).items()) == \
        _kept_by_name(headers, {"content-length", "content-encoding"})
    sent = request_headers(incoming, None)
    assert sent.getall("accept-encoding") == [ACCEPT_ENCODING]
    sent.popall("accept-encoding")
    assert list(sent.items()) == _kept_by_name(headers, {"host", "content-length", "content-encoding",
                                                         "accept-encoding", "x-proxy-api-key"})
    assert list(incoming.items()) == headers  # the client's headers are left as they came


@pytest.mark.parametrize("repeated", [
    [("Set-Cookie", "a=1; Path=/"), ("Set-Cookie", "b=2; Path=/")],
    [("x-ratelimit-limit", "100"), ("X-RateLimit-Limit", "200")],
    [("Vary", "Accept"), ("Vary", "Authorization")],
])
def test_repeated_headers_are_kept_in_order(repeated: list[tuple[str, str]]) -> None:
    name = repeated[0][0]
    values = [value for _, value in repeated]
    assert response_headers(CIMultiDict(repeated), decoded=True).getall(name) == values
    assert response_headers(CIMultiDict(repeated), decoded=False).getall(name) == values
    assert request_headers(CIMultiDict(repeated), None).getall(name) == values


@pytest.mark.parametrize(("base_url", "path", "query", "expected"), [
    ("https://api.openai.com/v1", "/chat/completions", "", "https://api.openai.com/v1/chat/completions"),
    ("https://api.openai.com/v1/", "/models", "", "https://api.openai.com/v1/models"),
    ("http://gw:8000/v1", "/files/a%2Fb%20c", "", "http://gw:8000/v1/files/a%2Fb%20c"),
    ("http://gw:8000/v1", "/models", "a=1&b=%20x&c=%2B&d=%26", "http://gw:8000/v1/models?a=1&b=%20x&c=%2B&d=%26"),
    ("http://gw:8000/v1", "/x", "q=a+b&q=c&empty=&flag", "http://gw:8000/v1/x?q=a+b&q=c&empty=&flag"),
    ("http://gw:8000/openai/deployments/d", "/chat/completions", "api-version=2024-06-01",
     "http://gw:8000/openai/deployments/d/chat/completions?api-version=2024-06-01"),
])
def test_url_for_keeps_raw_path_and_query(base_url: str, path: str, query: str, expected: str) -> None:
    no_session = cast(aiohttp.ClientSession, None)  # url_for never touches the session
    url = Upstream(no_session, UpstreamConfig(base_url=base_url)).url_for(path, query)
    assert isinstance(url, URL) and str(url) == expected
    assert url.raw_query_string == query
    assert url.raw_path.endswith(path)


@pytest.mark.parametrize(("sent", "arrived"), [
    ({"User-Agent": "OpenAI/Python 1.40"}, ["OpenAI/Python 1.40"]),
    ({"user-agent": "codex_cli_rs/0.171.0"}, ["codex_cli_rs/0.171.0"]),
    ({}, []),  # none sent: none added (not the HTTP client's own), on the compacted route and any other
], ids=["sent", "lower-case", "none"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/echo/agent"])
async def test_the_clients_user_agent_goes_as_it_came_and_none_is_added(
        sent: dict[str, str], arrived: list[str], path: str, fake: FakeUpstream, proxy: RunningServer) -> None:
    # aiohttp's client would add its own to every request: the session cannot send headers without one.
    async with aiohttp.ClientSession(skip_auto_headers=["User-Agent"]) as session:
        body = {"model": "fake-small", "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{proxy.url}{path}", json=body, headers=sent) as answer:
            assert answer.status == 200
    received = fake.requests[-1].headers
    assert [value for name, value in received.items() if name.lower() == "user-agent"] == arrived
