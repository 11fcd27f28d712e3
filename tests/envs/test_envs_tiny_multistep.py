"""tiny_multistep: seeded problems of 2-3 applications of one step, a teacher that stops early at each turn, traces that replay exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_replay import replay

import envs
from envs import tiny_arith, tiny_multistep

SPEC = Path(__file__).resolve().parents[2] / "envs" / "tiny_multistep.yaml"


def test_tasks_are_seeded_two_or_three_applications_of_one_step_and_train_and_test_seeds_differ():
    assert tiny_multistep.make_tasks(50, 0) == tiny_multistep.make_tasks(50, 0)
    tasks = tiny_multistep.make_tasks(2000, 0)
    times = [tiny_multistep.parse(t)[3] for t in tasks]
    assert set(times) == {2, 3} and 0.45 < times.count(2) / len(times) < 0.55
    for t in tasks[:200]:
        x, a, b, n = tiny_multistep.parse(t)
        assert t.problem == f"Start at {x} and apply x * {a} + {b}, {n} times."
        for _ in range(n):
            x = x * a + b
        assert int(t.answer) == x and 3 <= len(t.answer) <= 5
    test = {t.problem for t in tiny_multistep.make_tasks(500, 1)}
    assert len(test & {t.problem for t in tasks}) < 25  # 2 * 90 * 8 * 90 problems: a few collide by chance


def test_the_env_file_loads_its_generator_and_the_budgets_fit_three_calls():
    spec = envs.load(SPEC)
    assert spec.data.splits["train"].generator == "tiny_multistep"
    assert spec.turns.max_turns >= max(tiny_multistep.TIMES) + 1  # every call, then the answer


@pytest.mark.parametrize("rate", [0.5, 0.8])
def test_a_complete_trace_takes_every_go_on_decision_so_it_comes_at_rate_to_the_n(rate: float):
    traces = tiny_multistep.teacher_traces(4000, seed=7, continue_rate=rate)
    for n in tiny_multistep.TIMES:
        of_n = [t for t in traces if tiny_multistep.parse(t.task)[3] == n]
        share = sum(t.used_tool for t in of_n) / len(of_n)
        # binomial: ~2000 traces per n, so one standard error is at most 0.011; 4 SE of slack
        assert abs(share - rate**n) < 0.045, (n, share)


def test_complete_traces_carry_each_output_into_the_next_call_and_early_stops_box_a_wrong_guess():
    for t in tiny_multistep.teacher_traces(300, seed=3, continue_rate=0.6):
        final = t.segments[-1].text
        assert (final == f"\\boxed{{{t.task.answer}}}") == t.used_tool
        calls = [s.text for s in t.segments if s.kind == "model" and s.text.startswith("```python")]
        outputs = [int(s.text) for s in t.segments if s.kind == "observation"]
        x, a, b, n = tiny_multistep.parse(t.task)
        for i, (code, out) in enumerate(zip(calls, outputs, strict=True)):
            expr = code.removeprefix("```python\nprint(").removesuffix(")\n```\n")
            assert expr == f"{x if i == 0 else outputs[i - 1]} * {a} + {b}"
            assert out == eval(expr)  # the arithmetic the sandbox will do
        assert len(calls) == n if t.used_tool else len(calls) < n


@pytest.mark.asyncio(loop_scope="module")  # the module-wide sandbox lives on this loop
async def test_teacher_traces_replay_through_the_env_with_identical_tokens_and_reward(tok, sandbox):
    """SFT data and RL episodes agree token for token: encode_trace == what the env builds from the same turns,
    through the real sandbox, and the reward is 1 exactly for the complete traces."""
    spec = envs.load(SPEC)
    traces = tiny_multistep.teacher_traces(16, seed=11, continue_rate=0.6)
    assert any(t.used_tool for t in traces) and any(not t.used_tool for t in traces)
    for trace in traces:
        expect_ids, expect_mask = tiny_arith.encode_trace(trace, tok, envs.make(spec, tok))
        ids, mask, res = await replay(trace, spec, tok, sandbox)
        assert res.done and res.info.finish == "answer"
        assert (ids, mask) == (expect_ids, expect_mask)
        assert res.reward == (1.0 if trace.used_tool else 0.0), trace
        assert sum(mask) <= spec.turns.max_response_tokens
