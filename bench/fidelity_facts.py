"""Seeded agent conversations with planted typed facts at known positions, and the exact-match grading of answers."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.fidelity_filler import PACKAGES, WORDS, Message, filler_round, hex_id, padded, tool_call, tool_result
from proxy.core.tokens import TokenCounter

KINDS = ("path", "identifier", "number", "error", "command", "constraint", "decision", "overridden")
SYSTEM = ("You are a coding agent working in the repository at /repo. Use the tools to read files, run commands "
          "and edit code. Keep your notes short.")
PROBE_SUFFIX = " Answer from our conversation so far, with the exact value only."
# Where each fact is planted, as a fraction of the conversation's tokens: spread so that every compaction cycle
# summarises some of them and later cycles must carry earlier ones through re-summarisation.
PLACEMENT = (("path", 0.04), ("error", 0.1), ("command", 0.14), ("stale", 0.2), ("port", 0.28),
             ("decision", 0.38), ("identifier", 0.48), ("timeout", 0.58), ("override", 0.68))
# The "front" shape plants the same facts in the same order, all before the first compaction (the last one at this
# share of the window, under the 0.8 threshold): an agent's instruction and early findings, then only tool rounds,
# so every later compaction must carry every fact through another summary and truncation keeps none of them.
# The "decisions" shape plants what a summary most often gets wrong: a prohibition stated once early, people with
# similar names and roles, and a decision overridden twice (each probe also checks no replaced value is given as
# current).
# Every fact comes before the third compaction (measured at 0.32, 0.46 and 0.61 of a 3,072-token window's three-
# cycle conversation with Qwen2.5-Coder-1.5B), each override between two compactions, so that later cycles carry it.
DECISION_PLACEMENT = (("prohibition", 0.03), ("path", 0.06), ("error", 0.09), ("people", 0.12), ("command", 0.15),
                      ("stale", 0.18), ("port", 0.22), ("decision", 0.26), ("override", 0.36), ("identifier", 0.42),
                      ("override2", 0.5), ("timeout", 0.54))
SHAPES = ("spread", "front", "decisions")
# Facts with several replaced values keep them in `stale`, separated by this.
STALE_SEP = " | "
# Similar first names, so a summary that blurs two people is caught.
NAME_PAIRS = (("Dana", "Dan"), ("Mara", "Mark"), ("Lena", "Len"), ("Joni", "Jon"), ("Rina", "Rin"))
SURNAMES = ("Reyes", "Okafor", "Lindqvist", "Tanaka", "Moreau", "Castillo")
FRONT_END = 0.6


@dataclass(frozen=True)
class Fact:
    """A planted fact: graded by `value`, asked by `question`, planted at message `index`."""

    key: str
    kind: str
    value: str
    question: str
    index: int = -1
    stale: str | None = None  # an overridden decision's old value: an answer naming it is out of date


@dataclass
class Conversation:
    seed: int
    messages: list[Message]
    facts: list[Fact]
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "tokens": self.tokens, "messages": self.messages,
                "facts": [asdict(fact) for fact in self.facts]}


@dataclass
class _Values:
    """Every planted value of one conversation, drawn from its seed so no model can guess them."""

    rng: random.Random
    package: str = ""
    path: str = ""
    constraint: str = ""
    error: str = ""
    command: str = ""
    port: str = ""
    decision: str = ""
    identifier: str = ""
    timeout: str = ""
    old_format: str = ""
    new_format: str = ""
    third_format: str = ""
    prod_db: str = ""
    staging_db: str = ""
    reviewer: str = ""
    owner: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def draw(self) -> _Values:
        rng = self.rng
        self.package = rng.choice(PACKAGES)
        self.path = f"src/{self.package}/ledger_{hex_id(rng)}.py"
        self.constraint = f"third_party/{rng.choice(WORDS)}_{rng.randint(1000, 9999)}"
        self.error = rng.choice((f"E{rng.randint(1000, 9999)}: checksum mismatch in shard {rng.randint(10, 99)}",
                                 f"E{rng.randint(1000, 9999)}: ledger drift of {rng.randint(101, 989)} cents",
                                 f"E{rng.randint(1000, 9999)}: duplicate journal key {hex_id(rng, 6)}"))
        self.command = f"pytest tests/{self.package}/test_shards_{hex_id(rng, 3)}.py -k reconcile --maxfail=1"
        self.port = str(rng.randint(20000, 64999))
        self.decision = f"{rng.randint(1000, 9999)}_add_{rng.choice(WORDS)}_index"
        self.identifier = f"round_half_{rng.choice(WORDS)}_{hex_id(rng, 3)}"
        self.timeout = str(rng.randint(2001, 8999))
        first, second = rng.sample(WORDS, 2)
        self.old_format = f"snapfmt_{first}_{hex_id(rng, 3)}"
        self.new_format = f"snapfmt_{second}_{hex_id(rng, 3)}"
        return self

    def draw_decisions(self, rng: random.Random) -> _Values:
        """The decisions shape's own values, from a generator of their own: drawing them changes nothing the
        other shapes draw, so their conversations stay what they were for a seed."""
        used = {self.old_format.split("_")[1], self.new_format.split("_")[1]}
        self.third_format = f"snapfmt_{rng.choice([w for w in WORDS if w not in used])}_{hex_id(rng, 3)}"
        number = rng.randint(2, 9)
        self.prod_db, self.staging_db = f"ledger-prod-{number}", f"ledger-staging-{number + rng.randint(1, 5)}"
        (long_name, short_name), surname = rng.choice(NAME_PAIRS), rng.choice(SURNAMES)
        self.reviewer, self.owner = f"{long_name} {surname}", f"{short_name} {surname}"
        return self


Planted = tuple[list[Message], int, Fact]  # messages, offset of the planting message, fact


def _plant_path(v: _Values, call: str) -> Planted:
    messages = [tool_call(call, "read_file", {"path": v.path}, "Reading the ledger module first."),
                tool_result(call, f"# {v.path}\ndef reconcile(batch):\n    return sum(round(x.amount, 1) for x in "
                                  "batch)"),
                {"role": "assistant", "content": f"Found it: the rounding bug is in {v.path} (it rounds to one "
                                                 "decimal place before summing)."}]
    return messages, 0, Fact("path", "path", v.path, "In which file did you find the rounding bug?")


def _plant_error(v: _Values, call: str) -> Planted:
    log = (f"tests/{v.package}/test_reconcile.py::test_nightly_batch FAILED\n"
           f"E   ReconcileError: {v.error}\n1 failed, 6 passed in 3.41s")
    messages = [tool_call(call, "run_command", {"command": f"pytest tests/{v.package} -q"}, "Running the tests."),
                tool_result(call, log)]
    return messages, 1, Fact("error", "error", v.error, "What exact error message did the failing test print?")


def _plant_command(v: _Values, call: str) -> Planted:
    messages = [tool_call(call, "run_command", {"command": v.command},
                          f"To iterate faster I will run only the failing shard tests with `{v.command}`."),
                tool_result(call, "1 failed, 0 passed in 0.88s")]
    return messages, 0, Fact("command", "command", v.command, "What exact command did you use to run only the "
                                                              "failing shard tests?")


def _plant_stale(v: _Values, call: str) -> Planted:
    messages = [tool_call(call, "read_file", {"path": f"src/{v.package}/snapshots.py"},
                          f"Decision: ledger snapshots will be written in the {v.old_format} format."),
                tool_result(call, "def write_snapshot(ledger, fmt):\n    return FORMATS[fmt].dump(ledger)")]
    return messages, 0, Fact("stale", "decision", v.old_format, "")  # not asked: the override supersedes it


def _plant_port(v: _Values, call: str) -> Planted:
    config = f"LEDGER_HOST=127.0.0.1\nLEDGER_PORT={v.port}\nLEDGER_POOL=8\nLEDGER_TLS=false"
    messages = [tool_call(call, "read_file", {"path": "config/ledger.env"}, "Checking how the service is reached."),
                tool_result(call, config)]
    return messages, 1, Fact("port", "number", v.port, "Which port does the local ledger service listen on?")


def _plant_decision(v: _Values, call: str) -> Planted:
    messages = [tool_call(call, "edit_file", {"path": f"migrations/{v.decision}.sql", "content": "CREATE INDEX"},
                          f"Decision: the schema change goes into a new migration named {v.decision}."),
                tool_result(call, "file written")]
    return messages, 0, Fact("decision", "decision", v.decision, "What name did we decide on for the new migration?")


def _plant_identifier(v: _Values, call: str) -> Planted:
    patch = {"path": v.path, "old": "round(x.amount, 1)", "new": f"{v.identifier}(x.amount)"}
    messages = [tool_call(call, "edit_file", patch, f"I am replacing the rounding with a new helper, "
                                                    f"{v.identifier}, that rounds half to even on whole cents."),
                tool_result(call, "patch applied")]
    return messages, 0, Fact("identifier", "identifier", v.identifier,
                             "What is the name of the helper function you added for the rounding?")


def _plant_timeout(v: _Values, call: str) -> Planted:
    messages = [tool_call(call, "edit_file", {"path": "config/ledger.env", "set": f"RECONCILE_TIMEOUT_MS={v.timeout}"},
                          "The nightly batch times out; raising the limit."),
                tool_result(call, f"config/ledger.env: RECONCILE_TIMEOUT_MS changed from 1500 to {v.timeout}")]
    return messages, 0, Fact("timeout", "number", v.timeout, "What value did you set RECONCILE_TIMEOUT_MS to?")


def _plant_override(v: _Values, call: str) -> Planted:
    messages = [{"role": "assistant", "content": "The reconcile tests pass now."},
                {"role": "user", "content": f"Good. One change: use {v.new_format} instead of {v.old_format} for the "
                                            "ledger snapshots. Then keep going with the remaining checks."}]
    return messages, 1, Fact("override", "overridden", v.new_format, "Which snapshot format are we using in the end?",
                             stale=v.old_format)


def _plant_prohibition(v: _Values, call: str) -> Planted:
    messages = [{"role": "assistant", "content": "I will look at the migrations next."},
                {"role": "user", "content": f"Careful: never run migrations against {v.prod_db}. Only "
                                            f"{v.staging_db} may be migrated."}]
    return messages, 1, Fact("prohibition", "constraint", v.staging_db, "Which database may the migrations run "
                             "against?", stale=v.prod_db)


def _plant_people(v: _Values, call: str) -> Planted:
    messages = [{"role": "assistant", "content": "Who should look at the ledger changes?"},
                {"role": "user", "content": f"{v.reviewer} reviews every change to ledger-sync; {v.owner} owns "
                                            "ledger-sink and writes its migrations. Do not mix them up."}]
    return messages, 1, Fact("people", "identifier", v.reviewer, "Who reviews changes to ledger-sync?",
                             stale=v.owner)


def _plant_override_unasked(v: _Values, call: str) -> Planted:
    messages, offset, fact = _plant_override(v, call)
    return messages, offset, Fact(fact.key, fact.kind, fact.value, "", stale=fact.stale)  # the second supersedes it


def _plant_second_override(v: _Values, call: str) -> Planted:
    messages = [{"role": "assistant", "content": f"The snapshots are written in {v.new_format} now."},
                {"role": "user", "content": f"Change of plan again: switch from {v.new_format} to {v.third_format} "
                                            "for the ledger snapshots. That is final."}]
    return messages, 1, Fact("override2", "overridden", v.third_format, "Which snapshot format are we using in the "
                             "end?", stale=STALE_SEP.join((v.old_format, v.new_format)))


PLANTERS: dict[str, Callable[[_Values, str], Planted]] = {
    "path": _plant_path, "error": _plant_error, "command": _plant_command, "stale": _plant_stale,
    "port": _plant_port, "decision": _plant_decision, "identifier": _plant_identifier, "timeout": _plant_timeout,
    "override": _plant_override, "prohibition": _plant_prohibition, "people": _plant_people,
    "override2": _plant_second_override}


def target_tokens(window: int, cycles: int) -> int:
    """Conversation length that passes the 0.8 threshold `cycles` times: ~0.8 W first, then ~0.4 W a cycle,
    with room for a retry after a failed summary (the proxy backs off a turn or more)."""
    return int(window * (1.1 + 0.5 * (cycles - 1)))


def generate(seed: int, window: int = 1536, cycles: int = 3, counter: TokenCounter | None = None,
             shape: str = "spread", result_tokens: int = 0) -> Conversation:
    """A deterministic agent conversation for `seed`, long enough for `cycles` compactions at `window`, its facts
    planted over the whole conversation (`spread`) or all before the first compaction (`front`); with
    `result_tokens`, every tool result grown to about that many tokens by log lines after what it says."""
    if shape not in SHAPES:
        raise ValueError(f"unknown conversation shape {shape!r}: one of {', '.join(SHAPES)}")
    rng = random.Random(seed)
    values = _Values(rng).draw().draw_decisions(random.Random(f"{seed}:decisions"))
    counter = counter or TokenCounter()
    count = counter.count_messages
    noise = random.Random(f"{seed}:noise")  # apart from `rng`: the same seed plants the same values, grown or not

    def grown(messages: list[Message]) -> list[Message]:
        return padded(messages, noise, result_tokens, counter.count_text)

    instruction = (f"Fix the failing reconciliation tests in the {values.package} service. Never touch "
                   f"{values.constraint}/: it is a pinned upstream copy.")
    messages: list[Message] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    facts = [Fact("constraint", "constraint", values.constraint, "Which directory did I tell you never to touch?",
                  index=1)]
    total = target_tokens(window, cycles)
    placement = DECISION_PLACEMENT if shape == "decisions" else PLACEMENT
    scale = FRONT_END * window / PLACEMENT[-1][1] if shape == "front" else total
    calls = iter(range(1, 10_000))
    for key, share in placement:
        while count(messages) < share * scale:
            messages += grown(filler_round(rng, f"call_{next(calls)}"))
        planter = _plant_override_unasked if shape == "decisions" and key == "override" else PLANTERS[key]
        planted, offset, fact = planter(values, f"call_{next(calls)}")
        facts.append(_at(fact, len(messages) + offset))
        messages += grown(planted)
    while count(messages) < total:
        messages += grown(filler_round(rng, f"call_{next(calls)}"))
    probed = [fact for fact in facts if fact.question]
    return Conversation(seed, messages, probed, count(messages))


def _at(fact: Fact, index: int) -> Fact:
    return Fact(fact.key, fact.kind, fact.value, fact.question, index, fact.stale)


def message_text(message: Message) -> str:
    """Everything a message carries that a model may read: its content and its tool calls' arguments."""
    parts = [str(message.get("content") or "")]
    parts += [call["function"]["arguments"] for call in message.get("tool_calls") or ()]
    return "\n".join(parts)


def drive_points(messages: Sequence[Message]) -> list[int]:
    """Indices after which a client sends a request: its last message is a user turn or a round's last result."""
    points = []
    for index, message in enumerate(messages):
        following = messages[index + 1] if index + 1 < len(messages) else None
        if message["role"] in ("user", "tool") and (following is None or following["role"] == "assistant"):
            points.append(index)
    return points


def probe_message(fact: Fact) -> Message:
    return {"role": "user", "content": fact.question + PROBE_SUFFIX}


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def contains(text: str, value: str) -> bool:
    """Case-insensitive, whitespace-normalised substring; a number must not be part of a longer number."""
    haystack, needle = normalise(text), normalise(value)
    if needle.isdigit():
        return re.search(rf"(?<!\d){re.escape(needle)}(?!\d)", haystack) is not None
    return needle in haystack


def grade(answer: str, fact: Fact) -> dict[str, bool]:
    """Whether an answer holds the fact's value, and (overridden decisions) whether it names the stale one."""
    stale = fact.stale.split(STALE_SEP) if fact.stale else []
    return {"correct": contains(answer, fact.value),
            "stale": any(contains(answer, old) for old in stale) and not contains(answer, fact.value)}


def facts_in(text: str, facts: Sequence[Fact]) -> list[str]:
    """Keys of the facts whose value appears verbatim in `text`."""
    return [fact.key for fact in facts if contains(text, fact.value)]


def request_text(body: dict[str, Any]) -> str:
    """The whole text of a chat request's messages, for finding planted values in it."""
    return "\n".join(message_text(message) for message in body.get("messages") or () if isinstance(message, dict))
