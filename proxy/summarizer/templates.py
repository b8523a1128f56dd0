"""Jinja templates for prompts and summaries, looked up in the config dir, the user dir, then the built-ins."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from proxy.config import ConfigError
from proxy.summarizer.fence import code_fence

COMPACTION_PROMPT = "compaction.md"
COMPACTION_INSTRUCTION = "compaction_instruction.md"
SUMMARY = "compaction_summary.md"
CONTINUATION = "continuation.md"
MERGE_INSTRUCTION = "merge_instruction.md"
CHUNK_INSTRUCTION = "chunk_instruction.md"
ACKNOWLEDGEMENT = "acknowledgement.md"
ELIDED = "elided.md"
SUMMARY_NOTE = "summary_note.md"
CLIENT_INSTRUCTIONS = "client_instructions.md"
PAIR_SUMMARIES = "pair_summaries.md"
TEMPLATE_NAMES = (COMPACTION_PROMPT, COMPACTION_INSTRUCTION, SUMMARY, CONTINUATION, MERGE_INSTRUCTION,
                  CHUNK_INSTRUCTION, ACKNOWLEDGEMENT, ELIDED, SUMMARY_NOTE, CLIENT_INSTRUCTIONS, PAIR_SUMMARIES)

# The package's directory (the shipped prompts sit beside it in a wheel).
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_COMPILED_SOURCES_KEPT = 32


def default_user_dir(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """`$XDG_CONFIG_HOME/compaction-proxy/prompts`, else `~/.config/compaction-proxy/prompts`."""
    env = os.environ if env is None else env
    config_home = env.get("XDG_CONFIG_HOME") or str((home or Path.home()) / ".config")
    return Path(config_home) / "compaction-proxy" / "prompts"


def builtin_prompts_dir(package_dir: Path = _PACKAGE_DIR) -> Path:
    """The shipped templates: inside the package in a wheel, the repo's `prompts/` in a checkout."""
    packaged = package_dir / "prompts"
    return packaged if packaged.is_dir() else package_dir.parent / "prompts"


class Templates:
    """Loads each template once, per file name from the first directory that has it.

    Undefined variables raise (StrictUndefined): a typo in an override template then fails the render and
    the caller keeps the raw summariser reply, instead of silently rendering a summary with sections missing.
    """

    def __init__(self, prompts_dir: Path | None = None, *, user_dir: Path | None = None) -> None:
        if prompts_dir is not None and not Path(prompts_dir).is_dir():
            raise ConfigError(f"compaction.prompts_dir: {prompts_dir} is not a directory")
        layers = [Path(prompts_dir)] if prompts_dir is not None else []
        layers += [user_dir if user_dir is not None else default_user_dir(), builtin_prompts_dir()]
        self.search_path: tuple[Path, ...] = tuple(layers)
        self._asked: str | None = None
        self._loader = jinja2.FileSystemLoader([str(path) for path in self.search_path])
        self._env = jinja2.Environment(
            loader=self._loader,
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # markdown for a model, not HTML
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            auto_reload=False,
        )
        self._env.filters["code_fence"] = code_fence
        self._compile_source = lru_cache(maxsize=_COMPILED_SOURCES_KEPT)(self._env.from_string)

    def render(self, name: str, /, **variables: Any) -> str:
        """Render a template file by name; message text must only ever arrive here as a variable."""
        return self._env.get_template(name).render(**variables).strip()

    def render_string(self, source: str, /, **variables: Any) -> str:
        """Render operator-supplied template source (never message text) with the same filters."""
        return self._compile_source(source).render(**variables).strip()

    def source(self, name: str) -> str:
        """The text of the template file that lookup picks for `name`."""
        text, _, _ = self._loader.get_source(self._env, name)
        return text

    def location(self, name: str) -> Path:
        """The file that lookup picks for `name` (for `check-config` and logs)."""
        _, filename, _ = self._loader.get_source(self._env, name)
        return Path(filename or name)

    def preload(self) -> None:
        """Load every known template now, so a missing file or a syntax error shows at startup."""
        for name in TEMPLATE_NAMES:
            self._env.get_template(name)

    def compaction_prompt(self, messages_transcript: str, *, window: int | None = None,
                          limit: int | None = None) -> str:
        """The system prompt of a transcript-layout request; `window` (the summariser's) picks short or full,
        `limit` (the output asked for) is stated so the model plans a summary that ends in time."""
        return self.render(COMPACTION_PROMPT, messages=messages_transcript, layout="transcript", window=window or 0,
                           limit=limit or 0)

    def compaction_request(self, *, window: int | None = None, limit: int | None = None) -> str:
        """The one user message that follows the conversation's own messages in a prefix-layout request."""
        return self._with_asked(self.render(COMPACTION_PROMPT, messages="", layout="prefix", window=window or 0,
                                            limit=limit or 0))

    def compaction_instruction(self) -> str:
        return self._with_asked(self.render(COMPACTION_INSTRUCTION))

    def merge_instruction(self, part_count: int, *, window: int | None = None) -> str:
        """The user message merging partial summaries; `window` (the summariser's) picks tiny or full."""
        return self._with_asked(self.render(MERGE_INSTRUCTION, part_count=part_count, window=window or 0))

    def asked(self, instructions: str | None) -> Templates:
        """These templates, with the client's own instructions for its summary added after each instruction that
        asks for the whole summary (not the parts of a chunked one: the merge sees the instructions)."""
        if not instructions:
            return self
        asked = copy.copy(self)
        asked._asked = instructions
        return asked

    def _with_asked(self, instruction: str) -> str:
        if self._asked is None:
            return instruction
        return f"{instruction}\n\n{self.render(CLIENT_INSTRUCTIONS, instructions=self._asked)}"

    def chunk_instruction(self, part_index: int, part_count: int, *, window: int | None = None) -> str:
        """The user message of one part's request; `window` (the summariser's) picks tiny or full."""
        return self.render(CHUNK_INSTRUCTION, part_index=part_index, part_count=part_count, window=window or 0)

    def summary(self, fields: Mapping[str, Any]) -> str:
        return self.render(SUMMARY, **fields)

    def continuation_note(self) -> str:
        return self.render(CONTINUATION)

    def summary_note(self) -> str:
        """The line that closes the summary message: quoted tool output in it is data, not an instruction."""
        return self.render(SUMMARY_NOTE)

    def acknowledgement(self) -> str:
        """The assistant's filler between two kept user messages (strict templates want roles to alternate)."""
        return self.render(ACKNOWLEDGEMENT)

    def elision_marker(self, tokens: int) -> str:
        return self.render(ELIDED, tokens=tokens)


@lru_cache(maxsize=1)
def default_templates() -> Templates:
    """Templates with no config dir (user dir from the environment), shared by callers that pass none."""
    return Templates()
