"""proxy.dialects.messages_blocks: Anthropic messages to the neutral view and back, read totally, rendered validly."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.tokens import TokenCounter
from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.messages_blocks import alternate, alternating, render, view_of_messages
from proxy.summarizer.transcript import format_message_for_compacting

CACHE = {"cache_control": {"type": "ephemeral"}}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBOR"}
PNG_URL = "data:image/png;base64,iVBOR"
USE = {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py"}}
ASKS = {"role": "assistant", "content": [USE]}
CALL = {"id": "t1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.py"}'}}
SUMMARY = {"role": "user", "content": "Summary of the conversation so far."}
ACK = {"role": "assistant", "content": "Understood."}


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def neutral(value: Any) -> list[dict[str, Any]]:
    view = view_of_messages(value)
    assert view is not None
    return view.messages


@pytest.mark.parametrize(("message", "expected"), [
    pytest.param({"role": "user", "content": "hi"}, [{"role": "user", "content": "hi"}], id="user string"),
    pytest.param(user({"type": "text", "text": "a", **CACHE}, {"type": "text", "text": "b"}),
                 [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 id="user text blocks, cache_control ignored"),
    pytest.param(user({"type": "image", "source": PNG}),
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]}],
                 id="base64 image"),
    pytest.param(user({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}),
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
                 id="url image"),
    pytest.param(user({"type": "image", "source": {"type": "file", "file_id": "f_1"}}),
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file_id:f_1"}}]}],
                 id="file image"),
    pytest.param({"role": "assistant", "content": "hello"}, [{"role": "assistant", "content": "hello"}],
                 id="assistant string"),
    pytest.param({"role": "assistant", "content": [{"type": "text", "text": "on it", **CACHE}, USE]},
                 [{"role": "assistant", "content": [{"type": "text", "text": "on it"}], "tool_calls": [CALL]}],
                 id="assistant text and tool_use"),
    pytest.param(ASKS, [{"role": "assistant", "content": None, "tool_calls": [CALL]}], id="tool_use alone"),
    pytest.param({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n",
                                                    "input": {"q": "é", "n": [1, 2.5, None]}}]},
                 [{"role": "assistant", "content": None, "tool_calls": [{
                     "id": "t", "type": "function",
                     "function": {"name": "n", "arguments": '{"q":"é","n":[1,2.5,null]}'}}]}],
                 id="arguments are compact JSON"),
    pytest.param({"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                                   {"type": "redacted_thinking", "data": "xx"},
                                                   {"type": "text", "text": "ok"}]},
                 [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                                    {"type": "redacted_thinking", "data": "xx"},
                                                    {"type": "text", "text": "ok"}]}],
                 id="thinking kept as parts"),
    pytest.param({"role": "assistant", "content": []}, [{"role": "assistant", "content": ""}], id="empty assistant"),
    pytest.param({"role": "user", "content": []}, [{"role": "user", "content": []}], id="empty user"),
])
def test_a_message_maps_onto_neutral_messages(message: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    view = view_of_messages([message])
    assert view is not None
    assert view.messages == expected
    assert [group.items for group in view.groups] == [(message,)]


def test_arguments_nested_deeper_than_json_recurses_are_still_written() -> None:
    deep: dict[str, Any] = {}
    for _ in range(3000):
        deep = {"a": deep}
    use = {"type": "tool_use", "id": "t", "name": "n", "input": deep}
    [message] = neutral([{"role": "assistant", "content": [use]}])
    assert message["tool_calls"][0]["function"]["arguments"] == '{"a":' * 3000 + "{}" + "}" * 3000


def test_a_document_is_a_file_part_named_by_its_title_or_source() -> None:
    titled = {"type": "document", "title": "spec.pdf", "source": {"type": "base64", "media_type": "application/pdf",
                                                                 "data": "JVBER"}}
    plain = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    parts = neutral([user(titled, plain)])[0]["content"]
    assert [part["type"] for part in parts] == ["file", "file"]
    assert [part["file"]["filename"] for part in parts] == ["spec.pdf", "text"]


@pytest.mark.parametrize(("result", "tool"), [
    pytest.param({"content": "42"}, {"content": "42"}, id="string"),
    pytest.param({}, {"content": ""}, id="no content"),
    pytest.param({"content": [{"type": "text", "text": "a"}, {"type": "image", "source": PNG},
                              {"type": "text", "text": "b"}]},
                 {"content": "a\n[image]\nb"}, id="blocks, the image as a mark"),
    pytest.param({"content": "boom", "is_error": True}, {"content": "boom", "is_error": True}, id="an error"),
])
def test_tool_results_become_tool_messages_before_the_user_text(result: dict[str, Any], tool: dict[str, Any]) -> None:
    answer = user({"type": "tool_result", "tool_use_id": "t1", **result}, {"type": "text", "text": "go on"})
    view = view_of_messages([{"role": "user", "content": "read a.py"}, ASKS, answer])
    assert view is not None
    assert view.messages[2:] == [{"role": "tool", "tool_call_id": "t1", **tool},
                                 {"role": "user", "content": [{"type": "text", "text": "go on"}]}]
    assert view.groups[2].items == (answer,) and len(view.groups[2].messages) == 2


def test_results_alone_make_no_user_message() -> None:
    answer = user({"type": "tool_result", "tool_use_id": "t1", "content": "x"})
    assert neutral([{"role": "user", "content": "go"}, ASKS, answer])[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "x"}]


def test_reasoning_counts_nothing_and_is_never_shown_to_the_summariser() -> None:
    thought = {"type": "thinking", "thinking": "a secret plan " * 50, "signature": "s" * 200}
    with_it, without = neutral([{"role": "assistant", "content": [thought, {"type": "text", "text": "ok"}]},
                                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}])
    counter = TokenCounter()
    assert counter.count_message(with_it) == counter.count_message(without)
    assert "secret" not in format_message_for_compacting(with_it)


def result(call_id: Any = "t1") -> dict[str, Any]:
    return user({"type": "tool_result", "tool_use_id": call_id, "content": "x"})


@pytest.mark.parametrize("value", [
    pytest.param(None, id="null"), pytest.param({}, id="object"), pytest.param([], id="empty"),
    pytest.param(["hi"], id="not a message"),
    pytest.param([{"role": "system", "content": "x"}], id="system role"),
    pytest.param([{"role": ["user"], "content": "x"}], id="unhashable role"),
    pytest.param([{"role": "user"}], id="no content"),
    pytest.param([{"role": "user", "content": 3}], id="number content"),
    pytest.param([user("text")], id="a string block"),
    pytest.param([user({"type": "text", "text": 1})], id="text not a string"),
    pytest.param([user({"type": {"t": 1}})], id="unhashable type"),
    pytest.param([user({"type": "search_result", "source": "s", "title": "t", "content": []})], id="search_result"),
    pytest.param([user({"type": "container_upload", "file_id": "f"})], id="container_upload"),
    pytest.param([user({"type": "image", "source": {"type": "base64", "data": "x"}})], id="image without type"),
    pytest.param([user({"type": "document", "source": {"type": "zip"}})], id="unknown document source"),
    pytest.param([user({"type": "thinking", "thinking": "t", "signature": "s"})], id="thinking from the user"),
    pytest.param([{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search",
                                                     "input": {}}]}], id="server_tool_use"),
    pytest.param([{"role": "assistant", "content": [{"type": "web_search_tool_result", "tool_use_id": "s",
                                                     "content": []}]}], id="web_search_tool_result"),
    pytest.param([{"role": "assistant", "content": [{"type": "image", "source": PNG}]}], id="assistant image"),
    pytest.param([{"role": "assistant", "content": [{"type": "tool_use", "name": "n", "input": {}}]}], id="no id"),
    pytest.param([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}], id="no name"),
    pytest.param([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": "x"}]}],
                 id="input not an object"),
    pytest.param([{"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}], id="no signature"),
    pytest.param([{"role": "assistant", "content": [{"type": "redacted_thinking"}]}], id="redacted without data"),
    pytest.param([{"role": "user", "content": "go"}, ASKS, result(7)], id="result id not a string"),
    pytest.param([result()], id="result with no call before"),
    pytest.param([ASKS, result("t2")], id="result answers another call"),
    pytest.param([ASKS, {"role": "user", "content": "wait"}, result()], id="result not right after its call"),
    pytest.param([ASKS, user(*result()["content"], *result()["content"])], id="one call answered twice"),
    pytest.param([ASKS, user({"type": "tool_result", "tool_use_id": "t1",
                              "content": [{"type": "search_result", "content": []}]})], id="search_result in a result"),
    pytest.param([ASKS, user({"type": "tool_result", "tool_use_id": "t1", "content": {"text": "x"}})],
                 id="result content an object"),
])
def test_anything_else_is_not_compactable(value: Any) -> None:
    assert view_of_messages(value) is None


@pytest.mark.parametrize(("made", "expected"), [
    pytest.param([SUMMARY, ACK], [{"role": "user", "content": [{"type": "text", "text": SUMMARY["content"]}]},
                                  {"role": "assistant", "content": [{"type": "text", "text": "Understood."}]}],
                 id="summary and acknowledgement"),
    pytest.param([{"role": "tool", "tool_call_id": "a", "content": "[elided]"},
                  {"role": "tool", "tool_call_id": "b", "content": "[elided]", "is_error": True},
                  {"role": "user", "content": "next"}],
                 [{"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": "a", "content": "[elided]"},
                     {"type": "tool_result", "tool_use_id": "b", "content": "[elided]", "is_error": True},
                     {"type": "text", "text": "next"}]}],
                 id="results and the user text in one message"),
    pytest.param([{"role": "system", "content": "rules"}, SUMMARY],
                 [{"role": "user", "content": [{"type": "text", "text": "rules"},
                                               {"type": "text", "text": SUMMARY["content"]}]}],
                 id="instructions become user text"),
    pytest.param([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "a", "content": "r"}],
                 [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"},
                                               {"type": "text", "text": "x"}]}],
                 id="results go first"),
    pytest.param([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": ""}, ACK],
                 [{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "Understood."}]}],
                 id="one role merged, empty text dropped"),
    pytest.param([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "image_url", "image_url": {"url": "file_id:f_1"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "file", "file": {"filename": "n.pdf"}}, {"type": "thinking", "thinking": "t"}]}],
                 [{"role": "user", "content": [{"type": "image", "source": PNG},
                                               {"type": "image", "source": {"type": "file", "file_id": "f_1"}},
                                               {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                                               {"type": "text", "text": "[document: n.pdf]"}]}],
                 id="images back to sources"),
])
def test_render(made: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert render(made) == expected


@pytest.mark.parametrize(("arguments", "input_"), [
    ('{"path": "a.py"}', {"path": "a.py"}), ("[1, 2]", {"raw": "[1, 2]"}), ("not json", {"raw": "not json"}),
    ("", {}), (None, {}), ({"k": 1}, {"k": 1}), ("[" * 5000, {"raw": "[" * 5000}),
])
def test_render_tool_calls_as_tool_use_with_an_object_input(arguments: Any, input_: dict[str, Any]) -> None:
    call = {"id": "t9", "type": "function", "function": {"name": "f", "arguments": arguments}}
    assert render([{"role": "assistant", "content": "x", "tool_calls": [call, "junk"]}]) == [
        {"role": "assistant", "content": [{"type": "text", "text": "x"},
                                          {"type": "tool_use", "id": "t9", "name": "f", "input": input_}]}]


def test_a_split_group_renders_its_document_and_thinking_back() -> None:
    document = {"type": "document", "source": {"type": "url", "url": "https://x/d.pdf"}, **CACHE}
    thought = {"type": "thinking", "thinking": "t", "signature": "s"}
    view = view_of_messages([{"role": "assistant", "content": [thought, {"type": "text", "text": "a"}]},
                             user({"type": "text", "text": "see"}, document)])
    assert view is not None
    assert render(view.messages) == [{"role": "assistant", "content": [thought, {"type": "text", "text": "a"}]},
                                     {"role": "user", "content": [{"type": "text", "text": "see"}, document]}]


def test_alternate_merges_neighbours_and_keeps_the_rest() -> None:
    first, second = {"role": "user", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "q"}]}
    answer, last = {"role": "assistant", "content": "a"}, {"role": "user", "content": "b", "extra": 1}
    merged = alternate([first, second, answer, last])
    assert merged == [{"role": "user", "content": [{"type": "text", "text": "s"}, {"type": "text", "text": "q"}]},
                      answer, last]
    assert merged[1] is answer and merged[2] is last
    assert first == {"role": "user", "content": "s"} and second["content"] == [{"type": "text", "text": "q"}]


def test_alternate_leaves_what_it_cannot_merge() -> None:
    odd = [{"role": "user", "content": None}, {"role": "user", "content": "x"}, "junk", "junk"]
    assert alternate(odd) == odd


def said(roles: str) -> list[dict[str, Any]]:
    """Messages of the roles' initials (u, a), each of its own words."""
    return [{"role": {"u": "user", "a": "assistant"}[initial], "content": f"words {n}"}
            for n, initial in enumerate(roles)]


def looked_at_whole(front: list[dict[str, Any]], messages: list[dict[str, Any]], kept_from: int) -> bool:
    """The definition, for a front whose own roles alternate (render's)."""
    roles = [message["role"] for message in [*front, *messages[kept_from:]]]
    return all(first != second for first, second in itertools.pairwise(roles))


@pytest.mark.parametrize(("front", "messages", "kept_from", "expected"), [
    ("ua", "uauaua", 2, True),
    ("u", "uauaua", 2, False),  # the summary (a user message) meets a kept user message: forwarded merges them
    ("ua", "uuauaa", 2, False),  # two assistant messages at the end
    ("ua", "uuuaua", 2, True),  # the first kept message repeats the role of the one before it: that one is gone
    ("ua", "uauuau", 2, False),  # the first kept message and the next share a role
    ("u", "uuuaua", 3, True),
    ("uau", "uuaua", 2, True),
    ("", "uaau", 1, False),  # nothing in front
    ("", "uaua", 1, True),
])
def test_alternating_tells_whether_front_then_the_kept_messages_alternate(front: str, messages: str,
                                                                         kept_from: int, expected: bool) -> None:
    assert alternating(said(front), said(messages), kept_from) is expected
    bodies = BodyMemo(min_bytes=64, key_bytes=64)
    read = bodies.read(orjson.dumps({"model": "m", "messages": said(messages)}), "messages")["messages"]
    assert view_of_messages(read, bodies) is not None
    assert alternating(said(front), read, kept_from, bodies) is expected


@settings(max_examples=80, deadline=None)
@given(first=st.text("ua", min_size=2, max_size=10), grown=st.text("ua", max_size=4),
       front=st.sampled_from(["", "u", "a", "ua", "au", "uau"]), data=st.data())
def test_alternating_from_a_kept_read_is_the_look_at_every_message(first: str, grown: str, front: str,
                                                                    data: st.DataObject) -> None:
    """An agent's history resent, grown by a turn, through the body memo: what the kept read noted of the messages
    it read gives the answer a look at every kept message gives, wherever the summary's cut falls."""
    bodies = BodyMemo(min_bytes=64, key_bytes=64)
    for roles in (first, first + grown):
        read = bodies.read(orjson.dumps({"model": "m", "messages": said(roles)}), "messages")["messages"]
        assert view_of_messages(read, bodies) is not None
        assert bodies.kept_read(read, resuming=False) is not None  # what alternating goes on from
        kept_from = data.draw(st.integers(0, len(roles) - 1), label="kept_from")
        assert alternating(said(front), read, kept_from, bodies) is \
            looked_at_whole(said(front), read, kept_from)
    assert bodies.intact()


# --- properties ---------------------------------------------------------------------------------------------------

texts = st.text(min_size=1, max_size=12)
caches = st.sampled_from([{}, CACHE])
text_blocks = st.builds(lambda text, cache: {"type": "text", "text": text, **cache}, texts, caches)
image_sources = st.sampled_from([PNG, {"type": "url", "url": "https://x/i.png"}, {"type": "file", "file_id": "f"}])
images = st.builds(lambda source, cache: {"type": "image", "source": source, **cache}, image_sources, caches)
documents = st.builds(lambda source, title: {"type": "document", "source": source, **title},
                      st.sampled_from([{"type": "base64", "media_type": "application/pdf", "data": "JVB"},
                                       {"type": "text", "media_type": "text/plain", "data": "d"},
                                       {"type": "content", "content": [{"type": "text", "text": "c"}]},
                                       {"type": "url", "url": "https://x/d.pdf"}, {"type": "file", "file_id": "f"}]),
                      st.sampled_from([{}, {"title": "t.pdf"}]))
user_blocks = st.one_of(text_blocks, images, documents)
reasoning = st.sampled_from([[], [{"type": "thinking", "thinking": "hm", "signature": "s"}],
                             [{"type": "redacted_thinking", "data": "r"}]])
inputs = st.dictionaries(st.text(max_size=4), st.none() | st.integers() | st.text(max_size=4), max_size=3)
result_contents = st.one_of(st.just({}), texts.map(lambda text: {"content": text}),
                            st.lists(st.one_of(text_blocks, images), max_size=2).map(lambda b: {"content": b}))


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid Messages histories: user and assistant turns, tool calls answered in the next message, ending on a
    user message, sometimes two user messages in a row (the API takes them as one turn)."""
    ids = (f"toolu_{n}" for n in itertools.count())
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for turn in range(draw(st.integers(0, 5)) + 1):
        results = [{"type": "tool_result", "tool_use_id": call_id, **draw(result_contents),
                    **draw(st.sampled_from([{}, {"is_error": True}]))} for call_id in pending]
        extra = draw(st.lists(user_blocks, max_size=2))
        if not results and not extra:
            messages.append({"role": "user", "content": draw(texts)})
        else:
            messages.append(user(*results, *extra))
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(st.one_of(texts, st.lists(text_blocks, min_size=1)))})
        if turn == 0 and messages and draw(st.booleans()):
            continue  # another user message first, before any answer
        uses = [{"type": "tool_use", "id": next(ids), "name": draw(st.sampled_from(["read", "run"])),
                 "input": draw(inputs), **draw(caches)} for _ in range(draw(st.integers(0, 3)))]
        blocks = draw(reasoning) + draw(st.lists(text_blocks, max_size=2)) + uses
        messages.append({"role": "assistant", "content": blocks or draw(texts)})
        pending = [use["id"] for use in uses]
    messages.append(user(*[{"type": "tool_result", "tool_use_id": call_id, "content": "done"}
                           for call_id in pending], {"type": "text", "text": "and now?"}))
    return messages


USER_BLOCKS = ("text", "image", "document", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")


def assert_valid(items: list[Any]) -> None:
    """What the Messages API checks of `messages`: alternating roles from a user, no empty text, each message's tool
    results first and answering exactly the calls of the assistant message before."""
    assert items and items[0]["role"] == "user"
    calls: list[str] = []
    for index, message in enumerate(items):
        assert message["role"] in ("user", "assistant")
        assert index == 0 or message["role"] != items[index - 1]["role"]
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        assert blocks and all(block["text"] for block in blocks if block["type"] == "text")
        if message["role"] == "user":
            kinds = [block["type"] for block in blocks]
            answered = [block["tool_use_id"] for block in blocks if block["type"] == "tool_result"]
            assert set(kinds) <= set(USER_BLOCKS) and kinds[:len(answered)] == ["tool_result"] * len(answered)
            assert sorted(answered) == sorted(calls)
            calls = []
        else:
            assert not calls and all(block["type"] in ASSISTANT_BLOCKS for block in blocks)
            calls = [block["id"] for block in blocks if block["type"] == "tool_use"]
            assert all(isinstance(block["input"], dict) for block in blocks if block["type"] == "tool_use")
    assert not calls


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_untouched_messages_go_back_as_they_came(messages: list[dict[str, Any]]) -> None:
    snapshot = copy.deepcopy(messages)
    assert_valid(alternate(messages))  # the generator makes what the API takes
    view = view_of_messages(messages)
    assert view is not None
    back = view.back(view.messages, render)
    assert back == snapshot and all(a is b for a, b in zip(back, messages, strict=True))
    if all(a["role"] != b["role"] for a, b in itertools.pairwise(messages)):  # nothing to merge: nothing copied
        assert all(a is b for a, b in zip(alternate(back), messages, strict=True))
    assert messages == snapshot  # nothing read was changed


@settings(max_examples=300, deadline=None)
@given(conversations(), st.booleans())
def test_a_summary_in_place_of_any_prefix_gives_valid_messages(messages: list[dict[str, Any]], ack: bool) -> None:
    view = view_of_messages(messages)
    assert view is not None
    starts = [k for k, message in enumerate(view.messages) if message["role"] in ("user", "assistant")]
    for k in starts:
        kept = view.messages[k:]
        items = alternate(view.back([SUMMARY, *([ACK] if ack else []), *kept], render))
        assert_valid(items)
        # Assistant messages after the first kept one meet no neighbour of their role: they go back as they came.
        later_ids = {id(message) for message in kept[1:]}
        later = [group.items[0] for group in view.groups if id(group.messages[0]) in later_ids]
        assert all(any(item is message for item in items) for message in later if message["role"] == "assistant")


@settings(max_examples=200, deadline=None)
@given(conversations(), st.data())
def test_placeholders_for_tool_results_give_valid_messages(messages: list[dict[str, Any]], data: st.DataObject) -> None:
    view = view_of_messages(messages)
    assert view is not None
    history = [{**message, "content": "[elided]"} if message["role"] == "tool" and data.draw(st.booleans()) else message
               for message in view.messages]
    items = alternate(view.back(history, render))
    assert_valid(items)
    rendered = [block for item in items if isinstance(item["content"], list) for block in item["content"]
                if block["type"] == "tool_result" and block.get("content") == "[elided]"]
    assert len(rendered) == sum(message is not original for message, original in zip(history, view.messages,
                                                                                       strict=True))


@st.composite
def made_runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Neutral messages compaction could make or keep: a summary first, then text turns, instructions, and tool
    calls with their results (some as placeholders), in any chat-valid order."""
    run: list[dict[str, Any]] = [SUMMARY]
    call_ids = (f"call_{n}" for n in itertools.count())
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["user", "system", "assistant", "calls"]))
        if kind != "calls":
            run.append({"role": kind, "content": draw(st.one_of(texts, st.lists(
                texts.map(lambda text: {"type": "text", "text": text}), min_size=1)))})
            continue
        ids = [next(call_ids) for _ in range(draw(st.integers(1, 3)))]
        arguments = st.one_of(st.text(max_size=8), inputs.map(json.dumps))
        run.append({"role": "assistant", "content": draw(st.none() | texts), "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "f", "arguments": draw(arguments)}}
            for call_id in ids]})
        run += [{"role": "tool", "tool_call_id": call_id, "content": draw(texts)}
                for call_id in draw(st.permutations(ids))]
    return run


@settings(max_examples=300, deadline=None)
@given(made_runs())
def test_rendered_runs_are_valid_messages(run: list[dict[str, Any]]) -> None:
    items = render(run)
    assert_valid(items)
    assert alternate(items) == items  # already alternating
    uses = [block for item in items for block in item["content"] if block["type"] == "tool_use"]
    calls = [call for message in run for call in message.get("tool_calls", [])]
    assert [use["id"] for use in uses] == [call["id"] for call in calls]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                           max_size=4),
                           max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_read_without_error(value: Any) -> None:
    shapes = [{"role": "user", "content": [value]}], [{"role": "assistant", "content": value}]
    for candidate in (value, [value], *shapes):
        view = view_of_messages(candidate)
        if view is not None:
            assert view.back(view.messages, render) == candidate
    render([value] if isinstance(value, dict) else [{"role": "user", "content": value}])
    alternate([value, value] if isinstance(value, dict) else [])


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a JSON value (keys and indexes from the top)."""
    found = [prefix]
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in children:
        found += paths(child, (*prefix, key))
    return found


@settings(max_examples=500, deadline=None)
@given(conversations(), st.data(), json_values)
def test_a_valid_history_broken_anywhere_is_read_without_error(messages: list[dict[str, Any]], data: st.DataObject,
                                                               junk: Any) -> None:
    messages = copy.deepcopy(messages)  # the generator shares constants (PNG, CACHE) between draws
    where = data.draw(st.sampled_from(paths(messages)[1:]))
    target: Any = messages
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = junk
    view = view_of_messages(messages)
    if view is not None:
        assert view.back(view.messages, render) == messages
        render(view.messages)
