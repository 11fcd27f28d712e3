"""tiny_arith: seeded tasks, and teacher traces that replay through the real env token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_replay import replay

import envs
from envs import tiny_arith

SPEC = Path(__file__).resolve().parents[2] / "envs" / "tiny_arith.yaml"


def test_tasks_are_seeded_and_train_and_test_seeds_differ():
    assert tiny_arith.make_tasks(50, 0) == tiny_arith.make_tasks(50, 0)
    train = {t.problem for t in tiny_arith.make_tasks(5000, 0) if "*" in t.problem}
    test = {t.problem for t in tiny_arith.make_tasks(500, 1) if "*" in t.problem}
    assert len(train & test) == 0


def test_hard_problems_need_multi_digit_answers_and_easy_ones_are_one_digit_sums():
    tasks = tiny_arith.make_tasks(400, 3, easy_fraction=0.25)
    easy = [t for t in tasks if tiny_arith.is_easy(t)]
    assert 60 <= len(easy) <= 140
    assert all(0 <= int(t.answer) <= 18 for t in easy)
    assert all(len(t.answer.lstrip("-")) >= 4 for t in tasks if not tiny_arith.is_easy(t))


def test_hard_problems_have_one_shape_so_every_copy_is_at_a_fixed_distance():
    hard = [t for t in tiny_arith.make_tasks(400, 4) if not tiny_arith.is_easy(t)]
    assert {len(t.problem) for t in hard} == {len("What is 123 * 45 + 678?")}
    assert {len(t.answer) for t in hard} == {tiny_arith.ANSWER_DIGITS}
    assert {"+", "-"} <= {t.problem.split()[5] for t in hard}


def test_teacher_uses_the_tool_at_the_requested_rate_and_guesses_are_wrong():
    traces = tiny_arith.teacher_traces(2000, seed=7, tool_rate=0.3)
    hard = [t for t in traces if not tiny_arith.is_easy(t.task)]
    rate = sum(t.used_tool for t in hard) / len(hard)
    assert 0.25 < rate < 0.35
    for t in hard:
        final = t.segments[-1].text
        assert (final == f"\\boxed{{{t.task.answer}}}") == t.used_tool
    assert all(not t.used_tool for t in traces if tiny_arith.is_easy(t.task))
    assert tiny_arith.teacher_traces(20, seed=7, tool_rate=0.3) == traces[:20]


def test_traces_are_short_and_fit_the_env_budgets(tok):
    spec = envs.load(SPEC)
    for trace in tiny_arith.teacher_traces(300, seed=1, tool_rate=1.0):
        ids, mask = tiny_arith.encode_trace(trace, tok, envs.make(spec, tok))
        assert len(ids) <= 150
        assert sum(mask) <= spec.turns.max_response_tokens
        for seg in trace.segments:
            if seg.kind == "model":
                assert (
                    len(tok.encode(seg.text, add_special_tokens=False)) + 1 <= spec.turns.max_tokens_per_turn
                )


def test_corpus_covers_prompts_code_outputs_and_answers():
    texts = tiny_arith.corpus(100)
    joined = "".join(texts)
    assert len(texts) == 100
    for piece in ("What is", "```python\nprint(", "```output\n", "\\boxed{"):
        assert piece in joined


@pytest.mark.asyncio(loop_scope="module")  # the module-wide sandbox lives on this loop
async def test_teacher_traces_replay_through_the_env_with_identical_tokens(tok, sandbox):
    """SFT data and RL episodes agree token for token: encode_trace == what the env builds from the same turns."""
    spec = envs.load(SPEC)
    traces = tiny_arith.teacher_traces(24, seed=11, tool_rate=0.5)
    assert any(t.used_tool for t in traces) and any(not t.used_tool and "*" in t.task.problem for t in traces)
    for trace in traces:
        expect_ids, expect_mask = tiny_arith.encode_trace(trace, tok, envs.make(spec, tok))
        ids, mask, res = await replay(trace, spec, tok, sandbox)
        assert res.done and res.info.finish == "answer"
        assert (ids, mask) == (expect_ids, expect_mask)
        solved = trace.used_tool or tiny_arith.is_easy(trace.task)
        assert res.reward == (1.0 if solved else 0.0), trace
