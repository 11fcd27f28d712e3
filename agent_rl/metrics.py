"""The run directory and its one metrics writer: config.yaml, metrics.jsonl, and the optional backends.

Every training run writes metrics.jsonl (`agent-rl plot` and `--resume` read it back); `logging.backends`
adds TensorBoard (RUN_DIR/tb), Weights & Biases and MLflow. wandb and mlflow are optional extras, imported
only when listed (`pip install 'agent-rl[wandb]'`, `'agent-rl[mlflow]'`), and log offline into the run dir
unless told otherwise: wandb runs offline unless WANDB_MODE is set (or WANDB_API_KEY is), mlflow writes to
RUN_DIR/mlruns unless MLFLOW_TRACKING_URI is set.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from agent_rl.types import Group

BACKENDS = ("jsonl", "tensorboard", "wandb", "mlflow")


class RunWriter:
    """Append-only metrics for one run: a JSON line per step, plus each listed backend.

    Non-finite values are refused (a NaN in the curves is a bug upstream, not data).
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: BaseModel | None = None,
        *,
        backends: Sequence[str] = ("jsonl",),
        name: str | None = None,
        project: str = "agent-rl",
    ):
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown metrics backend(s) {unknown}: choose from {list(BACKENDS)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resolved = config.model_dump(mode="json") if config is not None else {}
        if config is not None:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
            (self.run_dir / "resolved_config.json").write_text(json.dumps(resolved, indent=2))
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 - lives as long as the writer
        self._sinks: list[_Sink] = []
        name = name or self.run_dir.name
        try:
            if "tensorboard" in backends:
                self._sinks.append(_TensorBoard(self.run_dir))
            if "wandb" in backends:
                self._sinks.append(_WandB(self.run_dir, name, project, resolved))
            if "mlflow" in backends:
                self._sinks.append(_MLflow(self.run_dir, name, project, resolved))
        except BaseException:
            self.close()
            raise
        self._t0 = time.time()

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        bad = {k: v for k, v in metrics.items() if not math.isfinite(float(v))}
        if bad:
            raise ValueError(
                f"step {step}: non-finite metrics {bad}; refusing to log them (find where they came from)"
            )
        record: dict[str, Any] = {"step": step, "time": round(time.time() - self._t0, 3)}
        values = {k: float(v) for k, v in metrics.items()}
        record.update(values)
        self._jsonl.write(json.dumps(record) + "\n")
        for sink in self._sinks:
            sink.log(step, values)

    def close(self) -> None:
        self._jsonl.close()
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Sink:
    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _TensorBoard(_Sink):
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(str(run_dir / "tb"))

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self._w.add_scalar(k, v, step)

    def close(self) -> None:
        self._w.close()


class _WandB(_Sink):
    """One wandb run per run dir (its id is kept in RUN_DIR/wandb_run_id, so --resume continues it)."""

    def __init__(self, run_dir: Path, name: str, project: str, config: dict[str, Any]):
        import wandb

        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        online = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self._run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
            mode=online,
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


class _MLflow(_Sink):
    """One MLflow run per run dir (id kept in RUN_DIR/mlflow_run_id); params are the flattened config."""

    def __init__(self, run_dir: Path, name: str, project: str, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # offline: a file store in the run dir (MLflow 3 keeps it behind this switch)
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / "mlflow_run_id"
        if id_file.is_file():
            self._run_id = id_file.read_text().strip()
        else:
            exp = self._client.get_experiment_by_name(project)
            exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(project)
            self._run_id = self._client.create_run(exp_id, run_name=name).info.run_id
            id_file.write_text(self._run_id)
            for k, v in _flatten(config).items():
                self._client.log_param(self._run_id, k, str(v)[:500])

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """All records of metrics.jsonl; a malformed line is an error naming file and line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: is {run_dir} a run directory written by `agent-rl train`?"
        )
    records = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return records


def log_batch(run_dir: Path, step: int, batch) -> None:
    """batches.jsonl: which prompts and trajectories each step trained on (audit trail for resume tests)."""
    record = {
        "step": step,
        "tasks": [g.trajectories[0].task_id for g in batch],
        "uids": [t.uid for g in batch for t in g.trajectories],
        "sampled_tokens": [t.num_sampled for g in batch for t in g.trajectories],  # length-bias audits
        "turns": [len(t.turns) for g in batch for t in g.trajectories],
        "versions": [
            _runs(t) for g in batch for t in g.trajectories
        ],  # [version, tokens] runs per trajectory
    }
    if left_out := {t.uid: t.infra_cause for g in batch for t in g.left_out}:
        record["infra_failed"] = left_out  # uid -> cause: members left out of their groups (not trained)
    with open(run_dir / "batches.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _runs(traj) -> list[list[int]]:
    """The policy versions of a trajectory's sampled tokens, run-length encoded: [[version, count], ...]."""
    out: list[list[int]] = []
    for v in (v for s in traj.segments for v in (s.versions or ())):
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def mean_reward(batch: Sequence[Group]) -> float:
    rewards = [r for g in batch for r in g.rewards]
    return sum(rewards) / len(rewards)


def progress_fields(metrics: Mapping[str, float]) -> dict[str, str]:
    """What the training progress bar shows after each step."""
    return {
        "reward": f"{metrics['rollout/reward_mean']:.3f}",
        "ess": f"{metrics.get('vcpo/ess_ratio', 1.0):.2f}",
        "stale": f"{metrics.get('buffer/staleness_mean', 0.0):.1f}",
        "tok_s": f"{metrics.get('perf/rollout_tokens_per_s', 0.0):.0f}",
    }
