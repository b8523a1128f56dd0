"""A JSON object's top-level members read from its ends: the same model as a whole read on any valid object, in any
spelling; the places it looks at; bodies that are not JSON; the bound on tries."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.top_members import MAX_TRIES, members_from

HISTORY = [{"role": "user", "content": "a, \"model\": \"not this\"}"}, {"role": "assistant", "content": "ok"}]
NESTED = {"type": "function", "function": {"name": "f", "parameters": {"model": "nested", "n": [1]}}}


@pytest.mark.parametrize(("body", "members"), [
    (b'{"model":"m","messages":[]}', {"model": "m"}),                            # the first member
    (b' \n{ "model" : "m" }', {"model": "m"}),
    (b'{"messages":[],"model":"m","stream":true}', {"model": "m", "stream": True}),  # after the history
    (b'{"messages": [], "model": "m", "tools": [{"model": "x"}]}', {"model": "m", "tools": [{"model": "x"}]}),
    (json.dumps({"messages": HISTORY, "model": "m"}).encode(), {"model": "m"}),  # a quoted key inside a text
    (json.dumps({"messages": HISTORY, "tools": [NESTED]}).encode(), None),       # only nested ones: read whole
    (b'{"messages":[],"model":"m\\u00e9"}', {"model": "m\u00e9"}),                 # an escape: read from the end
    (b'{"model":"m\\u00e9","messages":[]}', None),                               # ...but it is first: read whole
    (b'{"model":7,"messages":[]}', None),                                         # not a string first: read whole
    (b'{"messages":[],"model":7}', {"model": 7}),                                 # last: as it is
    (b'{"messages":[]}', None),
    (b'', None),
    (b'"model"', None),
    (b'{"model":"\xff"}', None),                                                    # not UTF-8
    (b'["model", "model":]', None),
    (b'{"a": {"model": "x"}}', None),
    (b'{"a": {"b": 1, "model": "x"}}', None),                                     # nested after a comma
    (b'{"a": [], "model": "m"', None),                                            # cut short: not an object
])
def test_the_members_found_at_a_bodys_ends(body: bytes, members: dict[str, Any] | None) -> None:
    assert members_from(body, "model") == members


def test_keys_are_tried_from_the_end_a_bounded_number_of_times() -> None:
    nested = [{"model": str(each), "x": 1} for each in range(MAX_TRIES)]
    within = orjson.dumps({"messages": [], "model": "m", "tools": nested[:-1]})
    beyond = orjson.dumps({"messages": [], "model": "m", "tools": nested})
    assert members_from(within, "model") == {"model": "m", "tools": nested[:-1]}
    assert members_from(beyond, "model") is None


_KEYS = st.sampled_from(["model", "messages", "role", "content", "n", "tools", "x"])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=12),
                     st.sampled_from(['"model":', ',"model":"x"}', "\\", "model", '{"model":1}']))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
                       max_leaves=20)


@given(payload=st.dictionaries(_KEYS, _VALUES, max_size=6), model=st.one_of(st.none(), _SCALARS),
       first=st.booleans(), spaced=st.booleans())
def test_a_valid_object_gives_the_model_a_whole_read_gives(payload: dict[str, Any], model: object, first: bool,
                                                            spaced: bool) -> None:
    payload.pop("model", None)
    if model is not None:
        payload = {"model": model, **payload} if first else {**payload, "model": model}
    body = json.dumps(payload, separators=(", ", ": ") if spaced else (",", ":")).encode()
    found = members_from(body, "model")
    if found is not None:
        assert found.get("model") == payload.get("model")
        assert found.items() <= payload.items()  # members of the outermost object only, as they are
    if model is not None and not first and len(payload) > 1:
        assert found is not None  # a last member after another is always found


@given(st.binary(max_size=300))
def test_any_bytes_give_members_or_none(body: bytes) -> None:
    found = members_from(body, "model")
    assert found is None or isinstance(found, dict)
