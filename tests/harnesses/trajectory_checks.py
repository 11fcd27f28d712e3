"""What every harness test asserts of the recorded session (tests/harnesses/test_*.py)."""

from __future__ import annotations

from pathlib import Path

from drive import CONTEXT, Outcome

from agent_rl.gateway.assemble import assemble


def check_exact_and_masked(
    run: Outcome, model_dir: Path, *, system_line: str, tool: str, tool_calls: int = 1, resumed: bool = True
) -> None:
    """The trajectory's sampled tokens and log-probs are the engine's; the system prompt and the tool's output
    are masked; the resumed run (same session) extends the first run's tokens, so nothing forks."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    calls = run.calls

    def call_no(rid: str) -> int:  # "ep/<call>.<choice>.<offset>"
        return int(rid.split("/")[1].split(".")[0])

    engine_out = [run.returned[k] for k in sorted(run.returned, key=call_no)]
    assert len(engine_out) == len(calls)  # one engine request per call: no continuation, no retry
    assert [c.token_ids for c in calls] == [tuple(g.token_ids) for g in engine_out]
    assert [c.logprobs for c in calls] == [tuple(g.logprobs) for g in engine_out]
    (traj,), splits = assemble(calls)
    assert splits == 0  # every call, the resumed run's too, extends the tokens before it: no fork
    flat = traj.flatten()
    assert len(flat.input_ids) < CONTEXT
    sampled = [t for s in traj.segments if s.sampled for t in s.token_ids]
    assert sampled == [t for c in calls for t in c.token_ids]
    assert [lp for s in traj.segments if s.sampled for lp in s.logprobs] == [
        lp for c in calls for lp in c.logprobs
    ]
    assert flat.input_ids[: len(calls[-1].prompt_ids)] == list(calls[-1].prompt_ids)
    masked = tok.decode([t for t, m in zip(flat.input_ids, flat.loss_mask, strict=True) if not m])
    trained = tok.decode([t for t, m in zip(flat.input_ids, flat.loss_mask, strict=True) if m])
    assert system_line in masked and system_line not in trained  # the harness's system prompt: not trained on
    assert (
        "<tool_response>" in masked and "<tool_response>" not in trained
    )  # the tool's output: not trained on
    assert trained.count(f'"name": "{tool}"') == tool_calls  # the model's own tool calls are trained on
    if resumed:
        assert "Is it there?" in masked and "Is it there?" not in trained
