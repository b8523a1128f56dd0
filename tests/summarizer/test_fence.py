"""proxy.summarizer.fence: code fences and inline code spans longer than any backtick run inside them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy.summarizer.fence import code_fence, inline_code


def longest_run(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


@pytest.mark.parametrize(("code", "expected"), [
    ("x = 1", "```\nx = 1\n```"),
    ("x = 1\n", "```\nx = 1\n```"),
    ("", "```\n\n```"),
    ("use `a` and ``b``", "```\nuse `a` and ``b``\n```"),
    ("```bash\nls\n```", "````\n```bash\nls\n```\n````"),
    ("````\nfour\n````", "`````\n````\nfour\n````\n`````"),
    ("a`b`c", "```\na`b`c\n```"),
    ("``", "```\n``\n```"),
    ("```", "````\n```\n````"),
    ("x ``````` y", "````````\nx ``````` y\n````````"),
    ("`" * 9 + "\n" + "`", "`" * 10 + "\n" + "`" * 9 + "\n`\n" + "`" * 10),
    ("two\n\n", "```\ntwo\n\n```"),  # a body already ending in a newline gets no other
    ("crlf\r\n", "```\ncrlf\r\n```"),
    ("cr\r", "```\ncr\r\n```"),
    ("\n", "```\n\n```"),
    ("é \ud800 ` \u2603", "```\né \ud800 ` \u2603\n```"),
    ("~~~\n~~~", "```\n~~~\n~~~\n```"),  # tildes do not lengthen a backtick fence
])
def test_code_fence(code: str, expected: str) -> None:
    assert code_fence(code) == expected


@pytest.mark.parametrize("code", ["", "plain", "`", "````", "a\n```\nb\n`````c", "`" * 10_000, "x`" * 5000])
def test_code_fence_is_never_closed_from_inside(code: str) -> None:
    fenced = code_fence(code)
    fence = fenced.split("\n", 1)[0]
    assert set(fence) == {"`"} and len(fence) == max(3, longest_run(code) + 1)
    assert fenced.endswith("\n" + fence)
    assert fenced[len(fence) + 1:len(fenced) - len(fence) - 1].rstrip("\n") == code.rstrip("\n")


@pytest.mark.parametrize(("text", "expected"), [
    ("", "``"),
    ("`", "`` ` ``"),
    ("``", "``` `` ```"),
    ("`a`", "`` `a` ``"),
    ("a`", "`` a` ``"),
    ("in ` middle", "``in ` middle``"),
    ("a ``` b", "````a ``` b````"),
    ("line\nbreak", "`line\nbreak`"),
    ("\ud800", "`\ud800`"),
])
def test_inline_code(text: str, expected: str) -> None:
    assert inline_code(text) == expected


@pytest.mark.parametrize("text", ["x", "`" * 5000, "a" + "`" * 300 + "b", "``a`b```"])
def test_inline_code_delimiter_outruns_the_text(text: str) -> None:
    span = inline_code(text)
    delimiter = span[:longest_run(text) + 1]
    assert set(delimiter) == {"`"} and span[len(delimiter)] != "`" and span.endswith(delimiter)
    inside = span[len(delimiter):len(span) - len(delimiter)]
    assert inside in (text, f" {text} ")
    assert longest_run(inside) < len(delimiter)


@pytest.mark.parametrize("bad", [None, b"bytes", 3, ["`"]])
@pytest.mark.parametrize("function", [code_fence, inline_code])
def test_non_str_is_refused(function: Any, bad: Any) -> None:
    with pytest.raises(TypeError):
        function(bad)
