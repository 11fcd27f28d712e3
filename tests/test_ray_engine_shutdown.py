"""Engine replicas placed as Ray actors (a joined cluster, here a local Ray) shut down in order and quietly:
no exception at exit from the actor class, no engine marked dead, no unclosed HTTP session."""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path

import pytest

from agent_rl import auth, hosts, placement
from agent_rl.config import load_recipe
from agent_rl.engines.api import SamplingParams
from agent_rl.loop_thread import LoopThread

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_two_ray_engine_actors_generate_and_close_quietly(tiny_model_dir, monkeypatch, caplog):
    ray = pytest.importorskip("ray")
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # a private local instance: without address="local", ray.init joins the cluster a dead `ray start` left
    # in Ray's temp dir (and then refuses num_cpus)
    ray.init(
        address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        recipe = load_recipe(
            ROOT / "recipes" / "tiny_tir_smoke.yaml",
            [
                f"model.path={tiny_model_dir}",
                "engines.count=2",
                "engines.max_batch=4",
                "engines.max_seq_len=128",
            ],
        )
        plan = placement.plan(recipe.engines, recipe.learner, recipe.placement, "auto")
        assert plan.needs_ray and placement.apply(plan)  # Ray is up: apply joins it
        loop = LoopThread()
        # the run's key, as `agent-rl train` holds it: where Ray's node address is one other machines reach, a
        # server bound there refuses to start without a key (run alone, this test failed so without it)
        with auth.run_access(None), caplog.at_level(logging.WARNING):
            engines = loop.call(hosts.start_engines(plan, recipe.engines, recipe.model, seed=0))
            assert len(engines.handles) == 2
            gen = loop.call(
                engines.client.generate([5, 6, 7], SamplingParams(max_new_tokens=4), request_id="r")
            )
            assert len(gen.token_ids) == 4
            loop.call(engines.close())
            loop.close()
            del engines
            gc.collect()
        assert not [
            r for r in caplog.records if "marked dead" in r.getMessage() or "Unclosed" in r.getMessage()
        ]
    finally:
        ray.shutdown()
    gc.collect()
    assert not unraisable, [getattr(u, "exc_value", u) for u in unraisable]
