"""The production topology's core plan: a pure function, its config checks, and what --dry-run prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl import cores, placement
from agent_rl.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_two_cores_pin_engine_to_core_0_and_learner_to_core_1_and_leave_the_driver_free() -> None:
    m = cores.assign(None, engines=1, learner_ranks=1, cpus=(0, 1))
    assert m.engines == ((0,),) and m.learner_ranks == ((1,),) and m.rollout == (0, 1)


def test_learner_ranks_take_the_upper_half_split_evenly() -> None:
    m = cores.assign(None, engines=2, learner_ranks=2, cpus=tuple(range(8)))
    assert m.learner_ranks == ((4, 5), (6, 7))
    assert m.engines == ((0, 1), (2, 3)) and m.rollout == tuple(range(8))


def test_more_processes_than_cores_share_round_robin() -> None:
    m = cores.assign(None, engines=3, learner_ranks=1, cpus=(0, 1))
    assert m.engines == ((0,), (0,), (0,)) and m.learner_ranks == ((1,),)


def test_explicit_cores_win_per_role_and_the_rest_is_automatic() -> None:
    m = cores.assign({"learner": (0,)}, engines=1, learner_ranks=1, cpus=(0, 1))
    assert m.learner_ranks == ((0,),) and m.engines == ((0,),)
    m = cores.assign({"engine": (1,), "rollout": (1,)}, engines=1, learner_ranks=1, cpus=(0, 1))
    assert m.engines == ((1,),) and m.rollout == (1,) and m.learner_ranks == ((1,),)


def test_a_core_this_process_cannot_use_is_refused_naming_the_available_ones() -> None:
    with pytest.raises(
        ValueError, match=r"placement.cores.engine: core\(s\) \[7\] are not available.*\[0, 1\]"
    ):
        cores.assign({"engine": (7,)}, engines=1, learner_ranks=1, cpus=(0, 1))


def test_pin_sets_affinity_and_torch_threads_in_the_calling_process() -> None:
    code = (
        "import os, torch; from agent_rl.cores import pin; pin((0,)); "
        "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[0] 1"


def test_processes_topology_needs_a_cross_process_weight_path(smoke_recipe) -> None:
    with pytest.raises(ConfigError, match="set engines.weight_sync: nccl"):
        smoke_recipe("placement.topology=processes")
    assert (
        smoke_recipe("placement.topology=processes", "engines.weight_sync=nccl").placement.topology
        == "processes"
    )


def test_cores_without_the_processes_topology_are_refused(smoke_recipe) -> None:
    with pytest.raises(
        ConfigError, match="placement.cores pins processes: it needs placement.topology: processes"
    ):
        smoke_recipe("placement.cores={engine: [0]}")


def test_plan_carries_the_core_map_only_for_the_processes_topology(smoke_recipe) -> None:
    assert placement.plan(*_parts(smoke_recipe())).cores is None
    p = placement.plan(
        *_parts(smoke_recipe("placement.topology=processes", "engines.weight_sync=nccl", "engines.count=2")),
        cpus=(0, 1, 2, 3),
    )
    assert p.cores == cores.CoreMap(engines=((0,), (1,)), learner_ranks=((2, 3),), rollout=(0, 1, 2, 3))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the automatic split needs two cores")
def test_dry_run_prints_which_process_gets_which_cores(tiny_model_dir: Path) -> None:
    args = ["--set", f"model.path={tiny_model_dir}", "--dry-run"]
    cmd = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        str(ROOT / "recipes" / "tiny_tir_smoke.yaml"),
        *args,
    ]
    proc = subprocess.run(
        [*cmd, "--set", "placement.topology=processes", "--set", "engines.weight_sync=nccl"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    cpus = sorted(os.sched_getaffinity(0))
    assert f"engine server 0: cores [{cpus[0]}]" in proc.stdout
    assert f"learner rank 0: cores [{cpus[-1]}]" in proc.stdout
    assert "driver (rollout workers, buffer, sandbox callers): cores" in proc.stdout
    inproc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert "the embedded engine is a thread of the driver" in inproc.stdout


def _parts(recipe):
    """placement.plan takes the sub-configs it reads."""
    return recipe.engines, recipe.learner, recipe.placement
