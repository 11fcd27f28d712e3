"""benchmarks/main_job_seeds.py without running the main job: the bare-machine env spec, the summary's statistics
and words, the refusal without a GPU, and resuming from another machine's runs (the GPU's runs.jsonl brought
here). The main job itself is `make run`'s, tested there."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import main_job_seeds as mjs  # noqa: E402


def rec(cell: str, seed: int, before: float, after: float) -> dict:
    return {
        "cell": cell, "seed": seed, "before": before, "after": after, "gain": after - before, "seconds": 60.0,
        "device_name": "cpu" if cell == "cpu" else "NVIDIA H100", "torch": "2.13.0",
    }  # fmt: skip


def test_bare_env_spec_changes_only_the_sandbox_backend(tmp_path: Path) -> None:
    original = yaml.safe_load(mjs.ENV_SPEC.read_text())
    bare = yaml.safe_load(mjs.unsafe_env_spec(tmp_path).read_text())
    assert bare["sandbox"]["backend"] == "unsafe-subprocess"
    assert bare["sandbox"]["options"]["allow_unsafe"] is True
    for key in original:
        if key != "sandbox":
            assert bare[key] == original[key], key
    assert bare["sandbox"]["limits"] == original["sandbox"]["limits"]


def test_summary_gives_mean_se_and_the_two_se_words() -> None:
    records = [rec("cpu", 0, 0.25, 0.76), rec("cpu", 1, 0.25, 0.70), rec("cpu", 2, 0.25, 0.73)]
    records += [rec("cuda", 0, 0.25, 0.30), rec("cuda", 1, 0.25, 0.32), rec("cuda", 2, 0.25, 0.31)]
    summary = mjs.summarize(records, ["cpu", "cuda"])
    cpu = summary["cells"]["cpu"]
    assert cpu["gain_mean"] == pytest.approx((0.51 + 0.45 + 0.48) / 3)
    assert cpu["gain_se"] == pytest.approx(0.03 / math.sqrt(3))  # stdev of 0.51, 0.45, 0.48 is 0.03
    gap = summary["cuda_minus_cpu"]
    assert gap["diff"] == pytest.approx(0.06 - 0.48)
    assert gap["separated"] is True  # 0.42 apart with SEs of ~0.02: far beyond 2 SE
    level = mjs.summarize([rec("cpu", s, 0.25, 0.75 + 0.01 * s) for s in range(3)]
                          + [rec("cuda", s, 0.25, 0.76 - 0.01 * s) for s in range(3)], ["cpu", "cuda"])  # fmt: skip
    assert level["cuda_minus_cpu"]["separated"] is False
    data = {"meta": {"command": "c", "date": "d", "commit": "x", "load_before": [0], "load_after": [0]},
            "summary": summary, "missing": [], "runs": records}  # fmt: skip
    text = mjs.render(data)
    assert "separated: the GPU run learns a different amount" in text and "NVIDIA H100" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_cells_without_a_gpu_or_their_runs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="needs a GPU here, or its runs in"):
        mjs.main(
            ["--devices", "cuda", "--seeds", "0", "--work", str(tmp_path), "--out", str(tmp_path / "out")]
        )


def test_runs_from_another_machine_are_reported_not_rerun(tmp_path: Path) -> None:
    """The GPU's runs.jsonl in the work folder: nothing runs, the report is written from those lines."""
    lines = [rec("cuda", s, 0.25, 0.5) for s in (0, 1)]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "out"
    assert (
        mjs.main(["--devices", "cuda", "--seeds", "0", "1", "--work", str(tmp_path), "--out", str(out)]) == 0
    )
    data = json.loads((out / "main_job_seeds.json").read_text())
    assert [r["seed"] for r in data["runs"]] == [0, 1] and not data["missing"]
    assert data["summary"]["cells"]["cuda"]["gain_mean"] == pytest.approx(0.25)
