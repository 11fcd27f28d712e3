"""The level (b) report completes a study in parts: runs packed by an earlier report count with new run dirs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.stress.level_b_report import main, read_series


def _write_run(runs: Path, name: str, accuracy: float, steps: int = 4) -> None:
    d = runs / name
    d.mkdir(parents=True)
    (d / "resolved_config.json").write_text(json.dumps({"train": {"steps": steps}}))
    recs = []
    for s in range(steps):
        r = {"step": s, "time": float(s), "rollout/reward_mean": 0.5, "vcpo/ess_ratio": 0.9}
        r |= {"learner/grad_norm": 0.1, "vcpo/is_weight_max": 1.2, "vcpo/kl_behavior_current": 0.01}
        r |= {"vcpo/log_ratio_abs_max": 0.2, "vcpo/lr_scale": 1.0}
        if s == steps - 1:
            r["eval/accuracy"] = accuracy
        recs.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_second_report_keeps_the_runs_the_first_packed_and_a_rerun_replaces_its_packed_copy(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out" / "level_b_stabilisers.md"
    out.parent.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    _write_run(first, "stress_b_vcpo_nomaskvoid_k8_s0", 0.7)
    _write_run(first, "stress_b_plain_nomaskvoid_k8_s0", 0.1)
    main(str(first), str(out))
    # a later session: the first runs' dirs are gone; one new seed, and k=8 seed 0 of plain run again
    _write_run(second, "stress_b_vcpo_nomaskvoid_k8_s1", 0.6)
    _write_run(second, "stress_b_plain_nomaskvoid_k8_s0", 0.3)
    main(str(second), str(out))
    packed = {r["name"]: r["eval_accuracy"][-1] for r in read_series(out.with_name("runs_b.jsonl.gz"))}
    assert packed == {
        "stress_b_vcpo_nomaskvoid_k8_s0": 0.7,
        "stress_b_vcpo_nomaskvoid_k8_s1": 0.6,
        "stress_b_plain_nomaskvoid_k8_s0": 0.3,  # the run dir wins over its packed copy
    }
    cmp = json.loads(out.with_suffix(".json").read_text())
    vcpo = cmp["table"]["vcpo_nomaskvoid"]["8"]
    assert vcpo["seeds"] == 2 and abs(vcpo["mean"] - 0.65) < 1e-9
    assert "3 runs" in out.read_text()


def test_the_responses_report_keeps_the_cells_an_earlier_report_measured(tmp_path: Path) -> None:
    from benchmarks.stress.responses_report import earlier_cells
    from benchmarks.stress.responses_report import main as responses_main

    out = tmp_path / "responses.md"
    earlier = {"final_mean": 0.5, "final_std": 0.0, "collapsed": 0, "wall_mean": 10.0}
    earlier |= {"seeds": 4, "rollbacks": 0, "warned": 0, "bound_mean": None, "staleness_mean": 0.0}
    out.with_suffix(".json").write_text(json.dumps({"fixed|k=0": earlier}))
    runs = tmp_path / "runs"
    for mode in ("adapt", "fixed"):
        d = runs / f"stress_r_{mode}_k16_s0"
        d.mkdir(parents=True)
        (d / "resolved_config.json").write_text(json.dumps({"train": {"steps": 2}}))
        recs = [{"step": 0, "time": 1.0}, {"step": 1, "time": 3.0, "eval/accuracy": 0.4}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    responses_main(str(runs), str(out))
    cells = earlier_cells(out.with_suffix(".json"))
    assert cells[("fixed", 0)]["seeds"] == 4  # kept from the earlier report
    assert cells[("adapt", 16)]["final_mean"] == 0.4 and cells[("fixed", 16)]["seeds"] == 1
    assert "| 16 | k=0 (sync) | 4 |" in out.read_text()  # the new k compared with the kept sync cell


def test_k_star_claims_only_measured_lags(tmp_path: Path) -> None:
    """A method run only at k=16 has no k*: the lags it skipped are not evidence that it holds there."""
    from benchmarks.stress.level_b_report import comparison, load_runs

    runs = tmp_path / "runs"
    _write_run(runs, "stress_b_vcpo_nomaskvoid_k0_s0", 0.8)
    _write_run(runs, "stress_b_vcpo_nomaskvoid_k4_s0", 0.5)  # below 90 % of sync
    _write_run(runs, "stress_b_vcpo_nomaskvoid_k16_s0", 0.78)
    _write_run(runs, "stress_b_vcpo_k16_s0", 0.79)  # void masking on, only k=16 ran
    cmp = comparison(load_runs(str(runs)))
    assert cmp["k_star"] == {"vcpo_nomaskvoid": 0, "vcpo": None}
    assert cmp["k_within_tolerance"] == {"vcpo_nomaskvoid": [0, 16], "vcpo": [16]}


def test_a_fixed_lag_run_is_scored_by_its_learner_policy_not_the_lagged_engine_eval(tmp_path: Path) -> None:
    """Under fixed_lag=k the periodic eval measures the engines' policy, k steps old: the final checkpoint's
    eval (final_eval.json) decides the final accuracy, and the curve is placed at the step it measured."""
    from benchmarks.stress.level_b_report import final_accuracy, load_runs, policy_curve

    runs = tmp_path / "runs"
    _write_run(runs, "stress_b_tis_nomaskvoid_k2_s0", 0.7, steps=6)  # lagged eval at step 5 says 0.7
    _write_run(runs, "stress_b_tis_nomaskvoid_k2_s1", 0.6, steps=6)  # no final eval: falls back, flagged
    (runs / "stress_b_tis_nomaskvoid_k2_s0" / "final_eval.json").write_text(json.dumps({"accuracy": 0.0}))
    r0, r1 = load_runs(str(runs))
    assert final_accuracy(r0) == 0.0 and final_accuracy(r1) == 0.6
    assert policy_curve(r0) == ([3, 5], [0.7, 0.0])  # eval after step 5 ran version 6-2=4: step 3's policy
    assert policy_curve(r1) == ([3], [0.6])
