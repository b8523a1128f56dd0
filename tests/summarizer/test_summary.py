"""Tests for the structured summary: candidate order, lenient coercion, rendering and the raw fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.summarizer.fence import inline_code
from proxy.summarizer.summary import MAX_DECODES, FileNote, StructuredSummary, summary_text
from proxy.summarizer.templates import Templates


@pytest.fixture
def templates(tmp_path: Path) -> Templates:
    return Templates(user_dir=tmp_path / "no-user-prompts")


def fenced(value: Any) -> str:
    return "```json\n" + json.dumps(value, indent=2) + "\n```"


KEY_CODE_WITH_FENCES = 'Run:\n```bash\nmake test\n```\nthen check:\n```json\n{"ok": true}\n```'

PARSE_CASES = [
    pytest.param(
        "<analysis>The user wants X.</analysis>\n\n" + fenced({"user_intent": ["ship the release"]}),
        {"user_intent": ("ship the release",)},
        id="fenced-json-after-analysis",
    ),
    pytest.param(
        "<analysis>notes</analysis>\n"
        + fenced({"user_intent": ["end the notes with </analysis> exactly"],
                  "current_work": "quoting </analysis> twice: </analysis>"}),
        {"user_intent": ("end the notes with </analysis> exactly",),
         "current_work": "quoting </analysis> twice: </analysis>"},
        id="strings-quote-the-terminator",
    ),
    pytest.param(
        "<analysis>a</analysis>\n" + fenced({"files": [{"path": "Makefile", "key_code": KEY_CODE_WITH_FENCES}]}),
        {"files": (FileNote("Makefile", None, KEY_CODE_WITH_FENCES),)},
        id="key-code-with-bash-and-json-fences",
    ),
    pytest.param(
        "<analysis>I will write\n```json\n{\"user_intent\": [\"example\"]}\n```\n</analysis>\n"
        "I could not produce a summary.",
        None,
        id="fenced-example-inside-analysis-then-prose",
    ),
    pytest.param(
        "<analysis>a</analysis>\n```json\n{\"user_intent\": [\"cut off mid", None, id="truncated-json"),
    pytest.param("<analysis>a</analysis>\n```json\n{}\n```", None, id="empty-object"),
    pytest.param("<analysis>a</analysis>\n" + fenced({"mood": "calm", "notes": ["x"]}), None, id="only-unknown-keys"),
    pytest.param(
        "<analysis>a</analysis>\n" + fenced({"user_intent": ["  ", ""], "current_work": " ", "files": [" "]}),
        None,
        id="only-blank-strings",
    ),
    pytest.param('A summary might look like {"user_intent": ["x"]} but here is none.', None, id="json-in-prose"),
    pytest.param(
        "<analysis>I should answer with a ```json fence.</analysis>\n{\"user_intent\": [\"bare object\"]}",
        {"user_intent": ("bare object",)},
        id="bare-object-after-analysis-that-mentions-a-fence",
    ),
    pytest.param(
        fenced({"pending_tasks": ["no analysis at all"]}),
        {"pending_tasks": ("no analysis at all",)},
        id="fence-without-analysis",
    ),
    pytest.param(
        '  {"next_step": "object at the very start"}',
        {"next_step": "object at the very start"},
        id="object-at-start",
    ),
    pytest.param(
        "<analysis>I end with </analysis> and then\n" + fenced({"user_intent": ["inside the notes"]})
        + "\nand more notes</analysis>\nSorry, no summary.",
        None,
        id="candidate-followed-by-a-later-terminator",
    ),
    pytest.param(
        "<analysis>I must end with </analysis> properly.</analysis>\n" + fenced({"user_intent": ["after both"]}),
        {"user_intent": ("after both",)},
        id="analysis-quotes-the-terminator",
    ),
    pytest.param(
        "<analysis>a</analysis>\n" + fenced({"user_intent": ["first"]})
        + "\nfix:\n" + fenced({"user_intent": ["last"]}),
        {"user_intent": ("last",)},
        id="last-fence-wins",
    ),
    pytest.param(
        "<analysis>a</analysis>\n" + fenced({"user_intent": ["kept"]}) + "\n```json\n{\"user_intent\": [\"x\"],}\n```",
        {"user_intent": ("kept",)},
        id="invalid-last-fence-falls-back",
    ),
    pytest.param(
        "<analysis>a</analysis>\n" + fenced({"user_intent": ["kept"]}) + "\n```json\n{}\n```",
        {"user_intent": ("kept",)},
        id="empty-last-fence-falls-back",
    ),
    pytest.param(
        "<analysis>a</analysis>\n" + fenced({"user_intent": ['braces } { and "quotes" and \\ slashes']}),
        {"user_intent": ('braces } { and "quotes" and \\ slashes',)},
        id="braces-and-escapes-in-strings",
    ),
    pytest.param(
        "<analysis>a</analysis>\n```json\n{\"user_messages\": [\"raw\nnewline\"]}\n```",
        {"user_messages": ("raw\nnewline",)},
        id="raw-newline-inside-string",
    ),
    pytest.param("", None, id="empty-reply"),
    pytest.param("<analysis>a</analysis>\n```json\n" + '{"a": ' * 100_000, None, id="hostile-nesting"),
    pytest.param("<analysis>a</analysis>" + "```json {" * 2_000, None, id="many-unclosed-fences"),
    pytest.param("</analysis>```json {}" * 1_000, None, id="many-terminators-and-empty-objects"),
    pytest.param("<analysis>only notes</analysis>", None, id="analysis-only"),
    # Every failed decode costs time in proportion to its position, so at most MAX_DECODES candidates are tried:
    # the last fence is tried first, however many come before it; past the limit the raw text is used.
    pytest.param("<analysis>a</analysis>" + "```json {\"a\" " * 5_000 + fenced({"user_intent": ["last of many"]}),
                 {"user_intent": ("last of many",)}, id="summary-after-thousands-of-broken-fences"),
    pytest.param("</analysis>" * 3_000 + fenced({"user_intent": ["after the terminators"]}),
                 {"user_intent": ("after the terminators",)}, id="summary-after-thousands-of-terminators"),
    pytest.param("<analysis>a</analysis>" + fenced({"user_intent": ["first"]}) + "```json {}" * (MAX_DECODES - 1),
                 {"user_intent": ("first",)}, id="summary-within-the-decode-limit"),
    pytest.param("<analysis>a</analysis>" + fenced({"user_intent": ["first"]}) + "```json {}" * MAX_DECODES,
                 None, id="summary-past-the-decode-limit"),
]


@pytest.mark.parametrize(("reply", "expected"), PARSE_CASES)
def test_parse_finds_the_right_candidate(reply: str, expected: dict[str, Any] | None) -> None:
    parsed = StructuredSummary.parse(reply)
    if expected is None:
        assert parsed is None
    else:
        assert parsed == StructuredSummary(**expected)


COERCION_CASES = [
    ({"errors_and_fixes": [{"error": "E1", "fix": "F1"}]}, "errors_and_fixes", ("error: E1; fix: F1",)),
    ({"problem_solving": [3, 2.5, True, False]}, "problem_solving", ("3", "2.5", "true", "false")),
    ({"pending_tasks": ["a", None, "  ", "", {}, []]}, "pending_tasks", ("a",)),
    ({"user_intent": "just one"}, "user_intent", ("just one",)),
    ({"user_intent": ["  padded  "]}, "user_intent", ("padded",)),
    ({"technical_concepts": [["a", None, "b"]]}, "technical_concepts", ("a; b",)),
    ({"user_messages": [{"said": "hi", "empty": None}]}, "user_messages", ("said: hi",)),
    ({"current_work": ["step a", "step b"]}, "current_work", "step a; step b"),
    ({"current_work": {"file": "a.py", "line": 3}}, "current_work", "file: a.py; line: 3"),
    ({"current_work": 42}, "current_work", "42"),
    ({"current_work": "  ", "user_intent": ["x"]}, "current_work", None),
    ({"next_step": "\n ", "user_intent": ["x"]}, "next_step", None),
    ({"next_step": None, "user_intent": ["x"]}, "next_step", None),
    ({"files": ["src/a.py", " ", None]}, "files", (FileNote("src/a.py"),)),
    ({"files": "src/only.py"}, "files", (FileNote("src/only.py"),)),
    ({"files": {"path": "one.py", "summary": "s"}}, "files", (FileNote("one.py", "s"),)),
    ({"files": [{"path": "a.py", "summary": " s ", "key_code": "  \n "}]}, "files", (FileNote("a.py", "s", None),)),
    ({"files": [{"path": "a.py", "key_code": "\n\n    x = 1\n\n    y = 2  \n"}]}, "files",
     (FileNote("a.py", None, "    x = 1\n\n    y = 2"),)),
    ({"files": [{"path": "a.py", "key_code": ["def f():", "", "    return 1"]}]}, "files",
     (FileNote("a.py", None, "def f():\n\n    return 1"),)),
    ({"files": [{"path": "a.py", "summary": "s", "purpose": "tests"}]}, "files",
     (FileNote("a.py", "s; purpose: tests"),)),
    ({"files": [{"summary": "no path given"}]}, "files", (FileNote(None, "no path given"),)),
    ({"files": [{"path": " ", "summary": None}], "user_intent": ["x"]}, "files", ()),
    ({"files": [{"path": "two\nlines.py"}]}, "files", (FileNote("two lines.py"),)),
    ({"user_intent": ["x"], "mood": "calm", "n": 1}, "extra", {"mood": "calm", "n": 1}),
]


@pytest.mark.parametrize(("raw", "attribute", "expected"), COERCION_CASES)
def test_lenient_coercion(raw: dict[str, Any], attribute: str, expected: Any) -> None:
    from_dict = StructuredSummary.from_dict(raw)
    parsed = StructuredSummary.parse("<analysis>a</analysis>\n" + fenced(raw))
    assert getattr(from_dict, attribute) == expected
    assert parsed is not None and getattr(parsed, attribute) == expected


@pytest.mark.parametrize(
    ("summary", "empty"),
    [
        (StructuredSummary(), True),
        (StructuredSummary(extra={"mood": "calm"}), True),
        (StructuredSummary(next_step="go"), False),
        (StructuredSummary(files=(FileNote("a.py"),)), False),
    ],
)
def test_is_empty_looks_only_at_the_nine_fields(summary: StructuredSummary, empty: bool) -> None:
    assert summary.is_empty is empty


@pytest.mark.parametrize(("text", "expected"), [
    ("x = 1", "`x = 1`"),
    ("run `ls` now", "``run `ls` now``"),
    ("a ``b`` c", "```a ``b`` c```"),
    ("`starts", "`` `starts ``"),  # CommonMark strips one space from each end of a span padded like this
    ("ends`", "`` ends` ``"),
])
def test_inline_code_outruns_every_backtick_run(text: str, expected: str) -> None:
    assert inline_code(text) == expected


@pytest.mark.parametrize("body", [
    '{"user_intent": ' + "[" * 20 + '"deep"' + "]" * 20 + "}",  # 21 levels
    json.dumps({"user_intent": [f"item {index}" for index in range(5000)]}),  # 5,001 values
    json.dumps({f"key{index}": "v" for index in range(5000)}),
])
def test_an_object_too_deep_or_too_big_is_no_summary(body: str) -> None:
    """A model writes a few levels and hundreds of values; reading more (recursively, then rendering it) would cost
    without bound, and nesting near the recursion limit raised RecursionError from the coercion."""
    assert StructuredSummary.parse(f"```json\n{body}\n```") is None


def test_an_object_within_the_bounds_is_a_summary() -> None:
    body = json.dumps({"user_intent": [f"item {index}" for index in range(1000)], "files": [{"path": "a.py"}]})
    parsed = StructuredSummary.parse(f"```json\n{body}\n```")
    assert parsed is not None and len(parsed.user_intent) == 1000


def test_an_object_nested_near_the_recursion_limit_does_not_raise() -> None:
    body = '{"user_intent": ' + "[" * 900 + '"x"' + "]" * 900 + "}"
    assert StructuredSummary.parse(f"```json\n{body}\n```") is None


FULL = StructuredSummary(
    user_intent=("Add retries", "Keep the API stable"),
    technical_concepts=("aiohttp",),
    files=(FileNote("proxy/app.py", "Composition root.", "def create_app():\n    pass"), FileNote("README.md")),
    errors_and_fixes=("`KeyError: 'model'` fixed by defaulting",),
    problem_solving=("Tried a lock first",),
    user_messages=("please add retries\nand tests",),
    pending_tasks=("Write docs",),
    current_work="Editing proxy/app.py",
    next_step="Run the tests",
)

FULL_MARKDOWN = """# Conversation Summary

## User Intent

- Add retries
- Keep the API stable

## Technical Concepts

- aiohttp

## Files + Code

### proxy/app.py

Composition root.

```
def create_app():
    pass
```

### README.md

## Errors + Fixes

- `KeyError: 'model'` fixed by defaulting

## Problem Solving

- Tried a lock first

## User Messages

- please add retries
  and tests

## Pending Tasks

- Write docs

## Current Work

Editing proxy/app.py

## Next Step

Run the tests"""


def test_render_has_every_section_in_order(templates: Templates) -> None:
    assert FULL.render(templates=templates) == FULL_MARKDOWN


@pytest.mark.parametrize(
    ("summary", "present", "absent"),
    [
        (StructuredSummary(user_intent=("a",), next_step="b"), ["## User Intent", "## Next Step"],
         ["## Technical Concepts", "## Files + Code", "## Errors + Fixes", "## Problem Solving",
          "## User Messages", "## Pending Tasks", "## Current Work"]),
        (StructuredSummary(files=(FileNote("a.py", "s"),)), ["## Files + Code", "### a.py"], ["```", "## User Intent"]),
        (StructuredSummary(files=(FileNote(None, "s"),)), ["### (path not given)"], ["None"]),
    ],
)
def test_render_omits_empty_sections(summary: StructuredSummary, present: list[str], absent: list[str],
                                     templates: Templates) -> None:
    rendered = summary.render(templates=templates)
    assert rendered.startswith("# Conversation Summary")
    assert all(heading in rendered for heading in present)
    assert not any(heading in rendered for heading in absent)


def test_long_backtick_run_gets_a_longer_fence_and_the_next_heading_stays_outside(templates: Templates) -> None:
    code = "example = '''\n````\nnot a fence\n````\n'''"
    summary = StructuredSummary(files=(FileNote("a.py", key_code=code), FileNote("b.py")), next_step="go")
    lines = summary.render(templates=templates).splitlines()
    opening = lines.index("`````")
    closing = lines.index("`````", opening + 1)
    assert lines[opening + 1:closing] == code.splitlines()
    assert lines.index("### b.py") > closing
    assert lines.index("## Next Step") > closing


def test_message_text_in_fields_is_rendered_literally(templates: Templates) -> None:
    summary = StructuredSummary(user_intent=("{{ 7*7 }} and {% raw %}",), current_work="{# hidden? #}")
    rendered = summary.render(templates=templates)
    assert "- {{ 7*7 }} and {% raw %}" in rendered
    assert "{# hidden? #}" in rendered
    assert "49" not in rendered


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for item in user_intent[:3] %}{{ item }},{% endfor %}|{{ mood }}|{{ extra['mood'] }}", "a,b,c,|calm|calm"),
        ("{{ user_intent | length }} {{ files[0].path }} {{ next_step is none }}", "4 x.py True"),
        ("{{ name }}/{{ extra['odd key'] }}", "clash/spaced"),
        ("  {{ files[0].key_code | code_fence }}  ", "```\nprint(1)\n```"),
    ],
)
def test_custom_template_sees_fields_and_extra_keys(template: str, expected: str, templates: Templates) -> None:
    summary = StructuredSummary(
        user_intent=("a", "b", "c", "d"),
        files=(FileNote("x.py", key_code="print(1)"),),
        extra={"mood": "calm", "name": "clash", "odd key": "spaced"},
    )
    assert summary.render(template, templates=templates) == expected


def test_extra_never_shadows_the_nine_fields(templates: Templates) -> None:
    summary = StructuredSummary.from_dict({"user_intent": ["real"], "extra": "model's own", "files_count": 2})
    assert summary.render("{{ user_intent[0] }}|{{ extra['extra'] }}|{{ files_count }}", templates=templates) == (
        "real|model's own|2"
    )


GOOD_REPLY = "<analysis>a</analysis>\n" + fenced({"user_intent": ["fix the bug"], "next_step": "rerun"})


def test_summary_text_renders_a_parsed_reply(templates: Templates) -> None:
    rendered = summary_text(GOOD_REPLY, templates)
    assert rendered.startswith("# Conversation Summary\n\n## User Intent\n\n- fix the bug")
    assert rendered.endswith("## Next Step\n\nrerun")


@pytest.mark.parametrize(
    "reply",
    ["The model rambled and gave no JSON.", "<analysis>a</analysis>\n```json\n{\"user_intent\": [", ""],
)
def test_summary_text_keeps_an_unparsable_reply_verbatim(reply: str, templates: Templates) -> None:
    assert summary_text(reply, templates) == reply


@pytest.mark.parametrize(
    "override",
    [
        "{{ no_such_variable }}",
        "{{ user_intent[99] }}",
        "{{ 1 // 0 }}",
        "{% if user_intent %}{{ user_intent | code_fence }}{% endif %}",
        "   \n",
        "{% if false %}never{% endif %}",
    ],
    ids=["undefined", "index-out-of-range", "zero-division", "filter-type-error", "blank", "renders-empty"],
)
def test_summary_text_falls_back_when_the_template_fails_or_renders_nothing(override: str, tmp_path: Path) -> None:
    prompts_dir = tmp_path / "prompts"
    prompts_dir.mkdir()
    (prompts_dir / "compaction_summary.md").write_text(override)
    templates = Templates(prompts_dir, user_dir=tmp_path / "no-user-prompts")
    assert summary_text(GOOD_REPLY, templates) == GOOD_REPLY
