"""`agent-rl eval` evaluates every env of envs.eval (not only the first); `train --dry-run` honours
RAY_ADDRESS like Ray's own tools and says where a single engine runs when a cluster is joined."""

from __future__ import annotations

import json
from pathlib import Path

from agent_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "tiny_tir_smoke.yaml"


def test_eval_reports_every_eval_env(capsys, tmp_path, tiny_model_dir):
    other = tmp_path / "tiny_arith_b.yaml"
    text = (ROOT / "envs" / "tiny_arith.yaml").read_text()
    other.write_text(text.replace("name: tiny_arith", "name: tiny_arith_b", 1))
    assert "name: tiny_arith_b" in other.read_text()
    code = main(
        [
            "eval", str(SMOKE), "--set", f"model.path={tiny_model_dir}", "--set", "eval.limit=2",
            "--set", f"envs.eval=[envs/tiny_arith.yaml, {other}]",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    reports = json.loads(out)
    assert [r["env"] for r in reports] == ["tiny_arith", "tiny_arith_b"]
    assert all(r["tasks"] == 2 and 0.0 <= r["accuracy"] <= 1.0 for r in reports)


def test_ray_address_joins_the_cluster_and_a_single_engine_is_said_to_run_in_the_driver(
    capsys, monkeypatch, tiny_model_dir
):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    base = ["train", str(SMOKE), "--set", f"model.path={tiny_model_dir}", "--dry-run"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "joining ray://head:10001: the single embedded engine runs inside the driver" in out
    assert main([*base, "--set", "engines.count=2"]) == 0
    assert "joining ray://head:10001: 2 engine replica(s) placed as Ray actors" in capsys.readouterr().out
    assert main([*base, "--address", "auto"]) == 0  # the flag wins over the environment
    assert "joining auto:" in capsys.readouterr().out
