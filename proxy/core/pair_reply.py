"""The summariser's reply to a batch of tool rounds: one non-empty summary per round, or nothing stored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy.core.messages import content_text, valid_text


class BadReply(Exception):
    """The summariser's reply is not a JSON list of one non-empty string per round; its message is a reason code
    (never the reply's text)."""


def parsed_summaries(reply: Mapping[str, Any], count: int) -> list[str]:
    """The reply's summaries, one per round, in order: a JSON list (a fence or words around it are tolerated) of
    exactly `count` strings, none empty. Anything else raises BadReply, so a bad reply stores nothing."""
    if reply.get("finish_reason") == "length":
        raise BadReply("cut_off")
    text = content_text(reply.get("content"))
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end < start:
        raise BadReply("not_a_list")
    try:
        value = json.loads(text[start:end + 1])
    except (ValueError, RecursionError) as error:
        raise BadReply("not_json") from error
    if not isinstance(value, list) or len(value) != count:
        raise BadReply("wrong_count")
    if not all(isinstance(item, str) and item.strip() for item in value):
        raise BadReply("empty_summary")
    return [valid_text(item.strip()) for item in value]
