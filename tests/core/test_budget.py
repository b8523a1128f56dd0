"""Table-driven tests of every budget decision, and a property: a plan leaves room for the next turn."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import budget
from proxy.core.budget import MIN_SUMMARY_TOKENS, Limits
from proxy.core.plan import plan_compaction


def limits(window: int, reserve: int = 1024, **fields: float) -> Limits:
    return Limits(window=window, threshold=fields.get("threshold", 0.8), target=fields.get("target", 0.5),
                  reserve=reserve, tail_share=fields.get("tail_share", 0.25),
                  instruction_share=fields.get("instruction_share", 0.1))


@pytest.mark.parametrize(
    ("window", "reserve", "prompt", "over"),
    [
        (4000, 1024, 2176, False),    # 2176 + 1024 = 3200 = 0.8 x 4000: at the trigger, not past it
        (4000, 1024, 2177, True),
        (3000, 1024, 1376, False),
        (3000, 1024, 1377, True),
        (128000, 4096, 98304, False),
        (128000, 4096, 98305, True),
        (8192, 0, 6554, True),
    ],
)
def test_trigger(window: int, reserve: int, prompt: int, over: bool) -> None:
    assert budget.over_threshold(limits(window, reserve), prompt) is over


@pytest.mark.parametrize(
    ("window", "reserve", "prompt", "share", "past", "lead"),
    [
        (4000, 1024, 1376, 0.75, False, 800),   # 1376 + 1024 = 2400 = 0.75 x 3200: at the mark, not past it
        (4000, 1024, 1377, 0.75, True, 799),
        (4000, 1024, 2500, 0.75, True, 0),      # past the threshold itself: nothing left to grow
        (128000, 0, 76801, 0.75, True, 25599),  # 0.6 of the window
        (128000, 0, 76800, 0.75, False, 25600),
    ],
)
def test_the_mark_a_summary_is_prepared_at(window: int, reserve: int, prompt: int, share: float, past: bool,
                                           lead: int) -> None:
    assert budget.past_share(limits(window, reserve), prompt, share) is past
    assert budget.lead_tokens(limits(window, reserve), prompt) == lead


@pytest.mark.parametrize("threshold", [0.0, 1.0, 1.5])
def test_no_proactive_trigger_when_threshold_is_off(threshold: float) -> None:
    assert not budget.over_threshold(limits(4000, threshold=threshold, target=0.5), 10**9)
    assert not budget.past_share(limits(4000, threshold=threshold, target=0.5), 10**9, 0.75)


@pytest.mark.parametrize(
    # What the module decides for a few windows, the fixed part being head + current round (+ latest user).
    ("window", "reserve", "fixed", "growth", "expected"),
    [
        # goal = target - reserve - growth; the summary's floor first (15 % of the window, at least 256, at most
        # the summariser's cap of 4096), then the tail (its share of the window), then earlier user messages, then
        # the summary gets the rest.
        (4000, 1024, 400, 330, {"goal": 646, "tail_tokens": 0, "instruction_tokens": 0, "summary_tokens": 600}),
        (3000, 1024, 120, 250, {"goal": 226, "tail_tokens": 0, "instruction_tokens": 0, "summary_tokens": 450}),
        (3000, 256, 120, 250, {"goal": 994, "tail_tokens": 424, "instruction_tokens": 0, "summary_tokens": 450}),
        (8192, 1024, 308, 369, {"goal": 2703, "tail_tokens": 1167, "instruction_tokens": 0, "summary_tokens": 1228}),
        # 15 % is 4,915: the cap holds the floor to 4,096, and earlier user messages get what the tail leaves.
        (32768, 1024, 2000, 800,
         {"goal": 14560, "tail_tokens": 8192, "instruction_tokens": 272, "summary_tokens": 4096}),
        (128000, 4096, 5000, 2000,
         {"goal": 57904, "tail_tokens": 32000, "instruction_tokens": 12800, "summary_tokens": 4096}),
    ],
)
def test_allotment_for_a_few_windows(window: int, reserve: int, fixed: int, growth: int,
                                     expected: dict[str, int]) -> None:
    allotment = budget.allot(limits(window, reserve), fixed=fixed, growth=growth)
    assert {key: getattr(allotment, key) for key in expected} == expected
    assert allotment.attainable == (fixed + allotment.summary_tokens <= allotment.goal)
    assert (allotment.why_not_attainable() is None) == allotment.attainable


@pytest.mark.parametrize(("window", "reserve", "fixed", "growth", "shortfall"), [
    (32768, 1024, 2000, 800, 0),      # attainable: no shortfall
    (4000, 1024, 1500, 330, 1454),    # goal 646: the verbatim 1,500 and the floor of 600 stay 1,454 past it
    (2000, 1024, 100, 330, 754),      # goal -354: the verbatim 100 and the floor of 300 past a negative goal
], ids=["attainable", "verbatim-too-long", "no-room"])
def test_the_shortfall_is_how_far_past_the_goal_a_plan_stays(window: int, reserve: int, fixed: int, growth: int,
                                                            shortfall: int) -> None:
    allotment = budget.allot(limits(window, reserve), fixed=fixed, growth=growth)
    assert allotment.shortfall == shortfall
    assert (allotment.shortfall == 0) == allotment.attainable


@pytest.mark.parametrize(("window", "threshold", "target", "slack"), [
    (16000, 0.8, 0.5, 1200),    # threshold 12,800, target 8,000: a quarter of the way is 1,200
    (4000, 0.8, 0.5, 300),
    (128000, 0.9, 0.6, 9600),
    (8000, 0.0, 0.5, 0),        # proactive compaction off: no threshold to keep under, no slack
], ids=["16k", "4k", "128k", "no-threshold"])
def test_a_prepared_summary_may_land_a_quarter_of_the_way_from_the_target_to_the_threshold(
        window: int, threshold: float, target: float, slack: int) -> None:
    assert budget.prepared_slack(limits(window, threshold=threshold, target=target)) == slack


@pytest.mark.parametrize(("window", "threshold", "target", "slack"), [
    (16000, 0.8, 0.5, 2400),    # half the way from 8,000 to 12,800
    (4000, 0.8, 0.5, 600),
    (128000, 0.9, 0.6, 19200),
    (8000, 0.0, 0.5, 0),
], ids=["16k", "4k", "128k", "no-threshold"])
def test_a_late_prepared_summary_may_land_half_the_way(window: int, threshold: float, target: float,
                                                       slack: int) -> None:
    limited = limits(window, threshold=threshold, target=target)
    assert budget.late_slack(limited) == slack >= budget.prepared_slack(limited)


@pytest.mark.parametrize(("window", "reserve", "fixed", "growth", "says"), [
    (32768, 1024, 2000, 800, None),  # attainable: nothing to say
    (4000, 1024, 1500, 330, "what must stay verbatim (1500 tokens"),  # a long current round
    (2000, 1024, 100, 330, "alone fill the target"),  # the reserve and the next turn take the whole target
], ids=["attainable", "verbatim-too-long", "no-room"])
def test_why_a_goal_is_not_attainable_is_said_in_words(window: int, reserve: int, fixed: int, growth: int,
                                                       says: str | None) -> None:
    why = budget.allot(limits(window, reserve), fixed=fixed, growth=growth).why_not_attainable()
    assert why == says if says is None else (why is not None and says in why)


@pytest.mark.parametrize(
    # An earlier summary of `carried` tokens raises the summary's floor to hold it and half a floor more (at most a
    # fifth of the window), taken from the tail's share; without one, the allotment is as above.
    ("window", "fixed", "carried", "expected"),
    [
        (3072, 400, 0, {"summary_tokens": 460, "tail_tokens": 494}),
        (3072, 400, 100, {"summary_tokens": 460, "tail_tokens": 494}),   # 100 + 230 is below the floor itself
        (3072, 400, 300, {"summary_tokens": 530, "tail_tokens": 424}),
        (3072, 400, 2000, {"summary_tokens": 614, "tail_tokens": 340}),  # a fifth of the window at most
        (3072, 1300, 450, {"summary_tokens": 460, "tail_tokens": 0}),  # no room beyond the floor: the floor
        (128000, 5000, 9000, {"summary_tokens": 4096, "tail_tokens": 32000}),
    ],
)
def test_an_earlier_summary_raises_the_floor(window: int, fixed: int, carried: int, expected: dict[str, int]) -> None:
    allotment = budget.allot(limits(window, 32), fixed=fixed, growth=150, carried=carried)
    assert {key: getattr(allotment, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("span", "carried", "allotted", "ask"),
    [(1000, 0, 4096, 500), (1000, 400, 4096, 700), (1000, 400, 600, 600), (1000, 5000, 4096, 1000),
     (300, 300, 4096, 300), (100, 50, 4096, MIN_SUMMARY_TOKENS), (1000, -5, 4096, 500)],
)
def test_summary_ask_carries_an_earlier_summary_whole(span: int, carried: int, allotted: int, ask: int) -> None:
    allotment = budget.Allotment(goal=0, fixed=0, summary_tokens=allotted, tail_tokens=0, instruction_tokens=0,
                                 growth=0)
    assert budget.summary_ask(allotment, span, carried) == ask


@pytest.mark.parametrize(
    ("span", "allotted", "ask"),
    [(100, 1000, MIN_SUMMARY_TOKENS), (1000, 4096, 500), (10_000, 1200, 1200), (10_000, 100, MIN_SUMMARY_TOKENS)],
)
def test_summary_ask_compresses_at_least_twice(span: int, allotted: int, ask: int) -> None:
    allotment = budget.Allotment(goal=0, fixed=0, summary_tokens=allotted, tail_tokens=0, instruction_tokens=0,
                                 growth=0)
    assert budget.summary_ask(allotment, span) == ask


@pytest.mark.parametrize(
    ("span", "ask", "fillers", "worth"),
    [(1000, 256, 40, True), (360, 256, 40, True), (359, 256, 40, False), (0, 256, 0, False)],
)
def test_worth_summarizing(span: int, ask: int, fillers: int, worth: bool) -> None:
    assert budget.worth_summarizing(span, ask, fillers) is worth


@pytest.mark.parametrize(
    ("window", "prompt", "max_output", "room"),
    [(None, 10**6, 4096, 4096), (4000, 1000, 4096, 2784), (4000, 2784, 4096, 1000), (4000, 2785, 4096, None),
     (4000, 3600, 4096, None), (4000, 3144, 512, 512), (4000, 3272, 512, 512), (4000, 3273, 512, None),
     (2048, 500, 300, 300), (3072, 2600, 256, 256),
     (3072, 2700, 256, None),          # Qwen2.5-Coder-0.5B was cut off at 191 of 256 tokens here: now no request
     (1024, 829, 100, 100), (1024, 830, 100, None)],  # below the floor of 128 a summary is not tried
)
def test_summarizer_output_room(window: int | None, prompt: int, max_output: int, room: int | None) -> None:
    assert budget.summarizer_output_room(window, prompt, max_output) == room


@pytest.mark.parametrize(
    # An ask whose `whole` part is smaller gives way to the prompt down to that part (room: 3072 - prompt - 169).
    ("prompt", "max_output", "whole", "room"),
    [(2300, 768, None, None), (2300, 768, 307, 603), (2596, 768, 307, 307), (2597, 768, 307, None),
     (1000, 768, 307, 768), (2300, 500, 1000, 500), (2500, 500, 1000, None), (2800, 768, 50, None)],
)
def test_only_the_whole_part_of_an_ask_must_fit(prompt: int, max_output: int, whole: int | None,
                                                room: int | None) -> None:
    assert budget.summarizer_output_room(3072, prompt, max_output, whole) == room


@pytest.mark.parametrize(("window", "ask", "whole"), [(3072, 603, 307), (3072, 200, 200), (1024, 600, 256),
                                                      (128000, 4096, 4096), (128000, 9000, 9000)])
def test_the_whole_part_of_an_ask_is_a_tenth_of_the_window(window: int, ask: int, whole: int) -> None:
    assert budget.whole_summary_tokens(limits(window), ask) == whole


@pytest.mark.parametrize(
    ("last_answer", "reserve", "expected"), [(None, 1024, 256), (0, 1024, 256), (300, 1024, 300), (5000, 1024, 1024)],
)
def test_expected_answer(last_answer: int | None, reserve: int, expected: int) -> None:
    assert budget.expected_answer(limits(4000, reserve), last_answer) == expected


def test_elision_cap_fits_the_request_under_the_trigger() -> None:
    assert budget.elision_cap(limits(4000), 1000) == 3200 - 1024 - 1000
    assert budget.elision_cap(limits(4000), 3000) == budget.MIN_ELIDED_TOKENS
    assert budget.elision_cap(limits(4000, threshold=0), 1000) == 4000 - budget.window_margin(4000) - 1024 - 1000


def _history(rounds: list[tuple[str, int]]) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    for index, (kind, size) in enumerate(rounds):
        if kind == "tool":
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{index}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{index}", "content": "x" * size})
        else:
            messages += [{"role": "assistant", "content": "a" * size}, {"role": "user", "content": "u" * size}]
    return messages


@settings(max_examples=300, deadline=None)
@given(
    rounds=st.lists(st.tuples(st.sampled_from(["tool", "chat"]), st.integers(1, 400)), min_size=2, max_size=60),
    window=st.sampled_from([2048, 3000, 4000, 8192, 32768]),
    reserve=st.sampled_from([0, 128, 256, 1024]),
)
def test_a_plan_leaves_the_next_turn_within_the_target(rounds: list[tuple[str, int]], window: int,
                                                        reserve: int) -> None:
    """Whatever the history: kept messages + the summary at its cap + the predicted next turn + the reserve fit
    target x window whenever the allotment says the goal is attainable; otherwise the tail is the minimum."""
    messages = _history(rounds)
    plan = plan_compaction(messages, lambda m: 4 + len(str(m.get("content") or "")), limits(window, reserve))
    if plan is None:
        return
    allotment = plan.allotment
    next_request = plan.kept_tokens + plan.summary_tokens + allotment.growth
    if allotment.attainable:
        assert next_request + reserve <= 0.5 * window
    else:
        # No turn beyond the current round (and the latest user message, kept either way) was added.
        assert plan.head_tokens + plan.kept_user_tokens + plan.tail_tokens <= allotment.fixed


@pytest.mark.parametrize(("window", "reserve", "prompt", "room"), [
    # the window's margin is 67 tokens at 1,024 and 26 at 200
    (1024, 48, 800, 1024 - 67 - 48 - 800), (1024, 48, 909, 0), (1024, 48, 910, -1), (200, 0, 100, 200 - 26 - 100),
])
def test_window_room_is_what_fits_window_leaves(window: int, reserve: int, prompt: int, room: int) -> None:
    window_limits = limits(window, reserve=reserve)
    assert budget.window_room(window_limits, prompt) == room
    assert budget.fits_window(window_limits, prompt) is (room >= 0)


@pytest.mark.parametrize(("threshold", "asked", "expected"), [
    (0.8, None, (0.8, 0.5)),                       # no client threshold: the operator's
    (0.8, 3000, ((3000 + 1000) / 10_000, (3000 * 0.625 + 1000) / 10_000)),  # sooner: the client's, landing below
    (0.8, 7500, (0.8, 0.5)),                       # later than the operator's: the operator's stands
    (0.0, 3000, (0.4, (3000 * 0.625 + 1000) / 10_000)),  # proactive off: the client's still asked for
    (0.8, 9500, (0.8, 0.5)),                       # past the window with its reserve: nothing proactive to add
    (0.0, 9500, (0.0, 0.5)),
])
def test_a_client_threshold_is_honoured_when_it_comes_sooner(threshold: float, asked: int | None,
                                                             expected: tuple[float, float]) -> None:
    limits = budget.Limits(window=10_000, threshold=threshold, target=0.5, reserve=1000)
    honoured = budget.with_client_threshold(limits, asked, 0.625)
    assert (honoured.threshold, honoured.target) == pytest.approx(expected)
    if asked is not None and honoured.threshold != threshold:  # compacting there lands below the client's threshold
        assert honoured.target_tokens - honoured.reserve < asked
        assert budget.over_threshold(honoured, asked + 1) and not budget.over_threshold(honoured, asked - 1)
