"""The collapse monitor's responses (agent_rl/monitor.py): adapt_staleness, rollback, stop."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from loop_paths import DENSE_ENV

from agent_rl import checkpoint
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, ConfigError, MonitorConfig, Recipe, load_recipe
from agent_rl.monitor import LoopMonitor, Response, checkpoint_before
from agent_rl.types import FinishReason, Group, Trajectory
from vcpo.monitor import RewardDrop

N, B, K = 2, 2, 4


class AdaptiveBoundMachine(RuleBasedStateMachine):
    """Sampling, finishing, version bumps, takes, and the bound moving under adapt_staleness, in any order:
    every delivered trajectory is within the bound in force when it is taken."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = RolloutBuffer(BufferConfig(max_staleness=K), batch_prompts=B, group_size=N)
        self.running: list[Trajectory] = []
        self.tasks = 0

    @rule()
    def submit(self) -> None:
        pending = len(self.buf.open_groups()) + self.buf.stats()["buffer/ready_groups"] + self.buf._in_step
        gid = self.buf.try_admit(f"t{self.tasks}")
        self.tasks += 1
        if pending >= (self.buf.k + 1) * B:
            assert gid is None, f"admitted with {pending} pending under bound {self.buf.k}"
        if gid is not None:
            for i in range(N):
                self.running.append(self.buf.start(gid, i, [5]))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def sample(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.running))
        t.append_sampled([1], [-0.5], self.buf.version)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), reward=st.sampled_from([0.0, 1.0]))
    def finish(self, data: st.DataObject, reward: float) -> None:
        t = data.draw(st.sampled_from(self.running))
        if t.min_version is None:
            t.append_sampled([1], [-0.5], self.buf.version)
        self.running.remove(t)
        t.reward, t.finish_reason = reward, FinishReason.ANSWER
        self.buf.finish(t)

    @rule()
    def step(self) -> None:
        self.buf.set_version(self.buf.version + 1)

    @rule(k=st.integers(0, K))
    def move_bound(self, k: int) -> None:
        self.buf.set_bound(k)

    @rule()
    def take(self) -> None:
        batch = self.buf.try_take(1)
        for g in batch or []:
            for t in g.trajectories:
                assert t.staleness(self.buf.version) <= self.buf.k, (
                    f"delivered {t.uid} {t.staleness(self.buf.version)} versions stale under bound {self.buf.k}"
                )


TestAdaptiveBound = AdaptiveBoundMachine.TestCase
TestAdaptiveBound.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)


def test_lowering_the_bound_drops_ready_groups_over_it_at_once() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=4), batch_prompts=1, group_size=1)
    for task, version in (("old", 0), ("new", 3)):
        buf.set_version(version)
        gid = buf.try_admit(task)
        t = buf.start(gid, 0, [5])
        t.append_sampled([1], [-0.5], version)
        t.reward, t.finish_reason = 1.0, FinishReason.ANSWER
        buf.finish(t)
    buf.set_version(4)  # "old" is 4 stale, "new" 1
    buf.set_bound(1)
    assert buf.counters.dropped_stale == 1 and list(buf.recycled) == ["old"]
    batch = buf.try_take(1)
    assert batch is not None and batch[0].trajectories[0].task_id == "new"
    assert buf.stats()["buffer/staleness_bound"] == 1


def _metrics(ess: float, grad: float = 0.2, kl: float = 0.01) -> dict[str, float]:
    return {
        "vcpo/ess_ratio": ess,
        "learner/grad_norm": grad,
        "vcpo/is_weight_max": 2.0,
        "vcpo/kl_behavior_current": kl,
    }


def test_adapt_staleness_halves_on_low_ess_drops_to_zero_on_a_warning_and_climbs_back_when_healthy() -> None:
    cfg = MonitorConfig(
        on_warning="adapt_staleness",
        window=4,
        min_unhealthy=3,
        ess_floor=0.05,
        adapt_ess_floor=0.3,
        adapt_patience=2,
    )
    mon = LoopMonitor(cfg, max_staleness=8)
    bounds = [mon.observe(s, _metrics(e)).staleness_bound for s, e in enumerate([0.9, 0.2, 0.9, 0.2])]
    assert bounds == [8, 4, 4, 2]  # low ESS halves; one healthy step is not yet `patience`
    bounds = [mon.observe(10 + s, _metrics(0.01)).staleness_bound for s in range(3)]
    assert bounds == [1, 0, 0]  # halved, then the third unhealthy step in the window warns: 0
    bounds = [mon.observe(20 + s, _metrics(0.9)).staleness_bound for s in range(20)]
    assert bounds[:6] == [0, 0, 1, 1, 2, 2] and bounds[-1] == 8  # +1 per `patience` healthy steps, up to k


def test_adapt_staleness_halves_the_staleness_delivered_not_the_nominal_bound() -> None:
    """With max_staleness 16 but batches only 3 stale, one low-ESS step must bite at once (bound 1), not
    take three halvings (16, 8, 4) that change nothing the learner sees."""
    mon = LoopMonitor(MonitorConfig(on_warning="adapt_staleness", adapt_ess_floor=0.3), max_staleness=16)
    healthy = mon.observe(0, _metrics(0.9) | {"learner/staleness_max": 3.0}).staleness_bound
    low = mon.observe(1, _metrics(0.2) | {"learner/staleness_max": 3.0}).staleness_bound
    assert (healthy, low) == (16, 1)
    # a batch staler than the bound in force (admitted before it was lowered) halves the bound, not more
    assert mon.observe(2, _metrics(0.2) | {"learner/staleness_max": 9.0}).staleness_bound == 0


def test_a_skipped_step_is_not_fed_to_the_monitor() -> None:
    mon = LoopMonitor(MonitorConfig(on_warning="stop", window=1, min_unhealthy=1), max_staleness=2)
    assert mon.observe(0, {"learner/skipped": 1.0}).stop is False
    r = mon.observe(1, _metrics(0.001))
    assert r.stop and r.message.startswith("stopped by monitor.on_warning=stop: collapse warning at step 1")


def test_recipe_refuses_responses_that_cannot_work(smoke_recipe: Callable[..., Recipe]) -> None:
    with pytest.raises(ConfigError, match="rollback reloads checkpoints.*checkpoint.every > 0"):
        smoke_recipe("monitor.on_warning=rollback", "checkpoint.every=0")
    with pytest.raises(
        ConfigError, match="adapt_staleness moves the staleness bound, rollout.fixed_lag=2 pins it"
    ):
        smoke_recipe("monitor.on_warning=adapt_staleness", "rollout.fixed_lag=2")
    with pytest.raises(ConfigError, match="monitor.min_unhealthy=5 > monitor.window=3"):
        smoke_recipe("monitor.window=3", "monitor.min_unhealthy=5")


def test_rollback_restores_weights_and_optimizer_state_lowers_the_lr_and_moves_versions_forward(
    smoke_recipe: Callable[..., Recipe], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from agent_rl.learners import build
    from agent_rl.weight_sync.lagged import LaggedPublisher
    from vcpo.monitor import CollapseWarning

    recipe = smoke_recipe("monitor.on_warning=rollback", "monitor.window=2", "monitor.min_unhealthy=1")
    learner = build(recipe.learner_spec)
    rank = learner.local  # dp=1: the rank lives in this process
    run_dir = tmp_path / "run"
    sync = LaggedPublisher(None, None, mode="memory", lag=2, scratch=tmp_path / "w")  # type: ignore[arg-type]
    for step in range(2):
        learner.step(_groups(step, learner.version))
        sync.history.append((learner.version, {"w": torch.full((1,), float(learner.version))}))
    state = checkpoint.LoopState(2, {}, {}, publisher=sync.state())
    checkpoint.save(run_dir, learner, state, model_dir=tiny_model_dir, keep=5)
    saved_weights = {k: v.clone() for k, v in rank.model.state_dict().items()}
    saved_opt = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in rank.optimizer.state_dict()["state"].items()
    }
    for step in range(2, 5):
        learner.step(_groups(step, learner.version))
        sync.history.append((learner.version, {"w": torch.full((1,), float(learner.version))}))
    assert any(not torch.equal(v, saved_weights[k]) for k, v in rank.model.state_dict().items())

    mon = LoopMonitor(recipe.monitor, max_staleness=2)
    used = mon.rollback(run_dir, learner, sync, CollapseWarning(step=4, unhealthy=1, window=2, reasons=()))

    assert used == run_dir / "checkpoints" / "step_000002"
    for k, v in rank.model.state_dict().items():
        assert torch.equal(v, saved_weights[k]), f"{k} not restored"
    restored = rank.optimizer.state_dict()["state"]
    assert restored.keys() == saved_opt.keys()
    for i, s in saved_opt.items():
        for k, v in s.items():
            assert torch.equal(torch.as_tensor(restored[i][k]), torch.as_tensor(v)), (
                f"optimizer state {i}.{k}"
            )
    assert [g["lr"] for g in rank.optimizer.param_groups] == [recipe.learner.lr * 0.5] * 2
    assert learner.version == 6  # 5 updates, then the restored weights as a new version
    # fixed_lag: the engines continue from the checkpoint's lagged weights, relabelled up to the new version
    assert [(v, float(w["w"])) for v, w in sync.history] == [(5, 1.0), (6, 2.0)]
    # the reward watch starts again from the restored version: a batch holding older samples is not fed to it
    assert mon.clean_from == 6
    mon.observe(5, {"rollout/reward_mean": 0.0, "learner/batch_min_version": 5.0})
    assert mon.rewards.ema is None
    mon.observe(6, {"rollout/reward_mean": 0.5, "learner/batch_min_version": 6.0})
    assert mon.rewards.ema == 0.5
    learner.step(_groups(9, learner.version))  # trains on from there
    assert learner.version == 7


def _groups(seed: int, version: int, vocab: int = 200) -> list[Group]:
    """2 prompts x 2 samples of random tokens below `vocab`, behaviour log-prob -2 each."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(2):
        trajs = []
        for i in range(2):
            t = Trajectory(uid=f"s{seed}g{g}/{i}", group_id=f"s{seed}g{g}", prompt_ids=[3, 4, 5])
            tokens = torch.randint(3, vocab, (6,), generator=gen).tolist()
            t.append_sampled(tokens, [-2.0] * len(tokens), version)
            t.reward = float((g + i) % 2)
            trajs.append(t)
        groups.append(Group(f"s{seed}g{g}", trajs))
    return groups


def test_checkpoint_before_picks_the_newest_at_or_before_the_window_else_the_oldest(tmp_path: Path) -> None:
    for s in (4, 8, 12):
        d = tmp_path / "checkpoints" / f"step_{s:06d}"
        d.mkdir(parents=True)
        (d / "loop.pkl").write_bytes(b"")
    assert checkpoint_before(tmp_path, 9).name == "step_000008"
    assert checkpoint_before(tmp_path, 2).name == "step_000004"
    assert checkpoint_before(tmp_path / "none", 2) is None


def test_stop_checkpoints_and_stops_a_collapsing_fixed_lag_run(
    smoke_recipe: Callable[..., Recipe], capfd: pytest.CaptureFixture[str]
) -> None:
    """Plain REINFORCE, every batch 4 versions stale, lr 100x the smoke recipe's, a dense reward (so a random
    tiny model gets a gradient): within ~10 steps KL(behaviour || current) per token passes the 0.5 ceiling on
    most steps (ESS/B ~0.15) and `stop` checkpoints and ends the run with its one-line reason."""
    from agent_rl.trainer import train

    recipe = smoke_recipe(
        f"envs.train={DENSE_ENV}", "rollout.fixed_lag=4", "train.steps=20", "learner.lr=1.0e-2", "algorithm.loss=reinforce",
        "algorithm.advantage=grpo", "algorithm.ess_lr_rule=none", "checkpoint.every=100",
        "monitor.on_warning=stop", "monitor.window=4", "monitor.min_unhealthy=3",
    )  # fmt: skip
    run_dir = train(recipe)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stopped_at = records[-1]["step"]
    assert stopped_at < 19, "the run was not stopped"
    assert records[-1]["monitor/warning"] == 1.0
    assert not any(r.get("monitor/warning") for r in records[:-1])
    assert checkpoint.latest(run_dir).name == f"step_{stopped_at + 1:06d}"  # checkpointed where it stopped
    err = capfd.readouterr().err
    assert f"stopped by monitor.on_warning=stop: collapse warning at step {stopped_at}" in err


RECORDED = Path(__file__).parent / "data" / "main_job_rewards_2026-12-06.json"


def _replay(run: dict, cfg: MonitorConfig) -> list[Response]:
    """Feed a recorded run's per-step batch reward and oldest sampling version, as the loop does."""
    mon = LoopMonitor(cfg, max_staleness=2)
    return [
        mon.observe(step, {"rollout/reward_mean": r, "learner/batch_min_version": float(v)})
        for step, (r, v) in enumerate(zip(run["reward_mean"], run["batch_min_version"], strict=True))
    ]


def test_the_main_jobs_recorded_collapse_warns_and_rolls_back_to_before_its_peak_and_no_healthy_run_warns(
    tmp_path: Path,
) -> None:
    """The idle `make run` of 2026-12-06 18:10 (held-out 0.25 -> 0.03): its ESS stayed above the signals'
    floor, but its training reward gave back all it had gained by step 24. With the main job's monitor the
    reward warning comes there, and the rollback target is the weights that sampled the peak batch (step 20,
    sampled by version 18): of the checkpoints recipes/tiny_tir.yaml keeps, step_000015. None of the 14 runs of
    the same job that learned (held-out 0.66-0.80 after RL) warns."""
    runs = json.loads(RECORDED.read_text())["runs"]
    main_job = load_recipe(Path(__file__).parents[2] / "recipes" / "tiny_tir.yaml")
    cfg = main_job.monitor
    assert cfg.on_warning == "rollback"
    collapsed = _replay(runs["tiny_tir"], cfg)
    warned = [step for step, r in enumerate(collapsed) if r.warning is not None]
    assert warned[0] == 24 and collapsed[24].rollback
    drop = collapsed[24].warning
    assert isinstance(drop, RewardDrop) and (drop.peak_step, drop.since) == (20, 18)
    assert collapsed[24].metrics["monitor/reward_giveback"] >= 0.8
    every, keep = main_job.checkpoint.every, main_job.checkpoint.keep
    saved = [0] + [s + 1 for s in range(25) if (s + 1) % every == 0][
        -keep:
    ]  # kept after step 24: the start too
    for s in saved:
        (tmp_path / "checkpoints" / f"step_{s:06d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{s:06d}" / "loop.pkl").write_bytes(b"")
    assert checkpoint_before(tmp_path, drop.since).name == "step_000015"
    assert checkpoint_before(tmp_path, 4).name == "step_000000"  # a peak before the first save: the start
    healthy = {name: run for name, run in runs.items() if run["after_rl_accuracy"] >= 0.5}
    assert len(healthy) == 14
    for name, run in healthy.items():
        responses = _replay(run, cfg)
        assert not any(r.warning for r in responses), name
        assert max(r.metrics["monitor/reward_giveback"] for r in responses) < 0.7, name  # measured: <= 0.59


def test_a_run_that_may_roll_back_keeps_its_start_as_a_checkpoint(
    smoke_recipe: Callable[..., Recipe], tmp_path: Path
) -> None:
    """Under monitor.on_warning: rollback the loop saves step_000000 before its first step and keep never removes
    it: a reward peak before the first periodic checkpoint still has weights from before it to go back to (seen
    in benchmarks/collapse_guard.py at lr 1e-3: a peak at step 6 with checkpoints from step 5 on rolled back to
    weights that had already failed, three times)."""
    from agent_rl.trainer import train

    run_dir = train(
        smoke_recipe(
            "monitor.on_warning=rollback", "train.steps=4", "checkpoint.every=1", "checkpoint.keep=1"
        )
    )
    names = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert names == ["step_000000", "step_000004"]
    assert checkpoint.latest(run_dir).name == "step_000004"
    plain_dir = f"logging.run_dir={tmp_path / 'plain'}"
    plain = train(smoke_recipe("train.steps=2", "checkpoint.every=1", "checkpoint.keep=1", plain_dir))  # log
    assert sorted(p.name for p in (plain / "checkpoints").glob("step_*")) == ["step_000002"]
