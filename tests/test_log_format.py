"""Log lines in the format asked for: with `logging.format: json` every line the real program writes is one JSON
object (events' own fields at its top, secrets still redacted); text lines are as before."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.log_filters import RedactSecrets
from proxy.log_format import FIELDS_ATTRIBUTE, TEXT, JsonLines, formatter
from tests.fakes.openai_upstream import FakeUpstream
from tests.proxy_process import proxy_process


def record(message: str, *args: Any, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    made = logging.LogRecord("proxy.access", logging.INFO, __file__, 1, message, args, info)
    made.created = 1_700_000_000.25
    return made


@pytest.mark.parametrize(("message", "args", "expected"), [
    ("plain words %s", ("here",), {"message": "plain words here"}),
    ('{"event": "compaction", "tokens_before": 10}', (), {"event": "compaction", "tokens_before": 10}),
    ('{"level": "mine", "time": 3}', (), {"event_level": "mine", "event_time": 3}),  # base keys are not overwritten
    ("{not json", (), {"message": "{not json"}),
    ("[1, 2]", (), {"message": "[1, 2]"}),
    ('{"deep": ' * 5000 + "1" + "}" * 5000, (), None),  # too deep to read: kept as the message
], ids=["plain", "event", "collision", "broken", "list", "deep"])
def test_a_record_is_one_json_object(message: str, args: tuple[Any, ...], expected: dict[str, Any] | None) -> None:
    line = json.loads(JsonLines().format(record(message, *args)))
    assert line["time"] == "2023-11-14T22:13:20.250+00:00" and line["level"] == "INFO"
    assert line["logger"] == "proxy.access" and "worker" not in line
    assert {key: line[key] for key in (expected or {"message": message})} == (expected or {"message": message})


def test_an_exception_and_the_worker_are_fields() -> None:
    line = json.loads(JsonLines(worker=2).format(record("failed", exc=True)))
    assert line["worker"] == 2 and line["message"] == "failed"
    assert "ValueError: boom" in line["exception"] and "\n" not in JsonLines(worker=2).format(record("x", exc=True))


def test_text_is_the_default_and_says_the_worker() -> None:
    text = formatter("text", worker=1).format(record("hello"))
    assert text.endswith("INFO worker-1 proxy.access hello") and not text.startswith("{")


async def test_the_real_program_writes_only_json_lines(tmp_path: Path, fake: FakeUpstream) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"upstream": {"base_url": f"{fake.url}/v1"},
                                      "logging": {"format": "json", "level": "DEBUG"}}), encoding="utf-8")
    async with proxy_process(tmp_path, config) as proxy, aiohttp.ClientSession() as session:
        body = {"model": "fake-small", "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{proxy.base}/v1/chat/completions", json=body,
                                headers={"Authorization": "Bearer sk-logformat-secret-0123456789"}) as answer:
            assert answer.status == 200
            request_id = answer.headers["x-request-id"]
        output = await proxy.wait_for_log(request_id)
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]  # every line parses, or this fails
    assert all({"time", "level", "logger"} <= line.keys() for line in lines)
    access = [line for line in lines if line["logger"] == "proxy.access" and line.get("request_id") == request_id]
    assert access and access[0]["status"] == 200
    assert "sk-logformat-secret" not in output


def with_fields(message: str, fields: dict[str, Any]) -> logging.LogRecord:
    made = record(message)
    setattr(made, FIELDS_ATTRIBUTE, fields)
    return made


def test_an_access_line_carries_its_fields_and_reads_as_its_message_would() -> None:
    fields = {"event": "request", "request_id": "abc", "status": 200, "path": "/v1/chat/completions"}
    message = json.dumps(fields)
    assert json.loads(JsonLines().format(with_fields(message, fields))) == \
        json.loads(JsonLines().format(record(message)))
    odd = {"event": "request", "path": "/v1/\ud800", "huge": 2**70}  # what orjson refuses, json spells
    assert json.loads(JsonLines().format(with_fields(json.dumps(odd), odd)))["huge"] == 2**70


def test_redaction_drops_the_fields_of_a_line_it_changed() -> None:
    fields = {"event": "request", "path": "/v1/sk-abcdefghijklmnop"}
    made = with_fields(json.dumps(fields), fields)
    assert RedactSecrets().filter(made)
    line = JsonLines().format(made)
    assert "abcdefghijklmnop" not in line and json.loads(line)["path"] == "/v1/sk-***"


@pytest.mark.parametrize("created", [1_700_000_000.25, 1_700_000_000.999, 1_700_000_001.0, 1_700_000_061.5, 0.0])
def test_text_times_are_loggings_own(created: float) -> None:
    text, plain = formatter("text"), logging.Formatter(TEXT.format(who=""))
    for value in (created, created + 0.001, created + 1.0004):  # the cached second, then the next one
        made = record("hello")
        made.created, made.msecs = value, (value - int(value)) * 1000 // 1
        assert text.format(made) == plain.format(made)
