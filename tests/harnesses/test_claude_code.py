"""Claude Code (pinned, unmodified) against the gateway's Anthropic Messages API in front of the embedded engine.

Claude Code streams `POST /v1/messages?beta=true` with a ~29k-character system prompt in blocks and its tools,
and runs its Bash tool itself: the model (over-fitted to this exchange, harness_model.py) asks it to write
answer.txt, then ends its turn; `claude -p --continue` then continues the same conversation with one more user
message, through the same gateway session.
"""

from __future__ import annotations

import asyncio

import pytest
from drive import Exchange, learn, scenario
from harness_model import tool_call
from trajectory_checks import check_exact_and_masked

pytestmark = pytest.mark.harness

CLAUDE = Exchange(
    harness="claude-code",
    api="/messages",
    prompt="Write 12 to answer.txt",
    resume_prompt="Is it there?",
    answers=(
        tool_call("Bash", {"command": "echo 12 > answer.txt", "description": "Write 12 to answer.txt"}),
        "Done: answer.txt holds 12.",
        "Yes.",
    ),
)


@pytest.fixture(scope="module")
def claude_model(tmp_path_factory):
    base = tmp_path_factory.mktemp("claude")
    return asyncio.run(learn(CLAUDE, base / "model", base)), base


@pytest.fixture(scope="module")
def claude_run(claude_model):
    model_dir, base = claude_model
    return asyncio.run(scenario(CLAUDE, model_dir, base))


def test_claude_code_runs_its_bash_tool_and_finishes_both_sessions(claude_run):
    assert all(not isinstance(r, Exception) for r in claude_run.results), claude_run.results
    assert claude_run.answer == "12"  # written by Claude Code's own Bash tool
    assert [r.final for r in claude_run.results] == ["Done: answer.txt holds 12.", "Yes."]
    assert len(claude_run.calls) == 3


def test_claude_code_trajectory_is_the_engines_tokens_with_prompt_and_tool_output_masked(
    claude_run, claude_model
):
    check_exact_and_masked(
        claude_run,
        claude_model[0],
        system_line="You are an agent working with the user toward their goals",
        tool="Bash",
    )


def test_claude_code_read_anthropics_event_grammar_and_stop_reasons(claude_run):
    """What Claude Code itself tolerates (message_stop before message_delta, `end_turn` on a tool call) is still
    Anthropic's protocol: every streamed answer it read follows the event grammar, a tool_use block's input comes
    in input_json_delta events, and stop_reason is tool_use exactly when a tool was called."""
    import json
    import re

    streams = [
        body for path, status, body in claude_run.answers if path.endswith("/messages") and status == 200
    ]
    assert len(streams) == 3
    for raw in streams:
        events = [
            (m[1], json.loads(m[2])) for m in re.finditer(r"event: (\S+)\ndata: (.*)\n\n", raw.decode())
        ]
        names = " ".join(n for n, _ in events)
        block = r"content_block_start (ping )?(content_block_delta )+content_block_stop "
        assert re.fullmatch(rf"message_start ({block})+message_delta message_stop", names + " "[:0] + ""), (
            names
        )
        starts = [d["content_block"] for n, d in events if n == "content_block_start"]
        deltas = {d["delta"]["type"] for n, d in events if n == "content_block_delta"}
        called = any(b["type"] == "tool_use" for b in starts)
        assert ("input_json_delta" in deltas) == called
        (stop,) = [d["delta"]["stop_reason"] for n, d in events if n == "message_delta"]
        assert stop == ("tool_use" if called else "end_turn")
    assert sum("tool_use" in raw.decode() for raw in streams) >= 1
