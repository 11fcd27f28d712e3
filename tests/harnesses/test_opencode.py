"""OpenCode (pinned, unmodified) against the gateway's chat completions in front of the embedded engine.

OpenCode streams chat completions with its system prompt and 9 tools (its side request for a session title is
switched off by the preset), and runs its bash tool itself: the model (over-fitted to this exchange,
harness_model.py) asks it to write answer.txt, then ends its turn; `opencode run --continue` then continues the
same conversation with one more user message, through the same gateway session.
"""

from __future__ import annotations

import asyncio

import pytest
from drive import Exchange, learn, scenario
from harness_model import tool_call
from trajectory_checks import check_exact_and_masked

pytestmark = pytest.mark.harness

OPENCODE = Exchange(
    harness="opencode",
    api="/chat/completions",
    prompt="Write 12 to answer.txt",
    resume_prompt="Is it there?",
    answers=(
        tool_call("bash", {"command": "echo 12 > answer.txt", "description": "Write 12 to answer.txt"}),
        "Done: answer.txt holds 12.",
        "Yes.",
    ),
)


@pytest.fixture(scope="module")
def opencode_model(tmp_path_factory):
    base = tmp_path_factory.mktemp("opencode")
    return asyncio.run(learn(OPENCODE, base / "model", base)), base


@pytest.fixture(scope="module")
def opencode_run(opencode_model):
    model_dir, base = opencode_model
    return asyncio.run(scenario(OPENCODE, model_dir, base))


def test_opencode_runs_its_bash_tool_and_finishes_both_sessions(opencode_run):
    assert all(not isinstance(r, Exception) for r in opencode_run.results), opencode_run.results
    assert opencode_run.answer == "12"  # written by OpenCode's own bash tool
    assert "Done: answer.txt holds 12." in opencode_run.results[0].final
    assert "Yes." in opencode_run.results[1].final
    assert len(opencode_run.calls) == 3


def test_opencode_trajectory_is_the_engines_tokens_with_prompt_and_tool_output_masked(
    opencode_run, opencode_model
):
    check_exact_and_masked(
        opencode_run, opencode_model[0], system_line="You are opencode, an interactive CLI tool", tool="bash"
    )
