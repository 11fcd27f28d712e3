"""The trajectory log: per-step compressed records, read back by step, resumable, and what the learner fills in."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from agent_rl.learners.api import TrainedRow
from agent_rl.types import FinishReason, Group, Trajectory, TurnInfo
from agent_rl.viewer.log import TrajectoryLog, read_index, read_meta, read_step


def _traj(uid: str, group: str, *, versions: tuple[int, int] = (3, 3), reward: float = 1.0) -> Trajectory:
    """Prompt, a sampled turn (two runs of tokens, e.g. continued after a weight update), tool output, answer."""
    t = Trajectory(uid=uid, group_id=group, prompt_ids=[1, 2, 3], task_id=f"task-{group}")
    t.append_sampled([10, 11], [-0.5, -0.25], versions[0])
    t.append_sampled([12], [-1.0], versions[1])
    t.append_env([40, 41, 42])
    t.append_sampled([13, 14], [-0.125, -2.0], versions[1])
    t.reward, t.finish_reason = reward, FinishReason.ANSWER
    t.turns = [TurnInfo(3, 3, code_ran=True, exit_code=1), TurnInfo(2)]
    return t


def _groups(n_groups: int, n: int) -> list[Group]:
    return [
        Group(f"g{g}", [_traj(f"g{g}/{i}", f"g{g}", reward=float(i % 2)) for i in range(n)])
        for g in range(n_groups)
    ]


@dataclass
class FakeLearner:
    """Stands in for a learner's `trained_rows` (the protocol the log reads); rows built by hand."""

    rows: dict[str, TrainedRow]
    version: int = 4

    def trained_rows(self) -> dict[str, TrainedRow]:
        return self.rows


def _rows(groups: list[Group], heavy: str | None = None) -> dict[str, TrainedRow]:
    out = {}
    for k, t in enumerate(t for g in groups for t in g.trajectories):
        lp = torch.full((len(t) + 5,), -0.75)  # padded past the trajectory's length, as a batch row is
        out[t.uid] = TrainedRow(5.0 if t.uid == heavy else -0.1 * k, 0.5 * k, 0.25, lp)
    return out


def _open(run: Path, keep: int | str = "all", start: int = 0) -> TrajectoryLog:
    return TrajectoryLog(run, keep, tokenizer="tok", is_truncation=8.0, seed=0, start=start)  # type: ignore[arg-type]


METRICS = {"vcpo/ess_ratio": 0.5, "learner/staleness_mean": 1.5, "learner/staleness_max": 2.0}


def test_round_trip_keeps_every_token_version_logprob_and_learner_value(tmp_path: Path) -> None:
    groups = _groups(2, 3)
    groups[0].trajectories[0] = _traj("g0/0", "g0", versions=(3, 4))  # continued across an update
    rows = _rows(groups)
    log = _open(tmp_path)
    assert log.append(0, groups, FakeLearner(rows), METRICS) >= 0.0
    rec = read_step(tmp_path, 0)
    assert rec.summary.trajectories == 6 and rec.summary.groups == 2 and rec.summary.batch_trajectories == 6
    assert rec.summary.ess_ratio == 0.5 and rec.summary.staleness_mean == 1.5
    assert rec.summary.learner_version == 3  # the learner is at 4 after the step it trained at 3
    for t, r in zip((t for g in groups for t in g.trajectories), rec.trajectories, strict=True):
        assert r.uid == t.uid and r.prompt_ids == t.prompt_ids and r.reward == t.reward
        assert [s.token_ids for s in r.segments] == [list(s.token_ids) for s in t.segments]
        assert [s.sampled for s in r.segments] == [s.sampled for s in t.segments]
        assert [s.versions for s in r.segments if s.sampled] == [
            list(s.versions) for s in t.segments if s.sampled
        ]
        assert [s.behavior_logprobs for s in r.segments if s.sampled] == [
            list(s.logprobs) for s in t.segments if s.sampled
        ]  # these values are exact in float32
        assert all(s.current_logprobs == [-0.75] * len(s.token_ids) for s in r.segments if s.sampled)
        assert r.turns == t.turns and r.finish_reason == "answer" and r.task_id == t.task_id
        assert (r.baseline, r.advantage, r.seq_log_weight) == (
            rows[t.uid].baseline,
            rows[t.uid].advantage,
            pytest.approx(rows[t.uid].seq_log_weight),
        )
    assert rec.trajectories[0].versions == [3, 4] and rec.trajectories[1].versions == [3]
    assert read_meta(tmp_path).is_truncation == 8.0


def test_a_step_is_read_from_its_own_bytes_only(tmp_path: Path) -> None:
    log = _open(tmp_path)
    for step in range(3):
        groups = _groups(2, 2)
        log.append(step, groups, FakeLearner(_rows(groups)), METRICS)
    index = read_index(tmp_path)
    data = tmp_path / "trajectories" / "data.bin"
    raw = bytearray(data.read_bytes())
    for s in (index[0], index[2]):  # destroy every other step's bytes
        raw[s.offset : s.offset + s.length] = b"\0" * s.length
    data.write_bytes(bytes(raw))
    assert read_step(tmp_path, 1).summary.step == 1  # still decodes: one seek, one read
    with pytest.raises(Exception):  # noqa: B017 - zlib.error: the damaged step is really damaged
        read_step(tmp_path, 0)
    with pytest.raises(KeyError, match="no record of step 7 .recorded steps: 0..2"):
        read_step(tmp_path, 7)


def test_n_per_step_keeps_whole_groups_and_the_heaviest_weight(tmp_path: Path) -> None:
    groups = _groups(8, 4)
    rows = _rows(groups, heavy="g6/2")
    _open(tmp_path, keep=8).append(0, groups, FakeLearner(rows), METRICS)
    rec = read_step(tmp_path, 0)
    kept = {t.group_id for t in rec.trajectories}
    assert len(rec.trajectories) == 8 and len(kept) == 2 and "g6" in kept
    assert rec.summary.batch_trajectories == 32
    for g in kept:  # whole groups: every member of a kept group is there
        assert sum(t.group_id == g for t in rec.trajectories) == 4


def test_fewer_than_a_group_still_records_one_group(tmp_path: Path) -> None:
    groups = _groups(3, 4)
    _open(tmp_path, keep=1).append(0, groups, FakeLearner(_rows(groups)), METRICS)
    assert len(read_step(tmp_path, 0).trajectories) == 4


def test_zero_records_nothing(tmp_path: Path) -> None:
    groups = _groups(2, 2)
    assert _open(tmp_path, keep=0).append(0, groups, FakeLearner(_rows(groups)), METRICS) == 0.0
    assert not (tmp_path / "trajectories").exists()
    with pytest.raises(FileNotFoundError, match="logging.trajectories"):
        read_index(tmp_path)


def test_without_learner_rows_the_batch_is_recorded_without_current_logprobs(tmp_path: Path) -> None:
    groups = _groups(1, 2)
    _open(tmp_path).append(0, groups, FakeLearner({}), METRICS)
    t = read_step(tmp_path, 0).trajectories[0]
    assert t.baseline is None and t.seq_log_weight is None
    assert all(s.current_logprobs == [] for s in t.segments)
    assert t.segments[0].behavior_logprobs == [-0.5, -0.25]


def test_resume_drops_later_steps_and_a_torn_tail(tmp_path: Path) -> None:
    log = _open(tmp_path)
    for step in range(4):
        groups = _groups(1, 2)
        log.append(step, groups, FakeLearner(_rows(groups)), METRICS)
    index = read_index(tmp_path)
    d = tmp_path / "trajectories"
    with open(d / "data.bin", "ab") as f:  # a killed run: half a record, half an index line
        f.write(b"\x78\x01partial")
    with open(d / "index.jsonl", "a") as f:
        f.write('{"step": 4, "off')
    log = _open(tmp_path, start=2)  # resume from the checkpoint at step 2
    assert [s.step for s in read_index(tmp_path)] == [0, 1]
    assert (d / "data.bin").stat().st_size == index[2].offset
    groups = _groups(1, 2)
    log.append(2, groups, FakeLearner(_rows(groups)), METRICS)
    assert [s.step for s in read_index(tmp_path)] == [0, 1, 2]
    assert read_step(tmp_path, 2).summary.offset == index[2].offset
    assert len(read_step(tmp_path, 1).trajectories) == 2


def test_a_log_shorter_than_its_index_is_refused_by_name(tmp_path: Path) -> None:
    log = _open(tmp_path)
    groups = _groups(1, 2)
    log.append(0, groups, FakeLearner(_rows(groups)), METRICS)
    (tmp_path / "trajectories" / "data.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="data.bin: 0 bytes but .*index.jsonl points to byte"):
        _open(tmp_path, start=5)


def test_infinite_log_weights_are_written_as_finite_json(tmp_path: Path) -> None:
    groups = _groups(1, 2)
    rows = _rows(groups)
    rows["g0/0"] = TrainedRow(math.inf, 0.0, math.nan, rows["g0/0"].logprobs)
    _open(tmp_path).append(0, groups, FakeLearner(rows), METRICS)
    t = read_step(tmp_path, 0).trajectories[0]
    assert t.seq_log_weight == 1e4 and t.baseline is None
    json.dumps(t.seq_log_weight, allow_nan=False)


def test_resuming_with_recording_off_still_drops_the_later_steps(tmp_path: Path) -> None:
    log = _open(tmp_path)
    for step in range(3):
        groups = _groups(1, 2)
        log.append(step, groups, FakeLearner(_rows(groups)), METRICS)
    _open(tmp_path, keep=0, start=1)
    assert [s.step for s in read_index(tmp_path)] == [0]


def test_a_resumed_run_records_each_step_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A real run checkpointed at steps 2 and 4 loses its last checkpoint (killed before it was written):
    the resumed run drops the records of steps 2-3 and writes them again, once."""
    import os
    import shutil

    from agent_rl.config import load_recipe
    from agent_rl.trainer import train

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(
        root / "recipes" / "tiny_tir_smoke.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"logging.run_dir={tmp_path / 'run'}",
            "train.steps=4",
            "checkpoint.every=2",
        ],
    )
    run_dir = train(recipe)
    assert [s.step for s in read_index(run_dir)] == [0, 1, 2, 3]
    ckpts = run_dir / "checkpoints"
    shutil.rmtree(ckpts / "step_000004")
    (ckpts / "latest").unlink()
    os.symlink("step_000002", ckpts / "latest")
    first = {s.step: s for s in read_index(run_dir)}
    train(recipe, resume=run_dir)
    index = read_index(run_dir)
    assert [s.step for s in index] == [0, 1, 2, 3]
    assert index[2].offset == first[2].offset  # rewritten in place of the dropped records
    assert index[3].offset == index[2].offset + index[2].length
    assert (run_dir / "trajectories" / "data.bin").stat().st_size == index[3].offset + index[3].length
    assert (index[1].offset, index[1].length) == (first[1].offset, first[1].length)  # kept as it was
