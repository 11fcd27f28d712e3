"""Metrics backends (logging.backends): jsonl always, tensorboard, and wandb and mlflow offline into the run
dir; a resumed run continues the same wandb and MLflow runs; a missing extra is one line with its install."""

from __future__ import annotations

import re
import sys

import pytest

from agent_rl.errors import user_message
from agent_rl.metrics import RunWriter, read_metrics

STEPS = [
    {"rollout/reward_mean": 0.25, "vcpo/ess_ratio": 1.0},
    {"rollout/reward_mean": 0.5, "vcpo/ess_ratio": 0.8},
]


@pytest.fixture
def offline(monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_all_four_backends_log_offline_into_the_run_dir_and_resume_continues_them(tmp_path, offline):
    pytest.importorskip("wandb", reason="pip install 'agent-rl[wandb]'")
    pytest.importorskip("mlflow", reason="pip install 'agent-rl[mlflow]'")
    from mlflow.tracking import MlflowClient

    backends = ("jsonl", "tensorboard", "wandb", "mlflow")
    with RunWriter(tmp_path, backends=backends, name="run-a") as w:
        w.log(0, STEPS[0])
    with RunWriter(tmp_path, backends=backends, name="run-a") as w:  # --resume: the same run dir
        w.log(1, STEPS[1])
    assert [r["rollout/reward_mean"] for r in read_metrics(tmp_path)] == [0.25, 0.5]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    # Offline, each start writes its own offline-run dir; both carry the same run id, so `wandb sync`
    # uploads them as one run. wandb < 0.31 names both `offline-run-<time>-<id>`; 0.31 adds `-1` to a second
    # dir of the same id started within the same second.
    run_id = (tmp_path / "wandb_run_id").read_text()
    wandb_runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    named = [
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?", r.name) for r in wandb_runs
    ]
    assert len(wandb_runs) == 2 and all(named), [r.name for r in wandb_runs]
    # The .wandb files are protobuf records (what `wandb sync` uploads): each holds its step's history row.
    first, second = (next(r.glob("run-*.wandb")).read_bytes() for r in wandb_runs)
    assert b"rollout/reward_mean" in first and b"0.25" in first
    assert b"rollout/reward_mean" in second and b"0.5" in second
    client = MlflowClient(
        tracking_uri=(tmp_path / "mlruns").resolve().as_uri()
    )  # mlflow ui --backend-store-uri
    run_id = (tmp_path / "mlflow_run_id").read_text()
    history = client.get_metric_history(run_id, "rollout/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.25), (1, 0.5)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_an_unknown_backend_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown metrics backend\(s\) \['neptune'\]"):
        RunWriter(tmp_path, backends=("jsonl", "neptune"))


@pytest.mark.parametrize("module,extra", [("wandb", "agent-rl[wandb]"), ("mlflow", "agent-rl[mlflow]")])
def test_a_missing_extra_is_one_line_naming_its_install(tmp_path, monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    if module == "mlflow":
        monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(ModuleNotFoundError) as e:
        RunWriter(tmp_path, backends=("jsonl", module))
    assert user_message(e.value) == f"the optional package {module!r} is not installed: pip install '{extra}'"
    assert not (tmp_path / "metrics.jsonl").read_text()  # the writer closed what it had opened
