"""benchmarks/gpu_learners.py --cpu-smoke: every section of the GPU benchmark on tiny shapes, on CPU, through the
code path the GPU run takes (--device picks the device; the smoke pins CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_learners import SMOKE_LENGTHS, cell_plan, peak_tflops  # noqa: E402

STATUSES = {"ok", "oom", "skipped", "not_run", "error"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """One run in a fresh process: the Megatron rank's process group and megatron's global state stay out of
    the test process."""
    out = tmp_path_factory.mktemp("gpu_learners")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_learners.py"), "--cpu-smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "gpu_learners.json").read_text()), (out / "gpu_learners.md").read_text()


def test_correctness_section_holds_on_the_device_path(smoke: tuple[dict, str]) -> None:
    checks = smoke[0]["correctness"]
    assert set(checks) == {"logprobs_device_vs_cpu", "vcpo_step_device_vs_cpu", "megatron_vs_torch_logprobs"}
    assert checks["logprobs_device_vs_cpu"]["max_abs_diff"] <= checks["logprobs_device_vs_cpu"]["atol"]
    step = checks["vcpo_step_device_vs_cpu"]
    assert set(step["rel_diff"]) == {"loss", "grad_norm", "ess"}
    assert all(v <= step["rtol"] for v in step["rel_diff"].values()) and step["ok"]
    meg = checks["megatron_vs_torch_logprobs"]  # megatron-core is a dev dependency: it runs here
    assert meg["ok"] and meg["max_abs_diff"] <= meg["atol"]


def test_every_planned_cell_is_recorded_with_a_status(smoke: tuple[dict, str]) -> None:
    res, md = smoke
    names = [c.name for c in cell_plan(SMOKE_LENGTHS, smoke=True)]
    assert [r["name"] for r in res["cells"] if not r.get("tuning")] == names
    for r in res["cells"]:
        assert r["status"] in STATUSES, r
        if r["status"] != "ok":
            assert r["reason"], r  # every cell that did not run says why
    for name in names:
        assert f"| {name} |" in md
    assert {"date", "commit", "device", "versions", "budget_s", "elapsed_s"} <= set(res["meta"])


def test_torch_and_anchor_cells_measure_tokens_per_second_and_compare_with_the_anchor(
    smoke: tuple[dict, str],
) -> None:
    cells = smoke[0]["cells"]
    for r in cells:
        if r["backend"] in ("torch", "anchor"):
            assert r["status"] == "ok" and r["tokens_per_s"] > 0 and r["step_s"] > 0, r
            assert (
                r["peak_gib"] is None and r["mfu"] is None
            )  # CPU: no CUDA peak, no dense bf16 peak to divide by
        if r["backend"] != "anchor":
            assert r["estimate_gib"] > 0  # the memory model's estimate beside every learner cell
    proxy = next(r for r in cells if r["name"].startswith("torch proxy +ckpt") and not r["lora"])
    anchor = next(r for r in cells if r.get("anchor_best") and r["length"] == proxy["length"])
    assert proxy["tokens_per_s_vs_anchor"] == pytest.approx(proxy["tokens_per_s"] / anchor["tokens_per_s"])


def test_the_anchor_is_tuned_and_every_ratio_is_against_the_fastest_configuration(
    smoke: tuple[dict, str],
) -> None:
    """The smoke runs the tuning pass: 4 rows x 64 tokens at 256-token micro-batches -> 4, 2, 1 rows per forward,
    each with and without checkpointing; the fastest candidate is the one timed and compared against."""
    cells = smoke[0]["cells"]
    tuning = [r for r in cells if r.get("tuning")]
    assert sorted((r["micro_batch_tokens"] // r["length"], r["recompute"]) for r in tuning) == sorted(
        (n, ck) for n in (4, 2, 1) for ck in (False, True)
    )
    best = [r for r in cells if r.get("anchor_best")]
    assert len(best) == 1 and best[0]["status"] == "ok"
    fastest = max((r for r in tuning if r["status"] == "ok"), key=lambda r: r["tokens_per_s"])
    assert (best[0]["micro_batch_rows"], best[0]["recompute"]) == (
        fastest["micro_batch_tokens"] // fastest["length"],
        fastest["recompute"],
    )
    for r in cells:  # every learner cell of the tuned batch (the smoke tunes the first length only)
        if r["backend"] != "anchor" and r.get("status") == "ok" and r["length"] == best[0]["length"]:
            assert r["tokens_per_s_vs_anchor"] == pytest.approx(r["tokens_per_s"] / best[0]["tokens_per_s"])


def test_the_smoke_never_writes_over_the_gpu_results() -> None:
    from gpu_learners import RESULTS

    before = {p: p.stat().st_mtime for p in RESULTS.glob("gpu_learners.*")}
    import gpu_learners

    seen = {}
    real = gpu_learners.run
    gpu_learners.run = lambda args: seen.setdefault("out", args.out) and (_ for _ in ()).throw(SystemExit(0))
    try:
        with pytest.raises(SystemExit):
            gpu_learners.main(["--cpu-smoke"])
    finally:
        gpu_learners.run = real
    assert seen["out"] != RESULTS and RESULTS not in seen["out"].parents
    assert {p: p.stat().st_mtime for p in RESULTS.glob("gpu_learners.*")} == before


def test_peak_flops_table_knows_the_h100_and_h200() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # SXM
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA GeForce RTX 4090") is None  # unknown: MFU left empty, never guessed


def test_cells_past_the_budget_are_recorded_as_not_run(tmp_path: Path) -> None:
    import time

    from gpu_learners import run_cells

    plan = cell_plan(SMOKE_LENGTHS, smoke=True)
    rows = run_cells(plan, tmp_path, "cpu", budget_s=0.0, start=time.monotonic(), liger=False)
    assert [r["status"] for r in rows] == ["not_run"] * len(plan)
    assert all(r["reason"].startswith("budget:") for r in rows)
