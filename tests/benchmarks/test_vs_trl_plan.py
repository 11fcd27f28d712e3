"""benchmarks/vs_trl.py's orchestration without running anything: the tuning pass's candidates (toy and
SmolLM2) and their interleaved order, each model's sizes on both systems' command lines, --plan, resuming a
finished run, scoring only complete seeds, and refusing an untuned invocation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import vs_trl  # noqa: E402

from benchmarks.harness.provenance import Provenance  # noqa: E402
from benchmarks.harness.runner import interleave, plan  # noqa: E402


def test_the_tuning_pass_covers_trl_threads_by_micro_batches_and_agent_rl_topologies() -> None:
    cands = vs_trl.candidates()
    step = vs_trl.JOBS["tiny"].samples
    trl = {(c.threads, c.micro_batches) for c in cands["trl"]}
    assert trl == {(t, m) for t in (1, 2) for m in (1, 2, 4, 8)}
    assert all(step % m == 0 for _, m in trl)  # each divides the 64 samples of a step
    for k in (0, vs_trl.K_ASYNC):
        # each topology/threads with the recipe's learner micro-batch and with the whole step as one
        assert {(c.topology, c.threads, c.learner_micro_batch) for c in cands[f"agent-rl k={k}"]} == {
            (topo, t, mb) for topo, t in (("inprocess", 1), ("inprocess", 2), ("processes", None))
            for mb in (None, step)
        }  # fmt: skip


def test_tuning_candidates_are_interleaved_across_cells() -> None:
    cands = vs_trl.candidates()
    order = interleave(cands)
    assert sorted(map(str, (c for _, c in order))) == sorted(
        map(str, (c for cs in cands.values() for c in cs))
    )
    # while every cell has candidates left, no cell runs twice in a row
    rounds = min(len(cs) for cs in cands.values())
    head = [name for name, _ in order[: rounds * len(cands)]]
    assert all(a != b for a, b in zip(head, head[1:], strict=False))


def test_a_finished_run_is_reused_only_for_the_same_configuration_seed_and_steps(tmp_path: Path) -> None:
    c = vs_trl.Config("trl", "closest", 0, 1, micro_batches=4)
    run = vs_trl.Run(c, 1, tmp_path / "trl_closest_s1", 1.0, 30.0, 31.0, steps=30)
    run.save()
    assert vs_trl.finished(run.dir, c, 1, 30) == run
    assert vs_trl.finished(run.dir, c, 1, 15) is None
    assert vs_trl.finished(run.dir, c, 2, 30) is None
    assert vs_trl.finished(run.dir, vs_trl.Config("trl", "closest", 0, 1, micro_batches=8), 1, 30) is None


def test_a_stopped_invocation_is_scored_on_its_complete_seeds_only(tmp_path: Path) -> None:
    cells = ["agent-rl k=0", "agent-rl k=2", "trl shipped"]
    session = {"cells": cells, "seeds_planned": 3}
    # seed 0 whole, seed 1 missing one cell, seed 2 whole, and a line cut by a kill
    lines = [{"cell": c, "seed": s, "dir": f"d_{c}_{s}"} for s in (0, 1, 2) for c in cells][:-1]
    lines = lines[:5] + lines[6:]  # seed 1's last cell never ran
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"cell": "trl sh')
    dirs, seeds = vs_trl.complete_runs(tmp_path, session)
    assert seeds == [0] and sorted(dirs) == sorted(f"d_{c}_0" for c in cells)


def test_past_the_time_limit_no_timed_run_starts_and_the_next_invocation_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestration alone, with the tuning pass and the training processes replaced (they need .venv-trl):
    --time-limit-min 0 starts no timed run and leaves the session scorable; a second invocation runs every run of
    the plan once, in the harness's rotated order, and a third runs none again."""
    trained: list[tuple[str, int]] = []
    config = {k: vs_trl.Config("agent-rl", "vcpo", k, 1, "inprocess") for k in (0, vs_trl.K_ASYNC)}
    chosen = {f"agent-rl k={k}": c for k, c in config.items()} | {
        "trl": vs_trl.Config("trl", "shipped", 0, 2, micro_batches=1)
    }
    monkeypatch.setattr(
        vs_trl, "tune", lambda *a, **k: {"chosen": chosen, "s_per_step": {}, "cores_busy": {}, "failed": {}}
    )

    def train(c, seed, model, d, *a, **k):
        trained.append((c.name, seed))
        return vs_trl.Run(c, seed, d, 0.0, 1.0, 1.0, steps=4)

    monkeypatch.setattr(vs_trl, "train", train)
    args = argparse.Namespace(job=vs_trl.JOBS["tiny"], quick=False, work=tmp_path, tune_steps=2, seeds=2, steps=4,
                              every=2, budget_s=60.0, time_limit_min=0.0)  # fmt: skip
    session_file = tmp_path / "session.json"
    vs_trl.run_cells(args, tmp_path, tmp_path / "python", session_file, Provenance(["vs_trl.py"]))
    assert trained == [] and json.loads(session_file.read_text())["time_limit_min"] == 0.0
    assert vs_trl.complete_runs(tmp_path, json.loads(session_file.read_text())) == ([], [])
    args.time_limit_min = None
    vs_trl.run_cells(args, tmp_path, tmp_path / "python", session_file, Provenance(["vs_trl.py"]))
    cells = json.loads(session_file.read_text())["cells"]
    assert trained == [(j.cell, j.seed) for j in plan(cells, range(2))] and len(cells) == 5
    vs_trl.run_cells(args, tmp_path, tmp_path / "python", session_file, Provenance(["vs_trl.py"]))
    assert len(trained) == 10
    # the results' header (machine line, provenance) is the one of the invocation that ran the runs
    assert "machine" in json.loads(session_file.read_text())
    assert vs_trl.complete_runs(tmp_path, json.loads(session_file.read_text()))[1] == [0, 1]


def test_an_invocation_without_a_tuning_pass_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit, match="--tune-steps 0: the results carry the tuning pass"):
        vs_trl.main(["--tune-steps", "0", "--plan"])
    assert vs_trl.main(["--plan"]) == 0
    out = capsys.readouterr().out
    assert "tuning pass: 20 candidates x 30 steps" in out and "cells: 5 x 3 seed(s) x 30 steps" in out
    assert vs_trl.main(["--plan", "--steps", "12"]) == 0  # the toy tunes on the cells' length, whatever it is
    assert "tuning pass: 20 candidates x 12 steps" in capsys.readouterr().out


def test_the_tuning_pass_chooses_the_fastest_candidate_that_ran() -> None:
    cands = vs_trl.candidates()
    seen = {f"{n}: {c.label}": float(i + 1) for n, cs in cands.items() for i, c in enumerate(cs)}
    seen["trl: 1 thread(s), 1 micro-batch(es)"] = None  # failed: never chosen, however it would have done
    chosen = vs_trl.choose(cands, seen)
    assert chosen["trl"].label == "1 thread(s), 2 micro-batch(es)"
    assert chosen["agent-rl k=0"].label == "1 thread(s), inprocess"
    seen |= dict.fromkeys((k for k in seen if k.startswith("trl: ")), None)
    with pytest.raises(SystemExit, match="every candidate of trl failed"):
        vs_trl.choose(cands, seen)


def test_a_pass_over_the_cells_length_times_every_step_but_the_first_and_a_shorter_one_its_last_half() -> (
    None
):
    # an async candidate that starts fast and ends slow (sum 4+6 after the first) against a steady one (sum 10.5)
    fast_then_slow, steady = [9.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0], [9.0] + [1.75] * 6
    assert vs_trl.tuned_s_per_step(fast_then_slow, whole_run=True) == pytest.approx(10 / 6)
    assert vs_trl.tuned_s_per_step(steady, whole_run=True) == pytest.approx(1.75)  # slower over the whole run
    assert vs_trl.tuned_s_per_step(fast_then_slow) == pytest.approx(
        (1 + 1 + 3 + 3) / 4
    )  # steps 3..6: ranked last
    assert vs_trl.tuned_s_per_step(steady) == pytest.approx(1.75)
    assert vs_trl.timed(True) != vs_trl.timed(False)


def test_the_toy_job_is_the_recipe_as_it_is() -> None:
    """--model tiny passes the recipe's own sizes, so the toy cells are what they were before --model."""
    import envs
    from agent_rl.config import load_recipe

    recipe = load_recipe(vs_trl.RECIPE, [], check_model=False)
    tiny = vs_trl.JOBS["tiny"]
    assert (tiny.prompts, tiny.lr) == (recipe.train.batch_prompts, recipe.learner.lr)
    assert envs.load(vs_trl.ROOT / "envs" / "tiny_arith_agent.yaml").group_size == vs_trl.GROUP


def test_smollm2_tunes_the_same_grid_on_its_own_step_and_quick_on_a_part_of_it() -> None:
    job = vs_trl.JOBS["smollm2"]
    full, tiny = vs_trl.candidates(job), vs_trl.candidates()
    assert [(n, len(cs)) for n, cs in full.items()] == [(n, len(cs)) for n, cs in tiny.items()]
    assert all(job.samples % c.micro_batches == 0 for c in full["trl"])
    for k in (0, vs_trl.K_ASYNC):
        assert {c.learner_micro_batch for c in full[f"agent-rl k={k}"]} == {None, job.samples}
    quick = vs_trl.candidates(job, quick=True)
    assert quick == {n: cs[:2] for n, cs in full.items()}  # SmolLM2's --quick: the first two of each cell


def test_the_toy_quick_run_tunes_the_ends_of_every_dimension() -> None:
    """The toy's --quick (in CI) tunes two candidates a cell, which between them take every value of each dimension
    the full pass tries at its ends: agent-rl 1 thread in-process with the recipe's micro-batch and the processes
    topology with the whole step's; TRL 1 thread and 1 micro-batch, 2 threads and 8."""
    quick = vs_trl.candidates(vs_trl.JOBS["tiny"], quick=True)
    assert all(len(cs) == 2 for cs in quick.values())
    for k in (0, vs_trl.K_ASYNC):
        first, last = quick[f"agent-rl k={k}"]
        assert (first.threads, first.topology, first.learner_micro_batch) == (1, "inprocess", None)
        assert (last.topology, last.learner_micro_batch) == ("processes", vs_trl.JOBS["tiny"].samples)
    assert [(c.threads, c.micro_batches) for c in quick["trl"]] == [(1, 1), (2, 8)]


def _sets(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]


def test_both_systems_run_the_models_prompts_and_lr(tmp_path: Path) -> None:
    from agent_rl.config import load_recipe

    job = vs_trl.JOBS["smollm2"]
    args = (1, tmp_path / "model", tmp_path / "run", 30, 10, tmp_path / "python", job)
    trl, env = vs_trl.command(vs_trl.Config("trl", "closest", 0, 2, micro_batches=4), *args)
    assert trl[trl.index("--prompts") + 1] == str(job.prompts) and float(trl[trl.index("--lr") + 1]) == job.lr
    assert env == {}  # TRL sets its threads itself (--threads)
    c = vs_trl.Config("agent-rl", "vcpo", 2, 1, "inprocess", learner_micro_batch=job.samples)
    ours, env = vs_trl.command(c, *args)
    recipe = load_recipe(vs_trl.RECIPE, _sets(ours), check_model=False)
    assert (recipe.train.batch_prompts, recipe.learner.lr) == (job.prompts, job.lr)
    assert (recipe.learner.micro_batch_size, recipe.buffer.max_staleness) == (job.samples, 2)
    assert env == {"OMP_NUM_THREADS": "1"}


def test_the_smollm2_plan_states_its_sizes(capsys: pytest.CaptureFixture) -> None:
    assert vs_trl.main(["--model", "smollm2", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct, 4 prompt(s) x 8 samples a step, lr 1e-05" in out
    assert "tuning pass: 20 candidates x 10 steps" in out and "cells: 5 x 3 seed(s) x 30 steps" in out
    assert "scoring: 46 evaluations" in out  # checkpoints every 10 steps: 15 runs x 3, and the warm start
    assert vs_trl.main(["--model", "smollm2", "--quick", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "1 prompt(s) x 8 samples" in out and "tuning pass: 6 candidates x 2 steps" in out
    assert "cells: 5 x 1 seed(s) x 4 steps" in out and "scoring: 11 evaluations" in out
