"""Qwen3-MoE in the Megatron learner (megatron-core's MoE layer, tp = ep = 1, CPU over gloo) and routing replay in it.

Engine samples of a tiny random Qwen3-MoE (tests/formats/sparse_models.py: 3 layers, the middle one dense, top-2
of 8 experts, norm_topk_prob) with the engine's routing, edited as in test_moe_replay.py: layer 0's recorded
experts shifted to a pair the router never picks, layer 2's listed in reverse order (the same set). One step of
the Megatron rank and of the torch learner's rank (transformers' model, its router hooks) on the same batch and
routing must give the same gradient and log-probs, replay off and on; replay changes the log-probs (layer 0 then
runs other experts) and still trains the router through the chosen gates; agreement and the load-balancing loss
are counted alike. Gradients, not weights after Adam, are compared (test_equivalence.py says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _helpers import recipe, requires_megatron, run_rank_steps

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "formats")
)  # the MoE checkpoints and engine samples
from sparse_models import sparse_model  # noqa: E402
from test_moe_replay import BF16_DENSE_ENVELOPE, sample_groups  # noqa: E402

from agent_rl.batch import collate, split_groups  # noqa: E402
from agent_rl.learners.routing_replay import route_batch  # noqa: E402

pytestmark = requires_megatron

FP32_EPS = 2.0**-23
TOKENS = 6 * (10 + 12)
"""Upper bound on the batch's tokens: 6 engine samples of 12 tokens after prompts of <= 10 (sample_groups)."""
GRAD_RTOL = TOKENS * FP32_EPS
"""‖g_megatron − g_torch‖ <= TOKENS · FP32_EPS · ‖g_torch‖ per tensor: a weight gradient sums <= TOKENS per-token terms
in another order (megatron permutes tokens by expert, transformers loops over experts); first-order bound of that
sum's rounding, as test_equivalence.GRAD_RTOL. Both route in fp32 from the same weights, so they pick the same
experts (a top-k near-tie within a few ulps would break this; test_moe_replay.py asserts agreement 1.0 likewise)."""
LOGPROB_ATOL = 1e-4
"""fp32 log-probs of two implementations of the same network: the engine-vs-transformers parity bound of
tests/formats (~800 fp32 ulps of a log-prob of magnitude ~10: a 4096-way log-softmax after three layers)."""
REPLAY_EFFECT = 100 * LOGPROB_ATOL
"""Replaying layer 0 on other experts must move some log-prob far beyond the implementations' difference."""
METRIC_RTOL = 2e-4
"""The load-balancing loss: sums over <= TOKENS tokens of softmax terms, as test_equivalence.METRIC_RTOL."""

CASES = {  # (learner layout, algorithm, norm_topk_prob)
    "off": ({}, {"routing_replay": "off"}, True),
    "rollout": ({}, {"routing_replay": "rollout"}, True),
    # right-padded rows [S, B] (megatron's seq-major token order) several to a forward: micro-batched PPO-clip
    "rollout-padded-ppo": (
        {"pack_sequences": False, "micro_batch_size": 6},
        {"routing_replay": "rollout", "loss": "ppo_clip", "advantage": "grpo"},
        True,
    ),
    "rollout-recompute": (
        {"gradient_checkpointing": True},
        {"routing_replay": "rollout"},
        True,
    ),  # layers re-run
    "rollout-dp2": ({"dp": 2}, {"routing_replay": "rollout"}, True),  # one group per DP rank
    "rollout-unnormalised": ({}, {"routing_replay": "rollout"}, False),  # softmax over all experts, no renorm
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return sparse_model("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


@pytest.fixture(scope="module")
def unnormalised_dir(moe_dir, tmp_path_factory):
    """The same weights with norm_topk_prob false (megatron: moe_router_pre_softmax)."""
    import json
    import shutil

    out = tmp_path_factory.mktemp("qwen3_moe_unnormalised") / "model"
    shutil.copytree(moe_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["norm_topk_prob"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def edited_routes(groups) -> None:
    """Layer 0's recorded experts shifted ({a, b} -> {a+1, b+1}: never the router's set), layer 2's reversed."""
    for g in groups:
        for t in g.trajectories:
            ids = torch.tensor(t.routed_experts.ids).view(-1, 3, 2)
            ids[:, 0] = (ids[:, 0] + 1) % 8
            ids[:, 2] = ids[:, 2].flip(-1)
            t.routed_experts = type(t.routed_experts).from_ints(ids.flatten().tolist(), 3 * 2)


@pytest.fixture(scope="module")
def groups(moe_dir):
    gs = sample_groups(moe_dir, "float32")
    edited_routes(gs)
    return gs


def _routes(b):
    return route_batch(b.routed_experts, b.policy.loss_mask, b.versions, 0)


@pytest.fixture(scope="module")
def records(moe_dir, unnormalised_dir, groups, tmp_path_factory):
    """case -> (megatron record of global rank 0, torch learner record on the whole batch). The cases of one DP size
    share one launch of their rank processes (rank_step_worker builds each case's rank in turn, on the same shares
    and routes): one launch for the five DP=1 cases instead of five."""
    from agent_rl.learners.megatron import megatron_spec

    by_dp: dict[int, dict] = {}
    for name, (layout, algorithm, norm) in CASES.items():
        model = moe_dir if norm else unnormalised_dir
        spec = megatron_spec(recipe(model, algorithm, backend="megatron", **layout).learner_spec)
        by_dp.setdefault(spec.dp, {})[name] = spec
    out = {}
    whole = collate(groups)
    for dp, specs in by_dp.items():
        shares = [collate(s) for s in split_groups(groups, dp)]
        got = run_rank_steps(
            specs,
            [s.policy for s in shares],
            tmp_path_factory.mktemp(f"dp{dp}"),
            routes=[_routes(s) for s in shares],
        )
        for name, spec in specs.items():
            out[name] = (got[name], torch_rank_step(spec.rank, whole.policy, _routes(whole)))
    return out


def torch_rank_step(rank_spec, batch, routes) -> dict:
    """The torch learner's rank (transformers' model, its routing replay hooks) on the whole batch: the same record."""
    from agent_rl.learners._torch_rank import TorchRank

    learner = TorchRank(rank_spec)
    captured: dict = {}

    def capture(*_unused) -> None:
        captured["grads"] = {n: p.grad.clone() for n, p in learner.model.named_parameters()}

    learner.optimizer.register_step_pre_hook(capture)
    metrics = learner.step(batch, routes)
    return {"metrics": metrics, "grads": captured["grads"], "logprobs": learner.last_rows().logprobs}


def test_hf_megatron_hf_round_trip_is_exact(moe_dir):
    """The converter alone: fused experts [E, 2I, H] / [E, H, I] and the router to megatron's per-expert MLPs and back."""
    from transformers import AutoModelForCausalLM

    from agent_rl.learners.megatron.convert import hf_to_megatron, megatron_to_hf
    from agent_rl.learners.megatron.shape import shape_from_hf_config

    hf_model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    hf = hf_model.state_dict()
    shape = shape_from_hf_config(hf_model.config)
    assert shape.moe is not None and shape.moe.sparse == (True, False, True) and shape.qk_norm
    mg = hf_to_megatron(hf, shape, tp_rank=0, tp_size=1, te=False)
    assert mg["decoder.layers.0.mlp.experts.local_experts.7.linear_fc1.weight"].shape == (64, 64)
    assert "decoder.layers.1.mlp.linear_fc1.weight" in mg  # the dense layer stays megatron's MLP
    back = megatron_to_hf([mg], shape, te=False)
    assert set(back) == set(hf) and all(torch.equal(back[k], v) for k, v in hf.items())


def test_live_megatron_model_hands_back_the_hf_weights_exactly(moe_dir, records):
    """HF -> the built MoE GPTModel (every parameter covered) -> gathered HF weights: bit for bit."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).state_dict()
    before = records["off"][0]["before"]
    assert set(before) == set(hf) and all(torch.equal(before[k], v) for k, v in hf.items())


@pytest.mark.parametrize("case", list(CASES))
def test_moe_step_gradient_equals_the_torch_learners(records, case):
    got, ref = records[case]
    assert set(got["grads"]) == set(ref["grads"])
    assert (
        float(ref["grads"]["model.layers.0.mlp.gate.weight"].norm()) > 0
    )  # the router trains, replayed or not
    for name, g in ref["grads"].items():
        err = float((got["grads"][name] - g).norm()) / max(float(g.norm()), 1e-30)
        assert err <= GRAD_RTOL or float(g.norm()) == 0.0, f"{case} {name}: relative gradient error {err:.3g}"


@pytest.mark.parametrize("case", [c for c in CASES if "dp2" not in c])
def test_moe_logprobs_equal_the_torch_learners(records, groups, case):
    """The current log-probs of every real token (RowResults; padding holds no log-prob): the Megatron model's equal
    transformers' forward."""
    got, ref = records[case]
    real = collate(groups).policy.attention_mask.bool()
    torch.testing.assert_close(got["logprobs"][real], ref["logprobs"][real], rtol=0.0, atol=LOGPROB_ATOL)


def test_replay_runs_the_recorded_experts(records):
    """Replay on layer 0's shifted experts changes the log-probs (in both learners alike: the test above) by far more
    than the two implementations differ; without replay they are the router's own (equal to the torch learner's)."""
    off, on = records["off"][0]["logprobs"], records["rollout"][0]["logprobs"]
    assert float((off - on).abs().max()) > REPLAY_EFFECT


@pytest.mark.parametrize("case", [c for c in CASES if "dp2" not in c])
def test_routing_agreement_and_aux_loss_are_counted_as_in_the_torch_learner(records, case):
    """Agreement is of the router's own top-k with the record. Replay off: layer 0 never agrees, layer 2 always does,
    1/2 of the (token, MoE layer) pairs. Replay on: layer 2's input comes from layer 0's replayed experts, so its own
    choice moves too; whatever the count, the torch learner's is the same. The load-balancing loss of the routing in
    use equals the torch learner's."""
    from agent_rl.learners.routing_replay import routing_metrics

    got, ref = (routing_metrics([r["metrics"]]) for r in records[case])
    assert got["rollout/routing_agreement"] == ref["rollout/routing_agreement"]
    if case == "off":
        assert got["rollout/routing_agreement"] == 0.5
    # (token, MoE layer) pairs: 2 sparse layers x 6 samples x 11 recorded sampled tokens (the last is never fed)
    assert got["rollout/routing_agreement_tokens"] == ref["rollout/routing_agreement_tokens"] == 2 * 6 * 11
    assert got["learner/moe_aux_loss"] == pytest.approx(ref["learner/moe_aux_loss"], rel=METRIC_RTOL)


def test_megatron_learner_replays_the_engines_routing_through_the_facade(moe_dir, tmp_path):
    """`learner.backend: megatron` with routing replay, built as `agent-rl train` builds it (rank processes), one
    step on engine samples with the engine's own routing: the learner's log-probs are the engine's at k = 0 (fp32
    parity bound), its router agrees with the engine's everywhere (fp32, same weights), and the routing metrics
    reach the step's metrics. A checkpoint (fused experts under HF names) loads back to the same weights."""
    from agent_rl.learners import build

    learner = build(
        recipe(moe_dir, {"routing_replay": "rollout"}, backend="megatron").learner_spec, pool="processes"
    )
    try:
        m = dict(learner.step(sample_groups(moe_dir, "float32")))
        weights = learner.hf_state_dict()
        learner.save(tmp_path)
        learner.load(tmp_path)
        loaded = learner.hf_state_dict()
    finally:
        learner.close()
    assert m["rollout/logprob_mismatch_tokens"] == 6 * 12
    assert m["rollout/logprob_mismatch_max"] <= LOGPROB_ATOL, m
    assert m["rollout/routing_agreement"] == 1.0
    assert m["learner/moe_aux_loss"] > 0
    assert "model.layers.0.mlp.experts.gate_up_proj" in weights
    assert set(loaded) == set(weights) and all(torch.equal(loaded[k], v) for k, v in weights.items())


def test_megatron_learner_in_bf16_stays_within_the_dense_bf16_mismatch(moe_dir):
    """bf16 (bf16 model, fp32 main weights) engine and Megatron learner with replay: the learner's log-probs of the
    engine's samples within the envelope the torch learner is held to (test_moe_replay.BF16_DENSE_ENVELOPE: no dense
    tiny model's bf16 token mismatch reached it), and the routing agreement is measured."""
    from agent_rl.learners import build

    rec = recipe(moe_dir, {"routing_replay": "rollout"}, backend="megatron", dtype="bfloat16")
    rec = rec.model_copy(update={"model": rec.model.model_copy(update={"dtype": "bfloat16"})})
    learner = build(rec.learner_spec, pool="processes")
    try:
        m = dict(learner.step(sample_groups(moe_dir, "bfloat16")))
    finally:
        learner.close()
    assert m["rollout/logprob_mismatch_max"] <= BF16_DENSE_ENVELOPE, m
    assert 0.0 < m["rollout/routing_agreement"] <= 1.0
