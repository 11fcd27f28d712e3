"""Exchanges shared by more than one test module (the model over-fitted to them is built once: conftest.py)."""

from __future__ import annotations

from drive import Exchange
from harness_model import tool_call

MINI = Exchange(
    harness="mini-swe-agent",
    api="/chat/completions",
    prompt="Write 12 to answer.txt",
    resume_prompt=None,
    answers=(
        tool_call("bash", {"command": "echo 12 > answer.txt"}),
        tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ),
)
