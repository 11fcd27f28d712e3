"""Codex CLI (pinned, unmodified) against the gateway's Responses API in front of the embedded engine.

Codex sends its instructions as developer messages, 13 function tools, a namespace of sub-agent tools and a
hosted web_search tool, and runs its exec_command tool itself: the model (over-fitted to this exchange,
harness_model.py) asks it to write answer.txt, then ends its turn; `codex exec resume --last` then continues the
same conversation with one more user message, through the same gateway session.
"""

from __future__ import annotations

import asyncio

import pytest
from drive import Exchange, learn, scenario
from harness_model import tool_call
from trajectory_checks import check_exact_and_masked

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
    volatile=(r"Chunk ID: ([0-9a-f]+)", r"Wall time: ([0-9.]+) seconds"),
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
    check_exact_and_masked(
        codex_run,
        codex_model[0],
        system_line="You are a coding agent running in the Codex CLI",
        tool="exec_command",
    )
