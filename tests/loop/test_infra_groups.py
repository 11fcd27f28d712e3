"""Infra-failed members are left out where groups form (`Group.of`, in the buffer), so the learner (vcpo) sees a
group of the survivors: their advantages, OPOB baseline and the batch's ESS are exactly those of the group
sampled without the failed member; a batch that is mostly failures stops the run with one line; the cause
mapping at the rollout boundary; the config that bounds retries and the failure share.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from agent_rl import errors
from agent_rl.buffer import RolloutBuffer
from agent_rl.config import BufferConfig, Recipe, RolloutConfig
from agent_rl.failures import EpisodeFailure, InfraFailureRate, backoff_s, check_reward, classify
from agent_rl.learners import build
from agent_rl.metrics import log_batch
from agent_rl.types import INFRA_CAUSES, FinishReason, Group, Trajectory
from envs.types import INFRA_CAUSES as ENV_INFRA_CAUSES
from envs.types import InfraFailure
from sandboxes.api import SandboxError
from vcpo.logprobs import logprobs_of

N = 3


def _fill(traj: Trajectory, model: torch.nn.Module, gen: torch.Generator, length: int, reward: float) -> None:
    """Sampled tokens with behaviour log-probs of `model` (perturbed weights: a stale policy), a tool segment."""
    a, env, b = (torch.randint(3, 200, (k,), generator=gen).tolist() for k in (length, 2, 3))
    ids = torch.tensor([traj.prompt_ids + a + env + b])
    with torch.no_grad():
        lp = logprobs_of(model, ids, torch.ones_like(ids))[0].tolist()
    n = len(traj.prompt_ids)
    traj.append_sampled(a, lp[n : n + len(a)], 0)
    traj.append_env(env)
    traj.append_sampled(b, lp[-len(b) :], 1)
    traj.reward, traj.finish_reason = reward, FinishReason.ANSWER


def _behaviour_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def _learner_recipe(model_dir: Path) -> Recipe:
    return Recipe.model_validate(
        {
            "name": "infra-groups",
            "model": {"path": str(model_dir)},
            "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 4, "batch_prompts": 2},
            "learner": {"lr": 1e-3, "weight_decay": 0.0, "micro_batch_size": 2, "device": "cpu"},
            "algorithm": {"opob_mode": "exact"},  # OPOB from each trajectory's exact gradient norm
        }
    )


@pytest.mark.usefixtures("ranks_from_a_fork_server")  # tests/conftest.py
def test_survivors_train_exactly_as_the_group_sampled_without_the_failed_member(tiny_model_dir: Path) -> None:
    """Through the buffer: 2 groups of 3, member g0/1 failed in the infrastructure. The learner's advantages,
    OPOB baselines, sequence weights, ESS and every step metric equal those of a fresh learner given the same
    groups without g0/1 (bit for bit: the same batch reaches vcpo). Scoring the failed member 0, or keeping it
    in its group's statistics with a masked loss, changes g0's baseline and the ESS (the test fails)."""
    model, gen = _behaviour_model(tiny_model_dir), torch.Generator().manual_seed(1)
    buf = RolloutBuffer(BufferConfig(max_staleness=4), batch_prompts=2, group_size=N)
    rewards = {"g0": [1.0, 0.0, 0.25], "g1": [0.0, 1.0, 0.5]}
    for task in ("t0", "t1"):
        gid = buf.try_admit(task)
        for i in range(N):
            traj = buf.start(gid, i, [5 + int(gid[1:]), 6, 7])
            if (gid, i) == ("g0", 1):  # what EpisodeRunner reports after its retries: no tokens, no reward
                traj.finish_reason, traj.infra_cause = FinishReason.INFRA_FAILED, "sandbox_killed"
            else:
                _fill(traj, model, gen, 3 + 4 * i, rewards[gid][i])
            buf.finish(traj)
    batch = buf.try_take(2)
    assert batch is not None
    without = [  # as if g0/1 had never been sampled
        Group(g.group_id, [t for t in g.trajectories if t.uid != "g0/1"]) for g in batch
    ]

    results = []
    for groups in (batch, without):
        learner = build(_learner_recipe(tiny_model_dir).learner_spec)  # fresh: the same initial weights
        metrics = dict(learner.step(groups))
        results.append((metrics, learner.trained_rows(), learner.hf_state_dict()))
        learner.close()
    (m_left_out, rows_left_out, w_left_out), (m_without, rows_without, w_without) = results
    for uid, row in rows_without.items():
        got = rows_left_out[uid]
        assert (got.advantage, got.baseline, got.seq_log_weight) == (
            row.advantage,
            row.baseline,
            row.seq_log_weight,
        )
    timing = ("perf/", "learner/step_seconds")
    assert {k: v for k, v in m_left_out.items() if not k.startswith(timing)} == {
        k: v for k, v in m_without.items() if not k.startswith(timing)
    }  # vcpo/ess, vcpo/ess_ratio, vcpo/baseline_mean, vcpo/advantage_std, learner/trajectories, ...
    assert all(torch.equal(w_left_out[k], w_without[k]) for k in w_without)  # the same update
    assert set(rows_left_out) == {"g0/0", "g0/2", "g1/0", "g1/1", "g1/2"}  # the failed one is no row
    assert [len(g.trajectories) for g in batch] == [2, 3]
    assert [t.uid for t in batch[0].left_out] == ["g0/1"] and buf.last_infra_share == pytest.approx(1 / 6)
    # g0's baseline is a weighted mean of its survivors' rewards only (1.0 and 0.25), never of a 0 for g0/1
    assert 0.25 <= rows_left_out["g0/0"].baseline <= 1.0


def _finished(buf: RolloutBuffer, task: str, failed: dict[int, str]) -> str:
    """Open a group for `task` and finish its members; `failed`: member index -> infra cause."""
    gid = buf.try_admit(task)
    assert gid is not None
    for i in range(N):
        traj = buf.start(gid, i, [1, 2])
        if i in failed:
            traj.finish_reason, traj.infra_cause = FinishReason.INFRA_FAILED, failed[i]
        else:
            traj.append_sampled([3, 4], [-0.5, -0.5], buf.version)
            traj.reward, traj.finish_reason = float(i), FinishReason.ANSWER
        buf.finish(traj)
    return gid


def test_a_group_whose_members_all_failed_is_dropped_and_its_prompt_sampled_again() -> None:
    buf = RolloutBuffer(
        BufferConfig(max_staleness=0, max_infra_failed_fraction=0.75), batch_prompts=1, group_size=N
    )
    _finished(buf, "t0", {0: "engine", 1: "engine", 2: "no_reward"})
    assert buf.try_take(1) is None and buf.counters.dropped_error == 1
    assert list(buf.recycled) == ["t0"] and buf.counters.recycled == 1  # sampled again, first
    _finished(buf, buf.recycled.popleft(), {})
    (group,) = buf.try_take(1)
    assert group.trajectories[0].task_id == "t0" and len(group.trajectories) == N
    assert buf.last_infra_share == 0.5  # 3 failed (the dropped group) of the 6 episodes this batch took


def test_a_batch_mostly_of_infra_failures_stops_with_one_line_naming_the_causes() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)  # fraction 0.5
    _finished(buf, "t0", {1: "sandbox_killed", 2: "container_start"})  # 2 of 3 failed: 67 % > 50 %
    with pytest.raises(InfraFailureRate) as caught:
        buf.try_take(1)
    msg = errors.user_message(caught.value)  # what `agent-rl train` prints (one line, exit 2)
    assert msg is not None and "\n" not in msg
    assert msg.startswith("2 of the 3 episodes of a batch failed in the infrastructure")
    assert "sandbox_killed 1" in msg and "container_start 1" in msg
    assert "buffer.max_infra_failed_fraction=0.5" in msg


def test_one_failure_of_three_trains_the_other_two() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)
    _finished(buf, "t0", {1: "harness_crash"})
    (group,) = buf.try_take(1)
    assert [t.uid for t in group.trajectories] == ["g0/0", "g0/2"] and group.rewards == [0.0, 2.0]
    assert buf.stats()["buffer/infra_left_out"] == 1 and buf.stats()["buffer/infra_failed_share"] == 1 / 3


def test_groups_that_all_fail_while_the_learner_waits_stop_the_run_instead_of_refilling_forever() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)
    _finished(buf, "t0", {0: "engine", 1: "engine", 2: "engine"})  # 3 failed: a next clean batch makes 3/6
    assert buf.try_take(1) is None
    _finished(buf, buf.recycled.popleft(), {0: "engine", 1: "engine", 2: "engine"})  # 6/9 whatever comes next
    with pytest.raises(InfraFailureRate, match=r"6 of the 9 episodes .*\(engine 6\)"):
        buf.try_take(1)


def test_a_ready_group_keeps_its_left_out_member_through_a_checkpoint() -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=2), batch_prompts=1, group_size=N)
    _finished(buf, "t0", {2: "verifier_timeout"})
    restored = RolloutBuffer(BufferConfig(max_staleness=2), batch_prompts=1, group_size=N)
    restored.load_state(buf.state())
    (group,) = restored.try_take(1)
    assert [t.uid for t in group.trajectories] == ["g0/0", "g0/1"]
    assert [(t.uid, t.infra_cause) for t in group.left_out] == [("g0/2", "verifier_timeout")]


def test_batches_jsonl_names_the_left_out_members_and_their_causes(tmp_path: Path) -> None:
    buf = RolloutBuffer(BufferConfig(max_staleness=0), batch_prompts=1, group_size=N)
    _finished(buf, "t0", {0: "engine"})
    log_batch(tmp_path, 0, buf.try_take(1))
    record = json.loads((tmp_path / "batches.jsonl").read_text())
    assert record["uids"] == ["g0/1", "g0/2"] and record["infra_failed"] == {"g0/0": "engine"}


# -- the rollout boundary: causes, rewards, backoff, config ----------------------------------------------------
@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (InfraFailure("no_reward", "test.sh wrote no /logs/verifier/reward.txt"), "no_reward"),
        (InfraFailure("disk_full", "a cause nobody listed"), "other"),
        (SandboxError("sandbox bwrap did not start: ..."), "container_start"),
        (SandboxError("docker backend: cannot start a container from 'x': 404"), "container_start"),
        (SandboxError("POST http://127.0.0.1:1/run_code failed: ClientConnectorError()"), "sandbox_killed"),
        (SandboxError("sandbox pid 7 sent no reply to run within its 0.5 s timeout + 5 s"), "sandbox_killed"),
        (ValueError("reward my.mod:f returned nan for task t; rewards must be finite"), "bad_reward"),
        (KeyError("a bug in the env"), "other"),
    ],
)
def test_errors_map_to_their_cause_at_the_rollout_boundary(error: BaseException, cause: str) -> None:
    assert classify(error, "env.step for g0/1").cause == cause


def test_a_reward_is_a_finite_number_or_an_infra_failure_never_0() -> None:
    assert check_reward(0.5, "x") == 0.5 and check_reward(1, "x") == 1.0
    for bad, cause in [(None, "no_reward"), (float("nan"), "bad_reward"), (float("inf"), "bad_reward")]:
        with pytest.raises(EpisodeFailure) as caught:
            check_reward(bad, "env.step for g0/1")
        assert caught.value.cause == cause
    for bad in ("1.0", True):
        with pytest.raises(EpisodeFailure, match="bad_reward"):
            check_reward(bad, "x")


def test_backoff_doubles_from_infra_backoff_s_up_to_its_cap() -> None:
    cfg = RolloutConfig(infra_backoff_s=0.5, infra_backoff_max_s=3.0)
    assert [backoff_s(cfg, a) for a in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("section", "fields", "needle"),
    [
        ("rollout", {"infra_retries": -1}, "infra_retries"),
        ("rollout", {"infra_backoff_s": 2.0, "infra_backoff_max_s": 1.0}, "rollout.infra_backoff_max_s=1"),
        ("buffer", {"max_infra_failed_fraction": 1.0}, "max_infra_failed_fraction"),
        ("buffer", {"max_infra_failed_fraction": 0.0}, "max_infra_failed_fraction"),
    ],
)
def test_bad_failure_settings_are_refused(section: str, fields: dict, needle: str) -> None:
    model = RolloutConfig if section == "rollout" else BufferConfig
    with pytest.raises(ValidationError, match=needle):
        model.model_validate(fields)


def test_the_env_side_and_the_trajectory_name_the_same_causes() -> None:
    assert INFRA_CAUSES == ENV_INFRA_CAUSES


def test_a_trajectory_saved_with_the_old_error_reason_reads_as_infra_failed() -> None:
    t = Trajectory("g0/0", "g0", [1], finish_reason=FinishReason.INFRA_FAILED, infra_cause="engine")
    assert Trajectory.from_bytes(t.to_bytes()).infra_cause == "engine"
    assert FinishReason("error") is FinishReason.INFRA_FAILED is FinishReason.ERROR


async def test_an_episode_is_retried_after_doubling_waits_then_left_out(monkeypatch) -> None:
    """The runner's waits between tries (asyncio.sleep recorded, not slept) follow backoff_s; after
    1 + infra_retries tries the member is left out with the cause its env raised."""
    from agent_rl.rollout import episodes

    waits: list[float] = []

    async def recorded(seconds: float) -> None:
        waits.append(seconds)

    class NoContainer:  # an env whose container never starts (what a Harbor env raises)
        stop_strings, max_new_tokens, group_size = (), 4, N

        def reset(self, task) -> list[int]:
            raise InfraFailure("container_start", "docker: image task-q0 failed to start")

        async def close(self) -> None: ...

    monkeypatch.setattr(episodes.asyncio, "sleep", recorded)
    cfg = RolloutConfig(infra_retries=3, infra_backoff_s=0.5, infra_backoff_max_s=1.0)
    buf = RolloutBuffer(
        BufferConfig(max_staleness=0, max_infra_failed_fraction=0.9), batch_prompts=1, group_size=1
    )
    gid = buf.try_admit("q0")
    runner = episodes.EpisodeRunner(cfg, buf, NoContainer, None, max_seq_len=64, seed=0)
    await runner.run(gid, None, 0, None)
    assert waits == [0.5, 1.0, 1.0] and runner.counters.infra_retries == 3
    assert runner.counters.infra_failed == {"container_start": 1}
    assert "image task-q0 failed to start" in (runner.last_error or "")
    assert buf.counters.dropped_error == 1  # its group (of one) had no survivor
