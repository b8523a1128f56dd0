"""proxy.dialects.call: what every dialect reads the same way: the JSON object, and the client's compaction mode."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from proxy.dialects.call import MODES, JsonCall, client_mode, json_object
from proxy.errors import BadRequest


@pytest.mark.parametrize(("header", "mode"), [
    (None, ""), ("auto", "auto"), (" FORCE ", "force"), ("shadow", "shadow"), ("off", "off"), ("", ""),
])
def test_the_clients_mode_is_read_and_not_forwarded(header: str | None, mode: str) -> None:
    headers = CIMultiDict({"Authorization": "Bearer k", **({"X-Compaction-Mode": header} if header is not None
                                                            else {})})
    read, forwarded = client_mode(headers)
    assert read == mode and (not read or read in MODES)
    assert "x-compaction-mode" not in forwarded and forwarded["authorization"] == "Bearer k"
    assert "x-compaction-mode" in headers or header is None  # the client's own headers are not changed


@pytest.mark.parametrize("header", ["sometimes", "auto,off", "0"])
def test_an_unknown_mode_is_a_bad_request_naming_the_header(header: str) -> None:
    with pytest.raises(BadRequest) as refused:
        client_mode({"x-compaction-mode": header})
    assert refused.value.param == "x-compaction-mode"


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"3", b"null"])
def test_a_body_that_is_not_an_object_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest, match="JSON object"):
        json_object(body)


def test_an_object_is_read() -> None:
    assert json_object(b'{"model": "m", "n": 1}') == {"model": "m", "n": 1}


@pytest.mark.parametrize(("payload", "expected"), [
    ({"a": 5}, 5), ({"a": 0, "b": 7}, 7), ({"a": True, "b": "9"}, None), ({"a": -1}, None), ({"b": 2.0}, None),
    ({}, None),
])
def test_the_first_whole_number_above_zero(payload: dict[str, object], expected: int | None) -> None:
    call = JsonCall.parse(json.dumps(payload).encode(), {}, "")
    assert call.positive("a", "b") == expected
    assert (call.model, call.stream) == ("", False)
