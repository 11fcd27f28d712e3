"""The study's grid files load, and a bad one fails naming the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.stress.report import SAME_AT_K0, k_star, summarise
from benchmarks.stress.study import StudyConfig, cell_key
from envs.yamlio import ConfigError, load_model

STRESS = Path(__file__).resolve().parents[3] / "benchmarks" / "stress"


@pytest.mark.parametrize("name", ["grid.yaml", "grid_full.yaml"])
def test_shipped_grid_files_load_with_unique_cells(name: str) -> None:
    study = load_model(STRESS / name, StudyConfig)
    cells = study.cells()
    assert len({cell_key(c) for c in cells}) == len(cells)
    assert any(c.lr == study.reference_lr and c.lag == 0 and c.method == "plain" for c in cells)


def test_unknown_method_is_reported_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "reference_lr: 1.0e-3\nblocks:\n  - name: x\n    methods: [plain, vcpoo]\n    lags: [0]\n    lrs: [1.0e-3]\n"
    )
    with pytest.raises(ConfigError, match=r"bad.yaml:4: blocks\[0\].methods: .*vcpoo"):
        load_model(bad, StudyConfig)


def _run(method: str, lag: int, final: float) -> dict:
    cfg = {"method": method, "lag": lag, "lr": 1e-3, "seed": 0, "opob_mode": "proxy"}
    curve = [0.07, final, final, final]
    one = [1.0]
    return {"config": cfg, "heldout_reward": curve, "error": None, "ess_ratio": one, "is_weight_max": one,
            "log_ratio_abs_max": one, "kl": one, "grad_norm": one, "learner_seconds": one}  # fmt: skip


def test_k_star_is_the_last_lag_of_the_unbroken_run_above_ninety_percent_of_sync() -> None:
    runs = [_run("plain", 0, 0.5), _run("tis", 1, 0.46), _run("tis", 2, 0.40), _run("tis", 4, 0.49)]
    cells = summarise(runs, "proxy")
    # tis has no k=0 run: its k=0 row is plain's (same update); 0.46 >= 0.45 passes, 0.40 stops it.
    assert SAME_AT_K0["tis"] == "plain"
    assert k_star(cells, "tis", 1e-3, sync=0.5) == 1
    assert k_star(cells, "plain", 1e-3, sync=0.5) == 0


def test_every_shipped_study_file_passes_its_own_check(capsys):

    from benchmarks.stress.grid import check

    studies = sorted(STRESS.glob("*.yaml"))
    assert studies and check(studies) == 0
    assert capsys.readouterr().out.count(": ok (study)") == len(studies)
