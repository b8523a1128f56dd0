"""One tool call as the evidence reads it: what it ran or touched and why, and what its output reported (the
lines reporting a failure, the settings it showed), each quoted as printed."""

from __future__ import annotations

import itertools
import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.summarizer import stated
from proxy.summarizer.fence import inline_code

# A line of tool output reporting a failure. The line is quoted as printed: an error's exact text is the fact
# most often lost, and a model asked for it verbatim paraphrases it anyway.
ERROR_WORD = re.compile(r"(?:error|exception|traceback)\b|\b(?:failed|failure|fatal|panic)\b|^(?-i:E)[ \t]",
                        re.IGNORECASE)
ERROR_WORDS = ("error", "exception", "traceback", "failed", "failure", "fatal", "panic")
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
MAX_CANDIDATES = 64     # lines looked at per word of one output: a word repeated in every line costs no more
COMMAND_KEYS = ("command", "cmd", "script")
PATH_KEYS = ("path", "file_path", "filepath", "filename", "file")
# A tool whose name has one of these changes the file it names; any other path-bearing call reads it.
WRITE_WORDS = ("edit", "write", "patch", "create", "replace", "apply", "insert", "append", "delete", "move",
               "rename", "update", "set")
MAX_ERROR_LINES = 3     # per tool result: the failing test, the error, the tally
MAX_LINE_CHARS = 240    # one quoted line of output
MAX_VALUE_CHARS = 80    # one argument of a file action
# Why a command ran, in the agent's words: the call's own description (Claude Code's Bash takes one), else the
# sentence of the calling message that quotes the command ("I will run only the failing shard tests with `…`").
# A command kept without it is one of several a reader cannot tell apart.
PURPOSE_KEYS = ("description",)
MAX_PURPOSE_CHARS = 240
ELLIPSIS = " […] "
# A line of settings as config files and `env` print them (`LEDGER_PORT=5432`, `timeout = 30`, `port: 8080`).
SETTING = re.compile(r"[A-Za-z_][\w.\-]*[ \t]?(?:=[ \t]?[^=\s]|:[ \t]\S).*")
MAX_SETTINGS_OUTPUT = 4096  # characters: a longer output is not a settings file a summary could carry
MAX_SETTINGS = 12       # lines kept from one output
SETTINGS_LOOK = 2 * MAX_SETTINGS  # lines judged: a settings file shows what it is in its first lines
# A test runner's tally (`1 failed, 6 passed in 3.41s`): quoted with the error, but a summary that kept the error
# without it lost nothing, so it is not what decides whether the error is missing.
TALLY = re.compile(r"[=\s]*\d+ (?:failed|passed|errors?|skipped|deselected|warnings?|xfailed|xpassed)\b"
                   r"(?:, \d+ \w+)*(?: in [\d.]+ ?s)?[=\s]*", re.IGNORECASE)


@dataclass(frozen=True)
class Action:
    """One tool call, as the evidence knows it: what it ran or touched, and the failure lines it printed."""

    label: str                  # `command` when it ran one, else name(args)
    command: str | None
    path: str | None
    writes: bool
    detail: str                 # the file action: the name and its other arguments, shortened
    errors: tuple[str, ...]
    settings: tuple[str, ...] = ()  # the output's lines, when it reads as settings (a config file, `env`)
    purpose: str = ""           # why it ran: its description, or the agent's sentence quoting the command

    @property
    def heading(self) -> str:
        """What it ran, with why: the agent's sentence when it quotes the command, else the label."""
        if not self.purpose:
            return self.label
        return self.purpose if self.command and self.command in self.purpose else f"{self.label} ({self.purpose})"


def read_call(call: Any, results: dict[Any, str], said: str = "") -> Action | None:
    """A chat tool call as an Action (None when it is not one), with its output from `results` by call id and why
    it ran from `said`, the text of the message that made it."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    name = function["name"]
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(arguments, dict):
        return None
    command = _first_text(arguments, COMMAND_KEYS)
    path = _first_text(arguments, PATH_KEYS)
    others = {key: value for key, value in arguments.items() if key not in PATH_KEYS}
    detail = " ".join([name, *(f"{key}={shortened(_text(value), MAX_VALUE_CHARS)}" for key, value in others.items())])
    label = f"`{command}`" if command else f"{name}({shortened(json.dumps(arguments), MAX_VALUE_CHARS)})"
    output = results.get(call.get("id"), "")
    return Action(label, command, path, any(word in name.lower() for word in WRITE_WORDS), detail,
                  tuple(error_lines(output)), settings_lines(output), _purpose(command, arguments, said))


def _purpose(command: str | None, arguments: dict[str, Any], said: str) -> str:
    """Why `command` ran: the call's description, else the latest sentence of `said` quoting it (short ones only)."""
    if command is None:
        return ""
    if (described := _first_text(arguments, PURPOSE_KEYS)) is not None:
        return shortened(" ".join(described.split()), MAX_VALUE_CHARS)
    quoting = [sentence for sentence in stated.sentences(said) if command in sentence]
    return quoting[-1] if quoting and len(quoting[-1]) <= MAX_PURPOSE_CHARS else ""


def _first_text(arguments: dict[str, Any], keys: Sequence[str]) -> str | None:
    return next((value.strip() for key in keys if isinstance(value := arguments.get(key), str) and value.strip()),
                None)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def reported(output: str) -> str:
    """What a tool's output reported that a placeholder standing in for it keeps: its failure lines and its
    settings, each quoted as code ("" when there are none)."""
    lines = [*error_lines(output), *settings_lines(output)[:MAX_ERROR_LINES]]
    return "; ".join(inline_code(line) for line in lines)


def error_lines(output: str) -> list[str]:
    """The first lines of `output` that report a failure.

    Outputs run to megabytes and `re` holds the GIL for ~100 ns a character: lines are found by `str.find`
    for each word (C speed), at most MAX_CANDIDATES per word, and only those lines are matched.
    """
    lowered = output.translate(ASCII_LOWER)  # str.lower() may lengthen a text and shift every position after
    starts: set[int] = set()
    for needle, text in [*((word, lowered) for word in ERROR_WORDS), ("\nE ", output), ("\nE\t", output)]:
        found, at = 0, text.find(needle)
        while at >= 0 and found < MAX_CANDIDATES:
            line_start = output.rfind("\n", 0, at + (needle[0] == "\n")) + 1
            starts.add(line_start)
            found += 1
            at = text.find(needle, max(at + 1, output.find("\n", at + 1)))
    starts.add(0)  # the first line may open with "E "
    lines: list[str] = []
    for start in sorted(starts):
        end = output.find("\n", start)
        line = output[start:end if end >= 0 else len(output)]
        if ERROR_WORD.search(line):
            lines.append(shortened(line.strip(), MAX_LINE_CHARS))
            if len(lines) == MAX_ERROR_LINES:
                break
    return lines


def settings_lines(output: str) -> tuple[str, ...]:
    """The setting lines of a short output made mostly of them (comments and blank lines aside), else none.

    A configured value (a port, a timeout, a host) is read once and asked for much later; a source file with one
    assignment in it is not a settings file, so most of its lines must be settings.
    """
    if len(output) > MAX_SETTINGS_OUTPUT or ("=" not in output and ": " not in output):
        return ()
    lines = list(itertools.islice((line.rstrip() for line in output.splitlines()
                                   if line.strip() and not line.lstrip().startswith(("#", ";"))), SETTINGS_LOOK))
    settings = [line for line in lines if SETTING.fullmatch(line)]
    # One "Note: …" line is a message, not a settings file: the `key: value` form needs company.
    if not settings or 2 * len(settings) < len(lines) or (len(settings) == 1 and "=" not in settings[0]):
        return ()
    return tuple(shortened(line, MAX_VALUE_CHARS) for line in settings[:MAX_SETTINGS])


def shortened(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    keep = (limit - len(ELLIPSIS)) // 2
    return text[:keep].rstrip() + ELLIPSIS + text[-keep:].lstrip()
