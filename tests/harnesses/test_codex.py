"""Codex CLI (pinned, unmodified) against the gateway's Responses API in front of the embedded engine.

Codex sends its instructions as developer messages, 13 function tools, a namespace of sub-agent tools and a
hosted web_search tool, and runs its exec_command tool itself: the model (over-fitted to this exchange,
harness_model.py) asks it to write answer.txt, then ends its turn; `codex exec resume --last` then continues the
same conversation with one more user message, through the same gateway session.
"""

from __future__ import annotations

import asyncio

import pytest
from drive import CONTEXT, Exchange, learn, scenario
from harness_model import tool_call

from agent_rl.gateway.assemble import assemble

pytestmark = pytest.mark.harness

CODEX = Exchange(
    harness="codex",
    api="/responses",
    prompt="Write 12 to answer.txt",
    resume_prompt="Is it there?",
    answers=(
        tool_call("exec_command", {"cmd": "echo 12 > answer.txt"}),
        "Done: answer.txt holds 12.",
        "Yes.",
    ),
)


@pytest.fixture(scope="module")
def codex_model(tmp_path_factory):
    base = tmp_path_factory.mktemp("codex")
    return asyncio.run(learn(CODEX, base / "model", base)), base


@pytest.fixture(scope="module")
def codex_run(codex_model):
    model_dir, base = codex_model
    return asyncio.run(scenario(CODEX, model_dir, base))


def test_codex_runs_its_shell_tool_and_finishes_both_sessions(codex_run):
    assert all(not isinstance(r, Exception) for r in codex_run.results), codex_run.results
    assert codex_run.answer == "12"  # written by Codex's own exec_command tool
    assert [r.final for r in codex_run.results] == ["Done: answer.txt holds 12.", "Yes."]
    assert len(codex_run.calls) == 3


def test_codex_trajectory_is_the_engines_tokens_with_prompt_and_tool_output_masked(codex_run, codex_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(codex_model[0])
    calls = codex_run.calls
    engine_out = [
        codex_run.returned[k]
        for k in sorted(codex_run.returned, key=lambda k: int(k.split("/")[1].split(".")[0]))
    ]
    assert [c.token_ids for c in calls] == [tuple(g.token_ids) for g in engine_out]
    assert [c.logprobs for c in calls] == [tuple(g.logprobs) for g in engine_out]
    (traj,), splits = assemble(calls)
    assert splits == 0  # the resumed session extends the first one's tokens: no fork
    flat = traj.flatten()
    assert len(flat.input_ids) < CONTEXT
    sampled = [t for s in traj.segments if s.sampled for t in s.token_ids]
    assert sampled == [t for c in calls for t in c.token_ids]
    masked = tok.decode([t for t, m in zip(flat.input_ids, flat.loss_mask, strict=True) if not m])
    trained = tok.decode([t for t, m in zip(flat.input_ids, flat.loss_mask, strict=True) if m])
    assert "You are a coding agent running in the Codex CLI" in masked  # its system prompt: not trained on
    assert (
        "<tool_response>" in masked and "<tool_response>" not in trained
    )  # the tool's output: not trained on
    assert trained.count("exec_command") == 1 and "Is it there?" not in trained
