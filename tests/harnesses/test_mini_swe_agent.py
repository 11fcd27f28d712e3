"""mini-swe-agent (pinned, unmodified; its own venv) against the gateway's chat completions through litellm.

mini-swe-agent 2.x calls the model through litellm with one `bash` tool and runs each command itself in a
subshell; it ends when the model runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. It has no way to continue
an earlier session, so only one run: its two calls must form one chain (no fork).
"""

from __future__ import annotations

import asyncio

import pytest
from drive import scenario
from exchanges import MINI
from trajectory_checks import check_exact_and_masked

pytestmark = pytest.mark.harness


@pytest.fixture(scope="module")
def mini_run(mini_model):
    model_dir, base = mini_model
    return asyncio.run(scenario(MINI, model_dir, base))


def test_mini_swe_agent_runs_its_bash_tool_and_submits(mini_run):
    assert all(not isinstance(r, Exception) for r in mini_run.results), mini_run.results
    assert mini_run.answer == "12"  # written by mini-swe-agent's own bash execution
    assert len(mini_run.calls) == 2


def test_mini_swe_agent_trajectory_is_the_engines_tokens_with_prompt_and_tool_output_masked(
    mini_run, mini_model
):
    check_exact_and_masked(
        mini_run,
        mini_model[0],
        system_line="You are a helpful assistant that can interact with a computer.",
        tool="bash",
        tool_calls=2,
        resumed=False,
    )
