"""The run directory and its one metrics writer: config.yaml, metrics.jsonl, TensorBoard events.

Every training run writes here; `agent-rl plot RUN_DIR` reads metrics.jsonl back.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel


class RunWriter:
    """Append-only metrics for one run: a JSON line per step plus TensorBoard scalars.

    Non-finite values are refused (a NaN in the curves is a bug upstream, not data).
    """

    def __init__(self, run_dir: str | Path, config: BaseModel | None = None, *, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            resolved = config.model_dump(mode="json")
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
            (self.run_dir / "resolved_config.json").write_text(json.dumps(resolved, indent=2))
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 - lives as long as the writer
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))
        self._t0 = time.time()

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        bad = {k: v for k, v in metrics.items() if not math.isfinite(float(v))}
        if bad:
            raise ValueError(
                f"step {step}: non-finite metrics {bad}; refusing to log them (find where they came from)"
            )
        record: dict[str, Any] = {"step": step, "time": round(time.time() - self._t0, 3)}
        record.update({k: float(v) for k, v in metrics.items()})
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
