"""The failure classifier of tiny_multistep trajectories (benchmarks.stress.multistep_failures), on hand-written
turns of one problem: 47 -> 342 -> 2407 -> 16862 under x * 7 + 13."""

from __future__ import annotations

import pytest

from benchmarks.stress.multistep_failures import Tally, classify, markdown

PROMPT = "Start at 47 and apply x * 7 + 13, 3 times.\n"


def call(v: int, a: int = 7, b: int = 13) -> str:
    return f"```python\nprint({v} * {a} + {b})\n```\n"


def box(v: int) -> str:
    return f"\\boxed{{{v}}}<|im_end|>"


@pytest.mark.parametrize(
    ("turns", "reward", "outcome"),
    [
        ([call(47), call(342), call(2407), box(16862)], 1.0, "solved"),
        ([call(47), call(342), box(2407)], 0.0, "stopped early"),
        ([box(99)], 0.0, "no call"),
        ([call(47), call(342), call(2477), box(17352)], 0.0, "copy slip"),
        ([call(47), call(342, 7, 31), box(1)], 0.0, "wrong step"),
        ([call(47), call(342), call(2407), box(16682)], 0.0, "box slip"),
        ([call(47), call(342), call(2407), call(16862), box(1)], 0.0, "too many calls"),
        ([call(47), call(342), call(2407)], 0.0, "other"),  # ran out of turns before a box
    ],
)
def test_each_failure_is_named_by_its_first_mistake(turns, reward, outcome):
    assert classify(PROMPT, turns, reward) == outcome


def test_copies_are_counted_by_the_digits_of_the_value_carried():
    tally = Tally()
    classify(PROMPT, [call(47), call(342), call(2477), box(1)], 0.0, tally)  # 342 copied right, 2407 wrong
    classify(PROMPT, [call(47), call(342), call(2407), box(16682)], 0.0, tally)  # box: 16862 copied wrong
    assert tally.copies == {3: [2, 2], 4: [1, 2], 5: [0, 1]}
    assert dict(tally.outcomes[3]) == {"copy slip": 1, "box slip": 1}


def test_a_prompt_of_another_task_is_refused():
    with pytest.raises(ValueError, match="not a tiny_multistep problem"):
        classify("What is 3 + 4?", [box(7)], 1.0)


def test_the_report_shows_shares_and_copy_accuracy():
    tally = Tally()
    classify(PROMPT, [call(47), call(342), call(2407), box(16862)], 1.0, tally)
    classify(PROMPT, [call(47), call(342), box(2407)], 0.0, tally)
    group = {"runs": ["r"], "trajectories": 2, "first": tally.row(), "last": Tally().row()}
    text = markdown({"command": "c", "glob": "ksweep_*_k0_s*", "groups": {"vcpo lr 0.0001": group}})
    assert "| first 10 | 3 | 0.50 | 0.50 | 0.00 |" in text
    assert "1.00 (2)" in text  # two 3-digit copies (342 twice), both right
