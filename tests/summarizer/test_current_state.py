"""proxy.summarizer.current_state: replaced values never stated as current, no reply copied as the plan."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.summarizer.current_state import corrected, replaced_values
from proxy.summarizer.stated import overrides
from proxy.summarizer.summary import Decision, StructuredSummary

OVERRIDE = {"role": "user", "content": "One change: use snapfmt_new_2 instead of snapfmt_old_1 for the snapshots."}
REPLY = ("I will write the ledger snapshots with the new format and then run the remaining reconcile checks "
         "on every shard.")
HISTORY = [{"role": "user", "content": "Fix the reconcile tests."}, {"role": "assistant", "content": REPLY},
           OVERRIDE]


def test_a_chain_of_overrides_leaves_only_the_latest_current() -> None:
    stated = overrides([{"role": "user", "content": "switch from A_1 to B_2"},
                        {"role": "user", "content": "switch from B_2 to C_3"}])
    assert replaced_values(StructuredSummary(), stated) == {"a_1": "C_3", "b_2": "C_3"}
    back = [*stated, ("C_3", "A_1")]  # and back to the first: A is current again
    assert replaced_values(StructuredSummary(), back) == {"b_2": "A_1", "c_3": "A_1"}


# (field, the model's value, the value after the checks)
CASES: list[tuple[str, Any, Any]] = [
    ("current_work", "Writing snapshots in snapfmt_old_1. The tests pass.", "The tests pass."),
    ("current_work", "Moving from snapfmt_old_1 to snapfmt_new_2.", "Moving from snapfmt_old_1 to snapfmt_new_2."),
    ("current_work", "Writing snapshots in snapfmt_old_1.", None),
    ("next_step", "Write the next snapshot in snapfmt_old_1.", None),
    ("next_step", REPLY, None),  # the assistant's own words, copied
    ("next_step", "Run the remaining checks.", "Run the remaining checks."),
    ("user_intent", ("Use snapfmt_old_1 for snapshots", "Fix the tests"), ("Fix the tests",)),
    ("pending_tasks", ("Convert to snapfmt_old_1", "Use snapfmt_new_2"), ("Use snapfmt_new_2",)),
    ("user_messages", (OVERRIDE["content"],), (OVERRIDE["content"],)),  # the user's words are history, kept
    ("problem_solving", ("Tried snapfmt_old_1 first",), ("Tried snapfmt_old_1 first",)),
    ("current_work", "snapfmt_old_1x is another name.", "snapfmt_old_1x is another name."),  # not the value
]


@pytest.mark.parametrize(("name", "written", "checked"), CASES)
def test_a_replaced_value_is_never_stated_as_current(name: str, written: Any, checked: Any) -> None:
    summary = StructuredSummary(**{name: written})
    fixed, corrections = corrected(summary, HISTORY)
    assert getattr(fixed, name) == checked
    assert bool(corrections) is (checked != written)
    assert all(correction.field == name for correction in corrections)


def test_a_decision_naming_the_replaced_value_names_its_replacement() -> None:
    summary = StructuredSummary(decisions=(Decision("snapshot format", "snapfmt_old_1"),))
    fixed, [correction] = corrected(summary, HISTORY)
    assert fixed.decisions == (Decision("snapshot format", "snapfmt_new_2", ("snapfmt_old_1",)),)
    assert (correction.field, correction.rule) == ("decisions", "decision_current")


TWICE = [*HISTORY, {"role": "user", "content": "Change of plan again: switch from snapfmt_new_2 to snapfmt_last_3."}]


@pytest.mark.parametrize(("current", "kept"), [
    pytest.param("use snapfmt_new_2 instead of snapfmt_old_1", False,
                 id="the first change as current, written after the second replaced it: dropped"),
    pytest.param("snapshots in snapfmt_new_2", False, id="a replaced value inside a longer current: dropped"),
    pytest.param("snapfmt_last_3, no longer snapfmt_new_2", True, id="names what replaced it: kept"),
    pytest.param("the migration is named 1416_add_index", True, id="another decision: kept"),
])
def test_a_decision_whose_current_text_names_a_replaced_value_is_dropped(current: str, kept: bool) -> None:
    history = [*TWICE, {"role": "user", "content": "Name the migration 1416_add_index."}]
    summary = StructuredSummary(decisions=(Decision("snapshots", current),))
    fixed, corrections = corrected(summary, history)
    assert (fixed.decisions == summary.decisions) is kept
    assert [(c.field, c.rule) for c in corrections] == ([] if kept else [("decisions", "replaced_value")])


def test_the_models_own_decisions_police_the_other_fields() -> None:
    summary = StructuredSummary(decisions=(Decision("db", "Postgres", ("SQLite",)),),
                                current_work="Creating the SQLite schema.", next_step="Test on Postgres.")
    fixed, corrections = corrected(summary, [{"role": "user", "content": "Fix it."}])
    assert (fixed.current_work, fixed.next_step) == (None, "Test on Postgres.")
    assert [correction.rule for correction in corrections] == ["replaced_value"]


def test_a_summary_with_nothing_to_correct_is_the_same_object() -> None:
    summary = StructuredSummary(user_intent=("Fix the tests",), next_step="Run them.")
    assert corrected(summary, HISTORY) == (summary, ())


@pytest.mark.parametrize(("data", "decisions"), [
    ({}, ()),  # the nine-field shape: no decisions
    ({"decisions": [{"topic": "db", "current": "Postgres", "replaced": ["SQLite"], "said": "use Postgres"}]},
     (Decision("db", "Postgres", ("SQLite",), "use Postgres"),)),
    ({"decisions": [{"topic": "db", "value": "Postgres"}]}, (Decision("db", "Postgres"),)),
    ({"decisions": ["Postgres for the database"]}, (Decision(None, "Postgres for the database"),)),
    ({"decisions": {"topic": "db", "choice": "Postgres", "replaced": "SQLite"}},
     (Decision("db", "Postgres", ("SQLite",)),)),
    ({"decisions": [{"topic": "db"}, None, ""]}, ()),  # nothing current, nothing replaced: no decision
])
def test_the_parser_reads_old_and_new_shapes(data: dict[str, Any], decisions: tuple[Decision, ...]) -> None:
    parsed = StructuredSummary.from_dict({"user_intent": ["x"], **data})
    assert parsed.decisions == decisions and parsed.user_intent == ("x",)


def test_decisions_and_constraints_render_first_and_mark_what_was_replaced() -> None:
    text = StructuredSummary(decisions=(Decision("db", "Postgres", ("SQLite",), "use Postgres instead"),),
                             constraints=("Never touch vendor/",), user_intent=("ship it",)).render()
    assert text.index("## Current Decisions") < text.index("## Constraints") < text.index("## User Intent")
    assert "- db: Postgres (replaced, no longer current: SQLite)" in text


RULES = [{"role": "user", "content": "Fix the tests. Never touch third_party/amber_1234/: it is a pinned copy."},
         {"role": "assistant", "content": "Only ledger-staging-9 is safe, I think."},
         {"role": "user", "content": "Careful: never run migrations on ledger-prod-4. Only ledger-staging-7 may "
                                     "be migrated."}]


@pytest.mark.parametrize(("written", "quoted"), [
    ("Do not modify third_party/amber_1234/", ("Never touch third_party/amber_1234/: it is a pinned copy.",)),
    ("Only migrate ledger-staging-7", ("Only ledger-staging-7 may be migrated.",)),
    ("Never touch third_party/amber_1234/: it is a pinned copy.",
     ("Never touch third_party/amber_1234/: it is a pinned copy.",)),  # the user's words already
    ("Keep the tests fast", ("Keep the tests fast",)),  # no exact value to find the user's sentence by
    ("Only migrate ledger-staging-9", ("Only migrate ledger-staging-9",)),  # the assistant said it, not the user
    # Two of the user's sentences joined into one rule: both sentences, each whole.
    ("Migrate ledger-staging-7, never ledger-prod-4",
     ("Careful: never run migrations on ledger-prod-4.", "Only ledger-staging-7 may be migrated.")),
    ("Careful: never run migrations on ledger-prod-4.\nOnly ledger-staging-7 may be ",
     ("Careful: never run migrations on ledger-prod-4.", "Only ledger-staging-7 may be migrated.")),
    ("Careful: never run migrations on ledger-prod-4. Only ledger-staging-7 may be migrated.",
     ("Careful: never run migrations on ledger-prod-4. Only ledger-staging-7 may be migrated.",)),  # as said
    # The user's words cut off inside a value name another host: the sentence is quoted whole.
    ("Careful: never run migrations on ledger-prod-4. Only ledger",
     ("Careful: never run migrations on ledger-prod-4.",)),
    ("Only ledger-staging-7 may be", ("Only ledger-staging-7 may be migrated.",)),  # cut off after the value
    ("Careful: never run migrations on ledger-prod-4.", ("Careful: never run migrations on ledger-prod-4.",)),
    ("Never touch third_party/amber_1234/ or ledger-prod-5", ("Never touch third_party/amber_1234/ or ledger-prod-5",)),
])
def test_a_paraphrased_constraint_becomes_the_users_sentences(written: str, quoted: tuple[str, ...]) -> None:
    fixed, corrections = corrected(StructuredSummary(constraints=(written,)), RULES)
    assert fixed.constraints == quoted
    assert [c.rule for c in corrections] == (["quoted"] if quoted != (written,) else [])


EARLIER = ("# Conversation Summary\n\n## Current Decisions\n\n- ledger snapshots use snapfmt_amber_7ef.\n\n"
           "## Constraints\n\n- Careful: never run migrations on ledger-prod-4.\n- Only ledger-staging-7 may be "
           "migrated.\n- Never touch third_party/amber_1234/: it is a pinned copy.\n\n## Current Work\n\nFixed "
           "the rounding bug in src/payments/ledger_283f.py.")


@pytest.mark.parametrize("written", ["Careful: never run migrations on ledger-prod-4.\nOnly ledger-staging-7 may be ",
                                     "Migrate ledger-staging-7, never ledger-prod-4, leave third_party/amber_1234/"])
def test_an_earlier_summary_is_never_quoted_whole_as_a_constraint(written: str) -> None:
    """The earlier summary is sent with the user's role; its rules are sentences, the summary is not one."""
    history = [{"role": "user", "content": EARLIER}, {"role": "assistant", "content": "Understood."},
               {"role": "user", "content": "Good, carry on."}]
    fixed, _ = corrected(StructuredSummary(constraints=(written,)), history)
    assert all("## " not in rule and "Conversation Summary" not in rule for rule in fixed.constraints)
    assert "Only ledger-staging-7 may be migrated." in fixed.constraints
    assert "Careful: never run migrations on ledger-prod-4." in fixed.constraints


def test_a_constraint_quoted_twice_is_kept_once() -> None:
    fixed, _ = corrected(StructuredSummary(constraints=("Do not modify third_party/amber_1234/",
                                                        "Never touch third_party/amber_1234/: it is a pinned copy.")),
                         RULES)
    assert fixed.constraints == ("Never touch third_party/amber_1234/: it is a pinned copy.",)


def test_a_decision_listing_its_current_value_as_replaced_keeps_it_current() -> None:
    summary = StructuredSummary(decisions=(Decision("task", "Fix the tests", ("Run pytest", "fix the tests")),))
    fixed, [correction] = corrected(summary, [{"role": "user", "content": "Fix the tests."}])
    assert fixed.decisions == (Decision("task", "Fix the tests", ("Run pytest",)),)
    assert correction.rule == "replaced_is_current"


@pytest.mark.parametrize(("current", "kept"), [
    ("the schema change goes into a new migration named 1416_add_vesper_index", True),
    ("the schema change goes into a new migration named 1416_add_vesar", False),  # garbled: no such name was said
    ("1416_add_vesper", False),  # cut off inside the name
    ("Postgres for the database", True),  # no exact value to look for
    ("migrations/1416_add_vesper_index.sql", True),  # found in a tool call's arguments
])
def test_a_decision_naming_a_value_the_conversation_never_held_is_dropped(current: str, kept: bool) -> None:
    history = [{"role": "user", "content": "Fix the reconcile tests."},
               {"role": "assistant", "content": "Decision: the schema change goes into a new migration named "
                                                "1416_add_vesper_index.",
                "tool_calls": [{"id": "c", "type": "function", "function": {
                    "name": "edit_file", "arguments": '{"path": "migrations/1416_add_vesper_index.sql"}'}}]}]
    fixed, corrections = corrected(StructuredSummary(decisions=(Decision("migration", current),)), history)
    assert (fixed.decisions == (Decision("migration", current),)) is kept
    assert [c.rule for c in corrections] == ([] if kept else ["unfounded"])


SNAPSHOTS = "use snapfmt_raven_7b7 instead of snapfmt_amber_7ef for the ledger snapshots."


@pytest.mark.parametrize(("said", "kept"), [
    ("Dana Reyes reviews every change to ledger-sync; Dan Reyes owns ledger-sink and 141", False),
    (f"One change: {SNAPSHOTS}", True),          # names the current value
    ("We dropped snapfmt_amber_7ef.", True),     # names the replaced one
    (None, True),
])
def test_a_decisions_quote_that_names_none_of_its_values_is_dropped(said: str | None, kept: bool) -> None:
    decision = Decision("snapshots", "ledger snapshots use snapfmt_raven_7b7", ("snapfmt_amber_7ef",), said)
    history = [{"role": "user", "content": f"Good. One change: {SNAPSHOTS} We dropped snapfmt_amber_7ef."}]
    fixed, corrections = corrected(StructuredSummary(decisions=(decision,)), history)
    assert fixed.decisions == ((decision,) if kept else (Decision(decision.topic, decision.current,
                                                                   decision.replaced, None),))
    assert [c.rule for c in corrections] == ([] if kept else ["misquoted"])


MIGRATION = "Decision: the schema change goes into a new migration named 1701_add_krill_index."


@pytest.mark.parametrize(("field", "written", "respelled"), [
    ("problem_solving", ("The schema change goes into a new migration named 1701_add_krillIndex",),
     ("The schema change goes into a new migration named 1701_add_krill_index",)),
    ("current_work", "Writing `1701-Add-Krill-Index`.", "Writing `1701_add_krill_index`."),  # its punctuation kept
    ("pending_tasks", ("edit src/ledger/sync.py", "run migrations/1701-add-krill-index.sql"),
     ("edit src/ledger/sync.py", "run migrations/1701_add_krill_index.sql")),  # from a tool call's arguments
    ("next_step", "Run 1701_add_krill_index on ledger-staging-7.", None),  # spelled as said: nothing to do
    ("errors_and_fixes", ("ledgersync_v2 failed",), None),  # the conversation spells it two ways: left alone
    ("user_intent", ("ship v12",), None),  # "v1.2": too short a skeleton to tell a respelling from another value
    ("technical_concepts", ("SRC/LEDGER/SYNC.PY",), None),  # case alone is the same value
    ("problem_solving", ("1416_add_vesar",), None),  # no value of the conversation has its skeleton
])
def test_an_exact_value_is_spelled_as_the_conversation_spells_it(field: str, written: Any, respelled: Any) -> None:
    history = [{"role": "user", "content": "Fix the reconcile tests on v1.2. Both ledgersync-v2 and ledgersync_v2 "
                                           "are names in use."},
               {"role": "assistant", "content": MIGRATION, "tool_calls": [{"id": "c", "type": "function", "function": {
                   "name": "edit_file", "arguments": '{"path": "migrations/1701_add_krill_index.sql"}'}}]},
               {"role": "tool", "tool_call_id": "c", "content": "see src/ledger/sync.py and ledger-staging-7"}]
    fixed, corrections = corrected(StructuredSummary(**{field: written}), history)
    assert getattr(fixed, field) == (written if respelled is None else respelled)
    assert [(c.field, c.rule) for c in corrections] == ([] if respelled is None else [(field, "respelled")])


def test_a_respelled_value_is_checked_after_the_other_rules() -> None:
    summary = StructuredSummary(current_work="Writing snapfmt_Old_1 files, then 1701_add_krillIndex.",
                                next_step="Apply 1701-add-krill-index.")
    fixed, corrections = corrected(summary, [*HISTORY, {"role": "assistant", "content": MIGRATION}])
    assert fixed.current_work is None  # stating the replaced value as current goes first, respelled or not
    assert fixed.next_step == "Apply 1701_add_krill_index."
    assert [(c.field, c.rule) for c in corrections] == [("current_work", "replaced_value"),
                                                         ("next_step", "respelled")]


# A conversation with two decisions announced (the format first, the migration after) and a change of mind.
DECIDED = [{"role": "user", "content": "Fix the reconcile tests. I noticed the rounding bug breaks the ledger."},
           {"role": "assistant", "content": "Decision: ledger snapshots will be written in the snapfmt_amber_a54 "
                                            "format."},
           {"role": "assistant", "content": "Decision: the schema change goes into a new migration named "
                                            "7226_add_onyx_index."},
           {"role": "user", "content": "Please use Postgres instead of SQLite for the cache."}]
AMBER = "ledger snapshots will be written in the snapfmt_amber_a54 format."
ONYX = "the schema change goes into a new migration named 7226_add_onyx_index."


# (the model's decision, the decisions after the checks, the rules that fired)
DECISION_CASES: list[tuple[Decision, tuple[Decision, ...], list[str]]] = [
    # a decision announced after the current one cannot be what the current one replaced
    (Decision("current", AMBER, (ONYX,)), (Decision("current", AMBER),), ["replaced_later"]),
    # announced before it: a later decision replacing an earlier one is kept
    (Decision("migration", ONYX, (AMBER,)), (Decision("migration", ONYX, (AMBER,)),), []),
    # the user's change of mind, the old value marked replaced
    (Decision("cache", "Postgres", ("SQLite",)), (Decision("cache", "Postgres", ("SQLite",)),), []),
    # a sentence in the place of a value goes; the decision stays for its current value
    (Decision(None, AMBER, ("The reconciliation tests were failing due to rounding issues in the ledger",)),
     (Decision(None, AMBER),), ["not_a_value"]),
    # an open decision whose only replaced entry was a sentence is left with nothing: dropped
    (Decision("current", None, ("The reconciliation tests were failing due to rounding issues in the ledger",)),
     (), ["not_a_value", "empty"]),
    # a short replaced value without an exact one stays, said or not
    (Decision("store", "Postgres", ("plain files",)), (Decision("store", "Postgres", ("plain files",)),), []),
    # a quote the user never said goes; the user's words, whole or cut short, stay
    (Decision("cache", "Postgres", ("SQLite",), "I noticed that the rounding bug was causing problems"),
     (Decision("cache", "Postgres", ("SQLite",)),), ["unsaid"]),
    (Decision("cache", "Postgres", ("SQLite",), "use Postgres instead of SQLite"),
     (Decision("cache", "Postgres", ("SQLite",), "use Postgres instead of SQLite"),), []),
    (Decision("cache", "Postgres", ("SQLite",), "Please use Postgres … for the cache."),
     (Decision("cache", "Postgres", ("SQLite",), "Please use Postgres … for the cache."),), []),
    (Decision("cache", "Postgres", ("SQLite",), "use Postgres ... for the whole app"),
     (Decision("cache", "Postgres", ("SQLite",)),), ["unsaid"]),
    # an earlier summary's rendering copied into a value: cut there, and the rest checked as any value
    (Decision("current", ONYX, ("ledger snapshots will be written in the snapfmt_raven_7b7 format. (replaced, no "
                                "longer current: ledger snapshots will be written in the snapfmt_amber_a54 format.)",)),
     (Decision("current", ONYX, ("ledger snapshots will be written in the snapfmt_raven_7b7 format.",)),),
     ["rendered"]),
    (Decision("current", AMBER, (f"{ONYX} (replaced, no longer current: {AMBER}) (the user: \"no\")",)),
     (Decision("current", AMBER),), ["rendered", "replaced_later"]),
    (Decision("cache", 'Postgres (the user: "use Postgres instead of SQLite")', ("SQLite",)),
     (Decision("cache", "Postgres", ("SQLite",)),), ["rendered"]),
    (Decision("cache", "(replaced, no longer current: SQLite)", ("SQLite",)),
     (Decision("cache", None, ("SQLite",)),), ["rendered"]),
]


@pytest.mark.parametrize(("written", "checked", "rules"), DECISION_CASES)
def test_a_decision_keeps_only_what_it_can_have_replaced_and_what_the_user_said(
        written: Decision, checked: tuple[Decision, ...], rules: list[str]) -> None:
    fixed, corrections = corrected(StructuredSummary(decisions=(written,)), DECIDED)
    assert fixed.decisions == checked
    assert [c.rule for c in corrections] == rules


def test_a_value_marked_replaced_by_a_later_decision_no_longer_polices_the_other_fields() -> None:
    summary = StructuredSummary(decisions=(Decision(None, AMBER, (ONYX,)),), current_work=f"Writing {ONYX}")
    fixed, corrections = corrected(summary, DECIDED)
    assert fixed.current_work == f"Writing {ONYX}"
    assert [c.rule for c in corrections] == ["replaced_later"]


@pytest.mark.parametrize(("written", "kept"), [
    (("<tool_response>", "Fix the reconcile tests."), ("Fix the reconcile tests.",)),
    (("</tool_call>", " <tool_response> </tool_response> "), ()),
    (("Use <b>bold</b> in the report.",), None),  # markup inside words is the user's
])
def test_markup_in_the_place_of_a_users_message_is_dropped(written: tuple[str, ...],
                                                          kept: tuple[str, ...] | None) -> None:
    fixed, corrections = corrected(StructuredSummary(user_messages=written), DECIDED)
    assert fixed.user_messages == (written if kept is None else kept)
    assert [(c.field, c.rule) for c in corrections] == ([] if kept is None else [("user_messages", "markup")])


@pytest.mark.parametrize(("field", "written", "kept"), [
    ("problem_solving", ("Snapshots are now written in snapfmt_old_1.", "Ran the tests."), ("Ran the tests.",)),
    ("problem_solving", ("Tried snapfmt_old_1 first; it broke the reader.",), None),  # history: what was tried
    ("problem_solving", ("snapfmt_old_1 is now replaced by snapfmt_new_2.",), None),  # names the replacement
    ("technical_concepts", ("snapfmt_old_1, currently in use",), ()),
    ("technical_concepts", ("the snapfmt family of formats",), None),
])
def test_a_history_entry_saying_a_replaced_value_holds_now_is_dropped(field: str, written: tuple[str, ...],
                                                                     kept: tuple[str, ...] | None) -> None:
    fixed, corrections = corrected(StructuredSummary(**{field: written}), HISTORY)
    assert getattr(fixed, field) == (written if kept is None else kept)
    assert [(c.field, c.rule) for c in corrections] == ([] if kept is None else [(field, "replaced_value")])
