"""The production topology end to end on CPU: an `agent-rl serve` engine process, the learner rank in a process
of its own, weights broadcast over gloo (`engines.weight_sync: nccl`), partial rollouts across updates.
Every push lands mid-turn by an event, not by timing: the engine server parks mid-turn while the learner
is busy (tests/push_mid_turn.py::push_mid_turn_servers)."""

from __future__ import annotations

import json
from pathlib import Path

from push_mid_turn import push_mid_turn_servers

from agent_rl.metrics import read_metrics
from agent_rl.trainer import train


def test_processes_topology_trains_and_every_token_carries_the_version_that_sampled_it(
    smoke_recipe, monkeypatch, tmp_path
) -> None:
    push_mid_turn_servers(monkeypatch, tmp_path / "park")
    k = 2
    recipe = smoke_recipe(
        "placement.topology=processes",
        "engines.weight_sync=nccl",
        f"buffer.max_staleness={k}",
        "train.steps=5",
        "checkpoint.every=0",
        "rollout.max_concurrent_episodes=16",
    )
    run_dir = Path(train(recipe))
    metrics = [r for r in read_metrics(run_dir) if "learner/version" in r]
    assert [r["learner/version"] for r in metrics] == [1, 2, 3, 4, 5]
    assert all(r["perf/weight_sync_seconds"] > 0 for r in metrics), "every step broadcasts the new weights"

    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    multi = 0
    for b in batches:
        version_at_take = b["step"]  # the learner steps once per step; the engines hold this version or older
        for runs in b["versions"]:
            versions = [v for v, _ in runs]
            assert versions == sorted(versions), f"step {b['step']}: versions go backwards: {runs}"
            assert max(versions) <= version_at_take, f"step {b['step']}: a token from a future policy: {runs}"
            assert version_at_take - min(versions) <= k, f"step {b['step']}: over the staleness bound: {runs}"
            multi += len(runs) > 1
    # partial rollouts: some trajectories were sampled by two policies (a turn or an episode continued
    # across a weight push), and turns aborted by a push were continued, not thrown away
    assert multi > 0
    # cumulative per step: every push after the first step aborted turns in flight
    aborts = [r["rollout/aborts"] for r in metrics]
    assert all(b > a for a, b in zip(aborts, aborts[1:], strict=False)), aborts


def test_engine_servers_boot_while_the_learner_builds_and_stop_when_it_fails(
    smoke_recipe, monkeypatch
) -> None:
    """Under `placement.topology: processes` the engine server starts beside the learner's process, not after it
    (start-up is the slower of the two); a learner that fails to build leaves no engine server running."""
    import threading

    import psutil
    import pytest

    import agent_rl.learners
    from agent_rl import hosts
    from agent_rl.runtime import Runtime

    entered = threading.Event()
    real = hosts.start_engines

    async def start_engines(*args, **kwargs):
        entered.set()
        return await real(*args, **kwargs)

    def build(*args, **kwargs):
        assert entered.wait(600), (
            "the engines were not started while the learner was built"
        )  # a guard, no timing
        raise RuntimeError("the learner could not be built")

    def servers() -> set[int]:  # another module's session-scoped server may share this worker: compare sets
        procs = psutil.Process().children(recursive=True)
        return {p.pid for p in procs if "agent_rl.engines.embedded.server" in " ".join(p.cmdline())}

    monkeypatch.setattr(hosts, "start_engines", start_engines)
    monkeypatch.setattr(agent_rl.learners, "build", build)
    recipe = smoke_recipe("placement.topology=processes", "engines.weight_sync=nccl")
    before = servers()
    with pytest.raises(RuntimeError, match="could not be built"):
        Runtime(recipe, with_learner=True)
    assert servers() - before == set()
