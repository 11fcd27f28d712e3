"""The run writer and `agent-rl plot`."""

from __future__ import annotations

import json
import math

import pytest

from agent_rl.cli import main
from agent_rl.metrics import RunWriter, read_metrics


def test_writer_appends_jsonl_and_tensorboard(tmp_path):
    with RunWriter(tmp_path, backends=("jsonl", "tensorboard")) as w:
        w.log(0, {"rollout/reward_mean": 0.25})
        w.log(1, {"rollout/reward_mean": 0.5})
    recs = read_metrics(tmp_path)
    assert [r["rollout/reward_mean"] for r in recs] == [0.25, 0.5]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_writer_refuses_nan(tmp_path):
    with RunWriter(tmp_path) as w, pytest.raises(ValueError, match="non-finite metrics"):
        w.log(0, {"vcpo/ess_ratio": math.nan})


def test_plot_cli_writes_a_png(tmp_path, capsys):
    lines = [
        {
            "step": s,
            "rollout/reward_mean": s / 10,
            "vcpo/ess_ratio": 1 - s / 20,
            "learner/grad_norm": 1.0,
            "buffer/staleness_mean": 1.5,
            "perf/rollout_tokens_per_s": 100.0 + s,
        }
        for s in range(10)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    assert main(["plot", str(tmp_path)]) == 0
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in capsys.readouterr().out


def test_plot_names_bad_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{oops\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        main(["plot", str(tmp_path)])


def test_validate_cli_reports_errors_and_exit_code(capsys):
    from pathlib import Path

    bad = Path(__file__).parent / "data" / "recipes" / "wrong_type.yaml"
    assert main(["validate", str(bad)]) == 2  # errors.EXIT_USER
    assert "learner.lr: Input should be a valid number" in capsys.readouterr().err
