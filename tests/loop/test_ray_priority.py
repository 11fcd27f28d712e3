"""Processes Ray hosts for a run (engine replicas, learner ranks) run at the driver's priority.

Ray starts its workers at nice 15 unless told otherwise: beside two CPU burners (the suite's load test) a
fresh clone's Ray-hosted engine servers and learner ranks took minutes to start. `placement.apply`'s private
local Ray instance runs its workers at nice 0. Fails if that setting is removed (workers report 15).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from loop_paths import ROOT

PROBE = """
import json, os, sys
from agent_rl import placement
from agent_rl.config import load_recipe
recipe = load_recipe(sys.argv[1], [f"model.path={sys.argv[2]}", f"logging.run_dir={sys.argv[3]}", "placement.sandbox={cpus: 1}"])
plan = placement.plan(recipe.engines, recipe.learner, recipe.placement)
assert plan.needs_ray and plan.address is None, plan.reason
placement.apply(plan)
import ray
worker = ray.get(ray.remote(num_cpus=0)(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote())
print(json.dumps({"driver": os.getpriority(os.PRIO_PROCESS, 0), "worker": worker}))
ray.shutdown()
"""


def test_ray_workers_of_a_local_instance_run_at_the_drivers_priority(tiny_model_dir, tmp_path) -> None:
    # the product's default, not one this shell exported
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "recipes" / "tiny_tir_smoke.yaml"), str(tiny_model_dir),
         str(tmp_path / "run")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["worker"] == got["driver"], got
