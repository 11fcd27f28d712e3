"""benchmarks/trl_run.py's `step_timer`, the TrainerCallback of both TRL runs (vs_trl's trl_run.py and slow_tools'
trl_swe.py): one steps.jsonl line per step, the checkpoint save timed apart and counted in no step, a whole
checkpoint every N steps and at the last, the step's phases and rest adding up to it.

TRL's trainer cannot run in this venv (it has its own, .venv-trl): the test drives the callback through the
Trainer's callback protocol (on_train_begin, on_pre_optimizer_step, on_optimizer_step, on_step_end with the state's
global_step), on a clock it moves by hand, with a model and tokenizer that stand in at their one method the callback
calls (`save_pretrained`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trl_run  # noqa: E402

STEP_S, SAVE_S = 1.0, 100.0  # the hand clock: a step takes 1 s, a save 100 s


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class SavesTo:
    """Stands in for the model (or tokenizer) at `save_pretrained`: writes FILE into the folder, takes SAVE_S."""

    def __init__(self, clock: Clock, file: str) -> None:
        self.clock, self.file = clock, file

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / self.file).write_text("{}")
        self.clock.now += SAVE_S


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    # only trl_run's own clock: PhaseClock's perf_counter and process_time stay real
    fake = SimpleNamespace(monotonic=c.monotonic, time=time.time, perf_counter=time.perf_counter,
                           process_time=time.process_time)  # fmt: skip
    monkeypatch.setattr(trl_run, "time", fake)
    return c


def _train(
    out: Path, clock: Clock, steps: int, every: int, tokenizer: object = None, extra=dict
) -> list[dict]:
    phases = trl_run.PhaseClock()
    model = SavesTo(clock, "config.json")
    timer = trl_run.step_timer(out, steps, every, phases, lambda: model, tokenizer, extra)
    timer.on_train_begin(None, None, None)
    for step in range(1, steps + 1):
        phases.enter()
        clock.now += STEP_S
        phases.leave("generate")
        timer.on_pre_optimizer_step(None, None, None)
        timer.on_optimizer_step(None, None, None)
        timer.on_step_end(None, SimpleNamespace(global_step=step), None)
    return [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]


def test_a_checkpoint_every_n_steps_and_at_the_last_whole_and_timed_apart(
    tmp_path: Path, clock: Clock
) -> None:
    recs = _train(tmp_path, clock, steps=5, every=2)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["step_2", "step_4", "step_5"]  # every 2 steps, and the last
    for name in saved:  # whole: renamed into hf, no temporary folder left
        ck = tmp_path / "checkpoints" / name
        assert [p.name for p in ck.iterdir()] == ["hf"] and (ck / "hf" / "config.json").is_file()
    # the save is in neither the step it ends nor the next one
    assert [r["step_seconds"] for r in recs] == [STEP_S] * 5
    assert [r["save_seconds"] for r in recs] == [0.0, SAVE_S, 0.0, SAVE_S, SAVE_S]


def test_the_step_s_phases_and_rest_add_up_to_it(tmp_path: Path, clock: Clock) -> None:
    for r in _train(tmp_path, clock, steps=3, every=3):
        wall = [v for k, v in r.items() if k.startswith("phase_") and not k.startswith("phase_cpu_")]
        assert {"phase_generate", "phase_optimizer", "phase_cpu_optimizer", "phase_rest"} <= set(r)
        # phase_rest is the step less the (rounded) phases, itself rounded to 1e-4 s: half of that apart at most
        # (1e-12: the float sum of a few numbers of order 1)
        assert abs(sum(wall) - r["step_seconds"]) <= 0.5e-4 + 1e-12


def test_the_tokenizer_goes_into_the_checkpoint_and_extra_fields_into_each_line(
    tmp_path: Path, clock: Clock
) -> None:
    """trl_swe.py's use: its checkpoints are scored by TRL's own eval loop, which loads the tokenizer from them; each
    step's episodes go on the step's line."""
    taken = iter(range(1, 10))
    recs = _train(tmp_path, clock, steps=2, every=2, tokenizer=SavesTo(clock, "tokenizer.json"),
                  extra=lambda: {"episodes": [next(taken)]})  # fmt: skip
    assert (tmp_path / "checkpoints" / "step_2" / "hf" / "tokenizer.json").is_file()
    assert [r["episodes"] for r in recs] == [[1], [2]]
    assert recs[1]["save_seconds"] == 2 * SAVE_S  # the model's save and the tokenizer's
