"""benchmarks/slow_tools.py: episodes in flight from the rollout's counters, the paired time-to-target
summary and its page (the --quick run end to end with Docker: tests/sandboxes/test_slow_tools_quick.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks.slow_tools import RECIPE, Cell, in_flight, markdown, run_sets, summarise  # noqa: E402


def test_episodes_in_flight_are_the_episodes_seconds_over_the_wall_time():
    # step 1: 4 episodes of 5 s each in 10 s; step 2: 6 more of 10 s in 10 s -> (20 + 60) / 20 = 4 in flight
    recs = [
        {"rollout/episodes": 4, "rollout/episode_seconds": 5.0, "perf/step_seconds": 10.0},
        {"rollout/episodes": 10, "rollout/episode_seconds": 10.0, "perf/step_seconds": 10.0},
    ]
    assert in_flight(recs) == {"mean": 4.0, "episodes": 10}


def _run(cell: str, k: int, seed: int, curve: list, final: float) -> dict:
    return {
        "cell": cell, "k": k, "seed": seed, "curve": curve, "final_accuracy": final, "end_accuracy": curve[-1][1],
        "seconds_per_step_median": 1.0, "tools": {"tool_share_median": 0.8, "episode_seconds_median": 3.0},
        "in_flight": {"mean": 10.0, "episodes": 64},
    }  # fmt: skip


def test_the_target_is_paired_by_seed_and_the_speedup_is_the_median_of_per_seed_ratios():
    runs = [
        _run("sync k=0", 0, 0, [(0, 0.1), (10, 0.3), (20, 0.5)], 0.5),
        _run("sync k=0", 0, 1, [(0, 0.1), (30, 0.4)], 0.4),
        _run("async k=2", 2, 0, [(0, 0.1), (5, 0.5)], 0.5),  # 20 / 5 = 4x
        _run("async k=2", 2, 1, [(0, 0.1), (15, 0.35), (20, 0.45)], 0.45),  # seed 1's target is 0.4: 30 / 20
    ]
    s = summarise(runs, [Cell("sync k=0", 0), Cell("async k=2", 2)])
    assert s["target_per_seed"] == {0: 0.5, 1: 0.4}
    assert s["speedup_vs_sync"]["async k=2"]["per_seed"] == [4.0, 1.5]
    assert s["speedup_vs_sync"]["async k=2"]["speedup_median"] == 2.75
    assert s["goal_reached"] is True
    never = [*runs[:2], _run("async k=2", 2, 0, [(0, 0.1)], 0.1), _run("async k=2", 2, 1, [(0, 0.1)], 0.1)]
    s = summarise(never, [Cell("sync k=0", 0), Cell("async k=2", 2)])
    assert s["speedup_vs_sync"]["async k=2"]["per_seed"] == [0.0, 0.0] and s["goal_reached"] is False


def test_the_page_says_the_goal_and_the_load():
    runs = [
        _run("sync k=0", 0, 0, [(0, 0.1), (10, 0.3)], 0.3),
        _run("async k=2", 2, 0, [(0, 0.1), (4, 0.3)], 0.3),
    ]
    data = {
        "meta": {"command": "slow_tools.py", "date": "d", "commit": "c", "cpu": {"model": "m", "cores": 2},
                 "load_before": [3.0, 0, 0], "load_after": [4.0, 0, 0], "elapsed_s": 60},
        "design": {"tasks": 300, "batch_prompts": 8, "sync_steps": 16, "async_steps_factor": 1.5,
                   "checkpoint_every": 2, "eval_tasks": 100, "warm_start_accuracy": 0.1, "seeds": 1, "seeds_planned": 3, "trl": "not run",
                   "max_in_flight": 32},
        "summary": summarise(runs, [Cell("sync k=0", 0), Cell("async k=2", 2)]),
    }  # fmt: skip
    text = markdown(data)
    assert "REACHED" in text and "load average 3.00 at the start" in text and "| 2.50 (2.50) |" in text
    # one seed of the three the goal asks for, the rest stopped by the time limit: said, in the verdict too
    assert "REACHED at 1 seed(s) of the 3 the goal asks (a first reading, not the verdict)" in text
    assert "1 seed(s) of 3 planned (the time limit stopped the rest)" in text
    data["design"] |= {"seeds": 3, "seeds_planned": 3}
    text = markdown(data)
    assert "first reading" not in text and "planned" not in text


def test_the_committed_page_is_what_its_results_file_renders():
    import json

    results = ROOT / "benchmarks" / "results"
    data = json.loads((results / "slow_tools_quick.json").read_text())
    assert markdown(data) == (results / "slow_tools_quick.md").read_text()


# -- the TRL cell (benchmarks/trl_swe.py, benchmarks/trl_swe_cell.py) ---------------------------------------------------


def test_the_async_cells_are_timed_against_trl_seed_by_seed_and_the_target_stays_syncs():
    from benchmarks.slow_tools import TRL

    runs = [
        _run("sync k=0", 0, 0, [(0, 0.1), (20, 0.5)], 0.5),
        _run("async k=2", 2, 0, [(0, 0.1), (5, 0.5)], 0.5),
        # TRL ends higher than sync: the target is still sync's 0.5, reached at 40 s -> k=2 is 8x sooner
        {**_run("trl", None, 0, [(0, 0.0), (40, 0.6)], 0.6), "k": None},
    ]
    cells = [Cell("sync k=0", 0), Cell("async k=2", 2), TRL]
    s = summarise(runs, cells)
    assert s["target_per_seed"] == {0: 0.5}
    assert s["speedup_vs_trl"]["async k=2"] == {"speedup_median": 8.0, "per_seed": [8.0]}
    assert s["speedup_vs_sync"]["trl"]["per_seed"] == [0.5] and s["goal_vs_trl_reached"] is True
    slow = [*runs[:2], {**_run("trl", None, 0, [(0, 0.0), (8, 0.5)], 0.5), "k": None}]
    assert summarise(slow, cells)["goal_vs_trl_reached"] is False  # 8 / 5 = 1.6x < 2x


def test_trls_tool_share_is_its_tool_and_reward_phases_and_in_flight_is_littles_law():
    from benchmarks.trl_swe_cell import episode_stats

    ep = {"tool_s": 1.0, "episode_s": 6.0, "reward": 1.0}
    steps = [
        {"step_seconds": 10.0, "phase_generate": 2.0, "phase_tools": 5.0, "phase_reward": 1.0,
         "episodes": [ep, ep], "infra_failed": []},
        {"step_seconds": 10.0, "phase_generate": 4.0, "phase_tools": 3.0, "phase_reward": 1.0,
         "episodes": [ep, {**ep, "tool_s": 3.0}], "infra_failed": ["verifier_timeout"]},
    ]  # fmt: skip
    tools, flight = episode_stats(steps)
    assert (
        tools["tool_share_median"] == (6 / 8 + 4 / 8) / 2
    )  # median of two steps' (tools + reward) / all three
    assert tools["tool_seconds_median"] == 1.0 and tools["episodes"] == 4 and tools["infra_failed"] == 1
    assert flight == {"mean": 24.0 / 20.0, "episodes": 4}


def test_the_trl_warm_start_trace_is_the_oracle_fix_as_a_bash_tool_call_with_only_the_model_turns_trained():
    import json

    from agent_rl.openai.templates import HERMES_TOOLS
    from agent_rl.tools.tiny import train_tokenizer
    from benchmarks.trl_swe import FINAL, SYSTEM, bash_tool, format_texts, sft_row

    tok = train_tokenizer(["sed -i 's/x/y/' /app/m.py"] + format_texts(), vocab_size=300)
    tok.chat_template = HERMES_TOOLS
    cmd = "sed -i 's/a \"b\"/c/' /app/m.py\npython3 -m pytest -q /app"
    row = sft_row(tok, "Fix m.py", cmd, "1 passed")
    call, context, final = row["response"]
    assert [p["train"] for p in row["response"]] == [True, False, True] and final["text"] == FINAL
    body = call["text"].removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>")
    assert json.loads(body) == {"name": "bash", "arguments": {"command": cmd}}
    assert "<tool_response>\n1 passed\n</tool_response>" in context["text"]
    conversation = [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix m.py"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": cmd}}}]},
        {"role": "tool", "name": "bash", "content": "1 passed"}, {"role": "assistant", "content": FINAL},
    ]  # fmt: skip
    whole = tok.apply_chat_template(conversation, tools=[bash_tool()], tokenize=False)
    # the row is the conversation as TRL renders it (agent-rl sft appends the end-of-turn after the final text)
    assert row["prompt"] + "".join(p["text"] for p in row["response"]) + tok.eos_token + "\n" == whole
    assert "tools: bash" in row["prompt"]


def test_the_page_with_a_trl_cell_says_both_goals():
    from benchmarks.slow_tools import TRL

    runs = [
        _run("sync k=0", 0, 0, [(0, 0.1), (10, 0.3)], 0.3),
        _run("async k=2", 2, 0, [(0, 0.1), (4, 0.3)], 0.3),
        {**_run("trl", None, 0, [(0, 0.0), (12, 0.3)], 0.3), "k": None},
    ]
    data = {
        "meta": {"command": "slow_tools.py", "date": "d", "commit": "c", "cpu": {"model": "m", "cores": 2},
                 "load_before": [3.0, 0, 0], "load_after": [4.0, 0, 0], "elapsed_s": 60},
        "design": {"tasks": 300, "batch_prompts": 8, "sync_steps": 16, "async_steps_factor": 1.5,
                   "checkpoint_every": 2, "eval_tasks": 100, "warm_start_accuracy": 0.1, "seeds": 1, "trl": "x",
                   "max_in_flight": 32, "trl_warm_start_accuracy": 0.0,
                   "trl_tuning": {"s_per_step": {"trl: 1 thread(s), 1 micro-batch(es)": 9.5}}},
        "summary": summarise(runs, [Cell("sync k=0", 0), Cell("async k=2", 2), TRL]),
    }  # fmt: skip
    text = markdown(data)
    assert "than TRL's fastest cell): REACHED" in text and "async k=2 3.00 (3.00)" in text
    assert "1 thread(s), 1 micro-batch(es) 9.50" in text and "| trl | 1 |" in text


def test_the_plan_counts_the_trl_tuning_pass_and_runs():
    import argparse

    from benchmarks.slow_tools import plan_text

    args = argparse.Namespace(
        tasks=300, seeds=3, steps=16, async_steps_factor=1.5, every=4, eval_limit=100, no_trl=False,
        quick=False, tune_steps=3,
    )  # fmt: skip
    text = plan_text(args, [0, 2, 4], None)
    assert "cells sync k=0, async k=2, async k=4, trl" in text and "tuning 8 candidates x 3 steps" in text
    assert (
        "trl"
        not in plan_text(argparse.Namespace(**{**vars(args), "no_trl": True}), [0, 2], None).split(";")[1]
    )


def test_a_missing_trl_venv_or_a_tuning_pass_too_short_to_time_is_a_one_line_error(tmp_path):
    import pytest

    from benchmarks.slow_tools import main

    with pytest.raises(
        SystemExit, match=r"no TRL environment at .*nope: run `bash scripts/setup_trl.sh`, or pass --no-trl"
    ):
        main(["--trl-venv", str(tmp_path / "nope"), "--work", str(tmp_path / "w")])
    with pytest.raises(SystemExit, match="--tune-steps 1: the first step is not timed"):
        main(["--tune-steps", "1", "--work", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()  # nothing started


def test_no_evaluation_runs_inside_a_timed_run(tmp_path):
    """The recipe evaluates every 10 steps and keeps 2 checkpoints; a cell's run evaluates nothing and keeps
    every checkpoint (they are scored after the runs)."""
    from agent_rl.config import load_recipe

    sets = run_sets(tmp_path / "model", tmp_path / "env.yaml", 2)
    assert load_recipe(RECIPE, [], check_model=False).eval.every == 10  # what the override is for
    recipe = load_recipe(
        RECIPE, [s for s in sets if not s.startswith(("model.", "envs."))], check_model=False
    )
    assert recipe.eval.every == 0 and recipe.train.batch_prompts == 2
    # every checkpoint kept for scoring: the recipe's keep (2) would leave a run's curve its last two points
    assert (
        load_recipe(RECIPE, [], check_model=False).checkpoint.keep == 2 and recipe.checkpoint.keep >= 24 // 4
    )
