"""LoRA through the whole loop (embedded engine, k=0): every push reaches the engine, whose log-probs then
equal the learner's on every trained token (the logged mismatch). A publisher that drops the adapter (the
peers' trap, verl#7495: async LoRA training that never synced the adapter) is caught by the same metric."""

from __future__ import annotations

import math

import pytest
from float_bounds import TINY_LOGPROB_ATOL, sum_atol
from loop_paths import DENSE_ENV

from agent_rl import checkpoint
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.metrics import read_metrics
from agent_rl.trainer import train
from agent_rl.weights.adapters import Adapter

LORA = (  # the dense reward gives every group a spread of rewards, so every step moves the adapter
    "learner.lora={rank: 4, alpha: 16}", "learner.lr=5e-3", "buffer.max_staleness=0", "train.steps=4",
    f"envs.train={DENSE_ENV}",
)  # fmt: skip
# A trajectory's importance weight at k=0 is exp(Σ_t log π − log μ) over at most 512 tokens (engines.max_seq_len),
# each term rounding alone: |w − 1| <= exp(sum_atol(512)) − 1 (tests/float_bounds.py).
IS_WEIGHT_ATOL = math.expm1(sum_atol(512))


def test_lora_run_engine_logprobs_equal_the_learners_after_every_push(smoke_recipe) -> None:
    run_dir = train(smoke_recipe(*LORA))
    records = read_metrics(run_dir)
    assert len(records) == 4
    for r in records:  # k=0: every trained token was sampled by the version the learner held
        assert r["rollout/logprob_mismatch_tokens"] > 0
        assert r["rollout/logprob_mismatch_max"] <= TINY_LOGPROB_ATOL, r["step"]  # rounding alone
        assert r["vcpo/is_weight_max"] == pytest.approx(1.0, abs=IS_WEIGHT_ATOL)
        assert 0 < r["weights/push_mib"] < 0.5  # the adapter alone (the full model is ~10 MiB)
    adapter = Adapter.load(checkpoint.latest(run_dir) / "hf_adapter")
    assert any(float(t.abs().max()) > 0 for n, t in adapter.tensors.items() if "lora_B" in n)  # it trained


def test_a_publisher_that_drops_the_adapter_shows_as_mismatch(smoke_recipe, monkeypatch) -> None:
    async def stamp_only(self, *, version, adapter=None, path=None, name=""):  # new version, old weights
        await self.call(lambda: self.scheduler.weights_changed(version))

    monkeypatch.setattr(EmbeddedEngine, "load_adapter", stamp_only)
    records = read_metrics(train(smoke_recipe(*LORA)))
    assert (
        records[0]["rollout/logprob_mismatch_max"] <= TINY_LOGPROB_ATOL
    )  # version 0: base weights on both sides
    assert (
        max(r["rollout/logprob_mismatch_max"] for r in records[1:]) > TINY_LOGPROB_ATOL
    )  # more than rounding


def test_lora_in_the_production_topology_ships_adapters_by_disk(smoke_recipe) -> None:
    """Engine server and learner in processes of their own: the adapter goes as a PEFT directory through
    /load_lora_adapter + /update_weight_version, and the served log-probs still equal the learner's."""
    recipe = smoke_recipe(*LORA, "placement.topology=processes", "engines.weight_sync=disk", "train.steps=3")
    records = read_metrics(train(recipe))
    assert len(records) == 3
    for r in records:
        assert (
            r["rollout/logprob_mismatch_tokens"] > 0
            and r["rollout/logprob_mismatch_max"] <= TINY_LOGPROB_ATOL
        ), r
