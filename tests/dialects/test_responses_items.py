"""proxy.dialects.responses_items: Responses `input` items as the neutral view, mapped back byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter
from proxy.core.view import View
from proxy.dialects.responses_items import as_input_items, render, view_of_input

SUMMARY: Message = {"role": "user", "content": "<summary of earlier turns>"}
ACK: Message = {"role": "assistant", "content": "Understood."}
INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})
OUTPUT_PARTS = frozenset({"output_text", "refusal"})

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}],
             "encrypted_content": "gAAA"}
SAID = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
        "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]}
CALL_A = {"type": "function_call", "call_id": "a", "name": "read", "arguments": '{"path": "x"}'}
CALL_B = {"type": "function_call", "call_id": "b", "name": "ls", "arguments": "{}"}
OUT_A = {"type": "function_call_output", "call_id": "a", "output": "contents"}
OUT_B = {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "x y"}]}
CUSTOM = {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "*** Begin Patch"}
CUSTOM_OUT = {"type": "custom_tool_call_output", "call_id": "c", "output": "Done"}
COMPACTION = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gBBB"}


def text(value: str) -> Message:
    return {"type": "text", "text": value}


def opaque(item: dict[str, Any]) -> Message:
    return {"type": "reasoning", "item": item}


def function(call_id: str, name: str, arguments: str) -> Message:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(("value", "messages"), [
    pytest.param("hi", [{"role": "user", "content": "hi"}], id="a string input is one user message"),
    pytest.param([{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}], id="the short form"),
    pytest.param([{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]}],
                 [{"role": "developer", "content": [text("be brief")]}], id="a developer message with parts"),
    pytest.param([{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
        {"type": "input_image", "file_id": "file-9", "detail": "auto"},
        {"type": "input_file", "file_id": "file-7", "filename": "a.pdf"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
                                      {"type": "image_url", "image_url": {"url": "file_id:file-9", "detail": "auto"}},
                                      {"type": "file", "file": {"filename": "a.pdf", "file_id": "file-7"}}]}],
        id="images and documents"),
    pytest.param([{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "no", "annotations": []}, {"type": "refusal", "refusal": "I can't"}]}],
        [{"role": "assistant", "content": [text("no"), text("I can't")]}], id="an assistant's text and refusal"),
    pytest.param([REASONING, SAID, CALL_A, CALL_B, OUT_A, OUT_B],
                 [{"role": "assistant", "content": [opaque(REASONING), text("Let me look.")],
                   "tool_calls": [function("a", "read", '{"path": "x"}'), function("b", "ls", "{}")]},
                  {"role": "tool", "tool_call_id": "a", "content": "contents"},
                  {"role": "tool", "tool_call_id": "b", "content": [text("x y")]}],
                 id="reasoning, text and parallel calls are one assistant message"),
    pytest.param([CUSTOM, CUSTOM_OUT],
                 [{"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c", "type": "custom",
                                   "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}]},
                  {"role": "tool", "tool_call_id": "c", "content": "Done", "item_type": "custom_tool_call_output"}],
                 id="a custom tool call"),
    pytest.param([REASONING, {"role": "user", "content": "go on"}],
                 [{"role": "assistant", "content": [opaque(REASONING)]}, {"role": "user", "content": "go on"}],
                 id="reasoning followed by no assistant item stands alone"),
    pytest.param([COMPACTION, {"role": "user", "content": "next"}],
                 [{"role": "developer", "content": [opaque(COMPACTION)]}, {"role": "user", "content": "next"}],
                 id="a compaction item is kept like an instruction"),
    pytest.param([CALL_A, OUT_A, CALL_B, OUT_B],
                 [{"role": "assistant", "content": None, "tool_calls": [function("a", "read", '{"path": "x"}')]},
                  {"role": "tool", "tool_call_id": "a", "content": "contents"},
                  {"role": "assistant", "content": None, "tool_calls": [function("b", "ls", "{}")]},
                  {"role": "tool", "tool_call_id": "b", "content": [text("x y")]}],
                 id="a call after a result starts the next turn"),
    pytest.param([SAID, SAID], [{"role": "assistant", "content": [text("Let me look.")]}] * 2,
                 id="two assistant messages are two turns"),
])
def test_items_map_onto_neutral_messages(value: Any, messages: list[Message]) -> None:
    view = view_of_input(value)
    assert view is not None and view.messages == messages
    assert view.back(view.messages, render) == (value if isinstance(value, list) else [value])


@pytest.mark.parametrize("value", [
    pytest.param(None, id="null"), pytest.param(5, id="a number"), pytest.param({"role": "user"}, id="an object"),
    pytest.param([], id="an empty list"), pytest.param(["hi"], id="a bare string item"),
    pytest.param([{"type": "item_reference", "id": "msg_1"}], id="an item reference"),
    pytest.param([{"type": "web_search_call", "id": "ws", "status": "completed"}], id="web search"),
    pytest.param([{"type": "file_search_call", "id": "fs", "queries": [], "status": "completed"}], id="file search"),
    pytest.param([{"type": "computer_call", "call_id": "k", "id": "cu", "action": {}}], id="computer use"),
    pytest.param([{"type": "local_shell_call", "call_id": "k", "id": "sh", "action": {}}], id="local shell"),
    pytest.param([{"type": "mcp_call", "id": "m", "name": "f", "arguments": "{}", "server_label": "s"}], id="mcp"),
    pytest.param([{"type": "image_generation_call", "id": "ig", "result": None}], id="image generation"),
    pytest.param([{"type": "something_new"}], id="an unknown type"),
    pytest.param([{"type": ["message"], "role": "user", "content": "x"}], id="a list as type"),
    pytest.param([{"role": "tool", "content": "x"}], id="an unknown role"),
    pytest.param([{"role": ["user"], "content": "x"}], id="a list as role"),
    pytest.param([{"role": "user", "content": 5}], id="content not text or parts"),
    pytest.param([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], id="an unknown part"),
    pytest.param([{"role": "user", "content": ["x"]}], id="a part not an object"),
    pytest.param([{"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}], id="an image of nothing"),
    pytest.param([{"role": "user", "content": [{"type": "input_text", "text": 3}]}], id="text not a string"),
    pytest.param([OUT_A], id="a result without its call"),
    pytest.param([OUT_A, CALL_A], id="a result before its call"),
    pytest.param([CALL_A, {**OUT_A, "call_id": None}], id="a result without a call id"),
    pytest.param([CALL_A, OUT_A, OUT_A], id="a call answered twice"),
    pytest.param([CALL_A, CALL_A, OUT_A], id="a call id used twice"),
    pytest.param([CALL_A, {**CUSTOM_OUT, "call_id": "a"}], id="a custom result for a function call"),
    pytest.param([{**CALL_A, "name": None}, OUT_A], id="a call without a name"),
    pytest.param([{**CALL_A, "call_id": 1}], id="a call id not a string"),
    pytest.param([{**CALL_A, "arguments": {"path": "x"}}, OUT_A], id="arguments not a string"),
    pytest.param([{**CUSTOM, "input": None}, CUSTOM_OUT], id="a custom call without input"),
    pytest.param([CALL_A, {**OUT_A, "output": None}], id="a result without output"),
    pytest.param([CALL_A, {**OUT_A, "output": [{"type": "nope"}]}], id="a result with an unknown part"),
])
def test_what_is_not_understood_is_not_compactable(value: Any) -> None:
    assert view_of_input(value) is None


@pytest.mark.parametrize(("messages", "items"), [
    pytest.param([SUMMARY, ACK],
                 [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": SUMMARY["content"]}]},
                  {"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": "Understood.", "annotations": []}]}],
                 id="a summary and its acknowledgement"),
    pytest.param([{"role": "tool", "tool_call_id": "a", "content": "[removed]"}],
                 [{"type": "function_call_output", "call_id": "a", "output": "[removed]"}], id="a placeholder"),
    pytest.param([{"role": "tool", "tool_call_id": "c", "content": "[removed]",
                   "item_type": "custom_tool_call_output"}],
                 [{"type": "custom_tool_call_output", "call_id": "c", "output": "[removed]"}],
                 id="a placeholder for a custom tool's result"),
    pytest.param([{"role": "assistant", "content": [opaque(REASONING)],
                   "tool_calls": [function("a", "read", "{}"),
                                  {"id": "c", "type": "custom", "custom": {"name": "sh", "input": "ls"}}]}],
                 [{"type": "function_call", "call_id": "a", "name": "read", "arguments": "{}"},
                  {"type": "custom_tool_call", "call_id": "c", "name": "sh", "input": "ls"}],
                 id="calls are items and reasoning is dropped"),
    pytest.param([{"role": "developer", "content": [opaque(COMPACTION)]}, {"role": "assistant", "content": None}],
                 [], id="nothing left to say says nothing"),
    pytest.param([{"role": "system", "content": [text("a"), {"type": "image_url", "image_url": {"url": "file_id:f"}},
                                                 {"type": "file", "file": {"filename": "n.txt"}}]}],
                 [{"type": "message", "role": "system", "content": [
                     {"type": "input_text", "text": "a"}, {"type": "input_image", "detail": "auto", "file_id": "f"},
                     {"type": "input_text", "text": "[document: n.txt]"}]}],
                 id="an uploaded image, and a document nothing locates"),
    pytest.param([{"role": "tool", "tool_call_id": "a",
                   "content": [{"type": "image_url", "image_url": {"url": "https://i", "detail": "high"}}]}],
                 [{"type": "function_call_output", "call_id": "a",
                   "output": [{"type": "input_image", "detail": "high", "image_url": "https://i"}]}],
                 id="a result with an image"),
    pytest.param([{"role": "function", "name": "f", "content": "x"}, {"role": "tool", "content": "x"}], [],
                 id="results without a call id have no item"),
])
def test_render(messages: list[Message], items: list[dict[str, Any]]) -> None:
    assert render(messages) == items


def test_a_string_input_goes_back_as_a_user_message() -> None:
    view = view_of_input("hello")
    assert view is not None
    back = view.back([SUMMARY, *view.messages], render)
    assert back[1] == "hello"
    assert as_input_items(back)[1] == {"type": "message", "role": "user", "content": "hello"}
    assert as_input_items([OUT_A]) == [OUT_A] and as_input_items([OUT_A])[0] is OUT_A


@pytest.mark.usefixtures("offline")
def test_a_replaced_result_is_rendered_in_place_and_the_rest_goes_back_as_it_came() -> None:
    value = [{"role": "user", "content": "go"}, REASONING, SAID, CALL_A, CALL_B, OUT_A, OUT_B]
    view = view_of_input(value)
    assert view is not None
    history = list(view.messages)
    history[2] = {**history[2], "content": "[removed]"}
    back = view.back(history, render)
    assert back[:5] == value[:5] and all(a is b for a, b in zip(back[:5], value[:5], strict=True))
    assert back[5] == {"type": "function_call_output", "call_id": "a", "output": "[removed]"} and back[6] is OUT_B
    counter = TokenCounter()  # reasoning travels with its group but costs nothing in the count
    assistant = view.messages[1]
    assert counter.count_message(assistant) == counter.count_message({**assistant, "content": [text("Let me look.")]})


# --- properties -------------------------------------------------------------------------------------------------

def problems(items: list[Any]) -> list[str]:
    """What the Responses API would reject in an `input` list (the rules this module must keep)."""
    found: list[str] = []
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for index, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            found += message_problems(item)
        elif kind in ("function_call", "custom_tool_call"):
            body = item.get("arguments" if kind == "function_call" else "input")
            if not all(isinstance(value, str) for value in (item.get("call_id"), item.get("name"), body)):
                found.append(f"malformed call {item}")
            calls[item.get("call_id")] = kind
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if calls.get(item.get("call_id")) != kind.removesuffix("_output"):
                found.append(f"result {item.get('call_id')} answers no call before it")
            answered.add(item.get("call_id"))
            output = item.get("output")
            if not isinstance(output, str) and not (isinstance(output, list) and parts_fit(output, INPUT_PARTS)):
                found.append(f"bad output {output}")
        elif kind == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else None
            if not (isinstance(following, dict) and (following.get("role") == "assistant"
                                                     or following.get("type") in ("reasoning", "function_call",
                                                                                  "custom_tool_call"))):
                found.append("reasoning without its following item")
        elif kind != "compaction":
            found.append(f"unknown item {item}")
    return found + [f"call {call_id} has no result" for call_id in calls if call_id not in answered]


def message_problems(item: dict[str, Any]) -> list[str]:
    speaker, content = item.get("role"), item.get("content")
    if speaker not in ("user", "system", "developer", "assistant"):
        return [f"bad role {speaker}"]
    allowed = OUTPUT_PARTS if speaker == "assistant" else INPUT_PARTS
    if isinstance(content, str) or (isinstance(content, list) and content and parts_fit(content, allowed)):
        return []
    return [f"bad content for {speaker}: {content}"]


def parts_fit(parts: list[Any], allowed: frozenset[str]) -> bool:
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            return False
        if kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
            return False
        if kind == "input_image" and (part.get("detail") not in ("low", "high", "auto", "original")
                                      or ("image_url" in part) == ("file_id" in part)):
            return False
        if kind == "input_file" and not any(key in part for key in ("file_id", "file_data", "file_url")):
            return False
    return True


texts = st.text(max_size=12)
input_parts = st.one_of(
    st.builds(lambda t: {"type": "input_text", "text": t}, texts),
    st.builds(lambda u, d: {"type": "input_image", "image_url": u, "detail": d}, texts,
              st.sampled_from(["low", "high", "auto"])),
    st.builds(lambda f: {"type": "input_image", "file_id": f, "detail": "auto"}, texts),
    st.builds(lambda f, n: {"type": "input_file", "file_id": f, "filename": n}, texts, texts),
    st.builds(lambda d: {"type": "input_file", "file_data": d, "filename": "a.pdf"}, texts))
instructions = st.builds(lambda role, content, typed: {**({"type": "message"} if typed else {}), "role": role,
                                                       "content": content},
                         st.sampled_from(["user", "system", "developer"]),
                         texts | st.lists(input_parts, min_size=1, max_size=3), st.booleans())
assistant_texts = st.one_of(
    st.builds(lambda t: {"role": "assistant", "content": t}, texts),
    st.builds(lambda parts: {"type": "message", "role": "assistant", "id": "msg", "status": "completed",
                             "content": parts},
              st.lists(st.builds(lambda t: {"type": "output_text", "text": t, "annotations": []}, texts)
                       | st.builds(lambda t: {"type": "refusal", "refusal": t}, texts), min_size=1, max_size=2)))
reasonings = st.builds(lambda s, e: {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": s}],
                                     "encrypted_content": e}, texts, st.none() | texts)
outputs = texts | st.lists(input_parts, min_size=1, max_size=2)


@st.composite
def assistant_turn(draw: st.DrawFn, first_id: int) -> list[Any]:
    """Reasoning, text and calls of one turn, then the calls' results in any order."""
    calls: list[dict[str, Any]] = []
    for offset, custom in enumerate(draw(st.lists(st.booleans(), max_size=3))):
        call_id = f"call_{first_id + offset}"
        calls.append({"type": "custom_tool_call", "call_id": call_id, "name": "sh", "input": draw(texts)} if custom
                     else {"type": "function_call", "call_id": call_id, "name": "f", "arguments": draw(texts)})
    said = draw(st.none() | assistant_texts)
    thought = draw(st.lists(reasonings, max_size=2)) if said is not None or calls else []
    results = [{"type": f"{call['type']}_output", "call_id": call["call_id"], "output": draw(outputs)}
               for call in calls]
    return [*thought, *([said] if said is not None else []), *calls, *draw(st.permutations(results))]


@st.composite
def responses_inputs(draw: st.DrawFn) -> list[Any]:
    items: list[Any] = []
    for turn in draw(st.lists(st.sampled_from(["instruction", "assistant", "compaction"]), min_size=1, max_size=7)):
        if turn == "instruction":
            items.append(draw(instructions))
        elif turn == "compaction":
            items.append({"type": "compaction", "encrypted_content": draw(texts)})
        else:
            items.extend(draw(assistant_turn(len(items))))
    return items or [{"role": "user", "content": "hi"}]


def cuts(view: View) -> list[int]:
    return [index for index, message in enumerate(view.messages) if message.get("role") == "user"]


@given(responses_inputs())
def test_a_view_maps_back_to_the_very_same_items(value: list[Any]) -> None:
    view = view_of_input(value)
    assert view is not None
    back = view.back(view.messages, render)
    assert len(back) == len(value) and all(a is b for a, b in zip(back, value, strict=True))
    assert problems(value) == []  # the generator makes valid inputs, so the checks below test the module


@given(responses_inputs())
def test_the_neutral_messages_are_chat_shaped(value: list[Any]) -> None:
    view = view_of_input(value)
    assert view is not None
    seen: set[str] = set()
    for message in view.messages:
        for call in message.get("tool_calls") or []:
            body = call.get("function") or call.get("custom")
            assert isinstance(body.get("arguments", body.get("input")), str)
            seen.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in seen


@given(responses_inputs())
def test_rendering_every_message_anew_makes_a_valid_input(value: list[Any]) -> None:
    view = view_of_input(value)
    assert view is not None
    fresh = [{**message} for message in view.messages]  # copies: no group goes back whole
    assert problems(as_input_items(view.back(fresh, render))) == []


@given(responses_inputs() | texts)
def test_a_summary_in_place_of_any_earlier_turns_makes_a_valid_input(value: Any) -> None:
    view = view_of_input(value)
    assert view is not None
    for cut in cuts(view):
        items = as_input_items(view.back([SUMMARY, *view.messages[cut:]], render))
        assert problems(items) == []
        assert items[0] == {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                            "text": SUMMARY["content"]}]}


@given(responses_inputs(), st.data())
def test_placeholders_keep_the_input_valid(value: list[Any], data: st.DataObject) -> None:
    view = view_of_input(value)
    assert view is not None
    history = [{**message, "content": "[removed]"} if message["role"] == "tool" and data.draw(st.booleans())
               else message for message in view.messages]
    assert problems(view.back(history, render)) == []


item_keys = st.sampled_from(["type", "role", "content", "call_id", "name", "arguments", "input", "output", "text",
                             "image_url", "file_id", "detail", "id", "summary", "encrypted_content", "refusal"])
item_values = st.sampled_from(["message", "user", "assistant", "developer", "function_call", "function_call_output",
                               "custom_tool_call", "custom_tool_call_output", "reasoning", "compaction", "input_text",
                               "output_text", "input_image", "input_file", "refusal", "a", "b"])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4) | item_values,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(item_keys | st.text(max_size=3),
                                                                                       inner, max_size=5),
                           max_leaves=30)


# Items that are nearly right: real shapes with shared call ids, in any order, among arbitrary JSON.
call_ids = st.sampled_from(["a", "b"]) | json_values
near_items = st.one_of(
    instructions, assistant_texts, reasonings, json_values,
    st.builds(lambda kind, call_id, body: {"type": kind, "call_id": call_id, "name": "f", "arguments": body,
                                           "input": body},
              st.sampled_from(["function_call", "custom_tool_call"]), call_ids, texts | json_values),
    st.builds(lambda kind, call_id, output: {"type": kind, "call_id": call_id, "output": output},
              st.sampled_from(["function_call_output", "custom_tool_call_output"]), call_ids, outputs | json_values))


@given(json_values | st.lists(near_items, max_size=6))
def test_any_json_is_read_without_error_and_what_is_read_maps_back(value: Any) -> None:
    view = view_of_input(value)
    if view is None:
        return
    back = view.back(view.messages, render)
    expected = value if isinstance(value, list) else [value]
    assert len(back) == len(expected) and all(a is b for a, b in zip(back, expected, strict=True))


@given(st.lists(json_values, max_size=5))
def test_rendering_any_messages_never_raises_and_makes_only_known_items(messages: list[Any]) -> None:
    for item in render(messages):
        assert item["type"] in ("message", "function_call", "custom_tool_call", "function_call_output",
                                "custom_tool_call_output")
