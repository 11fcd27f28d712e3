"""Rollout routing replay in the torch learner, on engine samples of a tiny Qwen3-MoE / Qwen3.5-MoE (k = 0);
the dense hybrid Qwen3.5 in the learner.

The learner's log-probs of the sampled tokens must be the engine's: fp32 to 1e-4 (the parity bound,
test_moe_parity.py), bf16 within the dense models' measured mismatch (benchmarks/results/mismatch.md:
max |Δ| 0.028-0.032 for tiny Qwen2/Llama/Qwen3, nothing above 0.1; bf16 keeps 8 mantissa bits, so each
rounding moves an activation by up to 2^-9 relative and a few layers of them move a log-prob by a few
1e-2). Replay must hand the recorded experts to the experts, keep the router's gradient, survive
gradient checkpointing, and `rollout/routing_agreement` must count what it says.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agent_rl.config import Recipe
from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.learners import build as build_learner
from agent_rl.learners.routing_replay import RouteBatch, RoutingReplay, routers_of
from agent_rl.types import Group, Trajectory

FP32_TOLERANCE = 1e-4
BF16_DENSE_ENVELOPE = 0.1  # no dense tiny model's bf16 token mismatch reached it (max 0.032)
PROMPTS = [[11, 873, 42, 1999, 7, 3051, 260, 18, 4000, 19], [3, 1500, 2201, 99, 64, 3333]]


def sample_groups(
    model_dir, dtype: str, *, samples: int = 6, tokens: int = 12, routed: bool = True
) -> list[Group]:
    """`samples` engine continuations (T=1) of two prompts, as two groups of trajectories with their routing."""

    async def run():
        eng = EmbeddedEngine(model_dir, EngineOptions(max_batch=samples, max_seq_len=128, dtype=dtype))
        try:
            return await asyncio.gather(
                *(
                    eng.generate(
                        PROMPTS[i % 2],
                        SamplingParams(
                            max_new_tokens=tokens, ignore_eos=True, seed=i, return_routed_experts=True
                        ),
                        request_id=f"r{i}",
                    )
                    for i in range(samples)
                )
            )
        finally:
            await eng.close()

    groups: dict[int, list[Trajectory]] = {0: [], 1: []}
    for i, g in enumerate(asyncio.run(run())):
        t = Trajectory(
            uid=f"t{i}", group_id=f"g{i % 2}", prompt_ids=list(PROMPTS[i % 2]), reward=float(i % 3 == 0)
        )
        t.append_sampled(g.token_ids, g.logprobs, g.versions)
        t.set_routed_experts(g.routed_experts)
        if routed:
            assert t.routed_experts is not None and t.routed_experts.positions == len(t) - 1
        else:
            assert t.routed_experts is None
        groups[i % 2].append(t)
    return [Group(f"g{k}", v) for k, v in groups.items()]


def learner_for(model_dir, dtype: str, replay: str, **learner):
    recipe = Recipe.model_validate(
        {
            "name": "replay", "model": {"path": str(model_dir), "dtype": dtype}, "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 1, "batch_prompts": 2},
            "learner": {"lr": 1e-6, "dtype": dtype, "micro_batch_size": 8, **learner},
            "algorithm": {"opob_mode": "proxy", "routing_replay": replay},
        }
    )  # fmt: skip
    return build_learner(recipe.learner_spec)


def step(model_dir, dtype: str, replay: str, groups: list[Group]) -> dict[str, float]:
    learner = learner_for(model_dir, dtype, replay)
    try:
        return dict(learner.step(groups))
    finally:
        learner.close()


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_replayed_learner_logprobs_equal_the_engines_fp32(arch, sparse_dir):
    model_dir = sparse_dir(arch)
    m = step(model_dir, "float32", "rollout", sample_groups(model_dir, "float32"))
    assert m["rollout/logprob_mismatch_tokens"] == 6 * 12
    assert m["rollout/logprob_mismatch_max"] <= FP32_TOLERANCE, m
    assert m["rollout/routing_agreement"] == 1.0  # fp32: the learner's own routing is the engine's too
    assert torch.isfinite(torch.tensor(m["learner/moe_aux_loss"]))


def test_replayed_learner_logprobs_equal_the_engines_bf16(sparse_dir):
    model_dir = sparse_dir("qwen3_moe")
    m = step(model_dir, "bfloat16", "rollout", sample_groups(model_dir, "bfloat16"))
    assert m["rollout/logprob_mismatch_max"] <= BF16_DENSE_ENVELOPE, m
    assert 0.0 < m["rollout/routing_agreement"] <= 1.0


def test_torch_learner_on_a_dense_hybrid_model_equals_the_engine_fp32(sparse_dir):
    """Qwen3.5 (Gated DeltaNet + gated attention, dense MLPs) in the torch learner: rows of two lengths (right
    padding after a recurrent layer's real tokens), no routing to replay or measure."""
    model_dir = sparse_dir("qwen3_5")
    m = step(model_dir, "float32", "off", sample_groups(model_dir, "float32", routed=False))
    assert m["rollout/logprob_mismatch_tokens"] == 6 * 12
    assert m["rollout/logprob_mismatch_max"] <= FP32_TOLERANCE, m
    assert "rollout/routing_agreement" not in m and "learner/moe_aux_loss" not in m


def test_routing_agreement_counts_token_layer_pairs(sparse_dir):
    """Without replay: recorded experts of the first sparse layer replaced by others on every token -> that
    layer never agrees, the other sparse layer (its experts listed in reverse order) always does (fp32):
    agreement 1/2; the log-probs stay the learner's own (the recorded experts are not used)."""
    model_dir = sparse_dir("qwen3_moe")  # sparse layers 0 and 2 (layer 1 is dense)
    groups = sample_groups(model_dir, "float32")
    k = 2
    for g in groups:
        for t in g.trajectories:
            ids = torch.tensor(t.routed_experts.ids).view(-1, 3, k)
            ids[:, 0] = (ids[:, 0] + 1) % 8  # a shifted pair is never the same set ({a, b} -> {a+1, b+1})
            same = (ids[:, 0].sort(-1).values == (ids[:, 0] - 1).remainder(8).sort(-1).values).all(-1)
            assert not bool(same.any())
            # the other sparse layer's experts in another order: still the same set
            ids[:, 2] = ids[:, 2].flip(-1)
            t.routed_experts = type(t.routed_experts).from_ints(ids.flatten().tolist(), 3 * k)
    m = step(model_dir, "float32", "off", groups)
    assert m["rollout/routing_agreement"] == 0.5
    assert m["rollout/logprob_mismatch_max"] <= FP32_TOLERANCE


def _forward_backward(model, replay: RoutingReplay, ids: torch.Tensor, routes: torch.Tensor) -> None:
    """As a learner step does: forward inside the rows' context, backward after it, both inside the step's."""
    am = torch.ones_like(ids)
    batch = RouteBatch(routes.view(*ids.shape, -1), torch.ones(ids.shape, dtype=torch.bool))
    with replay.step(ids, am, batch):
        with replay.rows(ids, am):
            logits = model(ids).logits
        logits.logsumexp(-1).sum().backward()


def test_replay_feeds_the_recorded_experts_and_trains_the_router(sparse_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sparse_dir("qwen3_moe"), dtype=torch.float32)
    replay = RoutingReplay.attach(model, replay=True)
    ids = torch.tensor([PROMPTS[0]])
    gen = torch.Generator().manual_seed(0)
    routes = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(ids.shape[1] * 3)]).view(
        1, -1, 3, 2
    )
    seen: dict[int, torch.Tensor] = {}
    for layer in routers_of(model):
        experts = model.model.layers[layer].mlp.experts
        experts.register_forward_pre_hook(lambda m, a, layer=layer: seen.__setitem__(layer, a[1].clone()))
    _forward_backward(model, replay, ids, routes.to(torch.int16))
    for layer in (0, 2):
        assert torch.equal(seen[layer], routes[0, :, layer].long()), layer
    for layer, router in routers_of(model).items():
        assert router.weight.grad is not None and float(router.weight.grad.abs().sum()) > 0, layer


def test_replay_under_gradient_checkpointing_gives_the_same_gradients(sparse_dir):
    """The checkpointed layers are re-run in backward, outside the replay context: they must replay too."""
    from transformers import AutoModelForCausalLM

    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(sparse_dir("qwen3_moe"), dtype=torch.float32)
        if checkpointing:
            model.activation_checkpointing_enable()
        model.train()
        replay = RoutingReplay.attach(model, replay=True)
        ids = torch.tensor([PROMPTS[0]])
        gen = torch.Generator().manual_seed(1)
        routes = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(ids.shape[1] * 3)])
        _forward_backward(model, replay, ids, routes.to(torch.int16))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-5)
