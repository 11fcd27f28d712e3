"""HF <-> Megatron weight conversion: pure tensor functions, no megatron-core needed."""

from __future__ import annotations

import pytest
import torch

from agent_rl.learners.megatron.convert import hf_to_megatron, megatron_to_hf
from agent_rl.learners.megatron.shape import shape_from_hf_config
from agent_rl.tools.tiny import build_model


def _llama(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=tie,
    )  # fmt: skip
    torch.manual_seed(1)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("te", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda: build_model(256, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128),
        lambda: build_model(
            256, hidden=64, layers=2, heads=8, kv_heads=4, intermediate=128, tie_embeddings=True
        ),
        lambda: _llama(False),
        lambda: _llama(True),
    ],
    ids=["qwen2", "qwen2-tied", "llama", "llama-tied"],
)
def test_hf_to_megatron_to_hf_round_trip_is_exact(make, tp, te):
    model = make()
    shape = shape_from_hf_config(model.config)
    if shape.kv_heads % tp:
        pytest.skip(f"{shape.kv_heads} KV heads do not split over tp={tp}")
    hf = model.state_dict()
    shards = [hf_to_megatron(hf, shape, tp_rank=r, tp_size=tp, te=te) for r in range(tp)]
    back = megatron_to_hf(shards, shape, te=te)
    assert set(back) == set(hf)
    for k, v in hf.items():
        assert torch.equal(back[k], v), k


def test_tp_shards_split_kv_groups_and_swiglu_halves():
    """Rank r's linear_qkv holds whole KV groups [q heads; k; v] and linear_fc1 holds [gate_r; up_r]."""
    model = build_model(256, hidden=64, layers=1, heads=4, kv_heads=2, intermediate=128)
    s = shape_from_hf_config(model.config)
    hf = model.state_dict()
    d, a = s.head_dim, "model.layers.0.self_attn"
    r1 = hf_to_megatron(hf, s, tp_rank=1, tp_size=2, te=False)
    qkv = r1["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert torch.equal(qkv[: 2 * d], hf[f"{a}.q_proj.weight"][2 * d : 4 * d])  # group 1: query heads 2, 3
    assert torch.equal(qkv[2 * d : 3 * d], hf[f"{a}.k_proj.weight"][d : 2 * d])
    assert torch.equal(qkv[3 * d :], hf[f"{a}.v_proj.weight"][d : 2 * d])
    fc1 = r1["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:64], hf["model.layers.0.mlp.gate_proj.weight"][64:])
    assert torch.equal(fc1[64:], hf["model.layers.0.mlp.up_proj.weight"][64:])


def test_unsplittable_tp_is_refused_with_the_field_name():
    model = build_model(251, hidden=64, layers=1, heads=4, kv_heads=2, intermediate=128)
    s = shape_from_hf_config(model.config)
    with pytest.raises(ValueError, match="vocab_size=251"):
        hf_to_megatron(model.state_dict(), s, tp_rank=0, tp_size=2, te=False)


def test_unsupported_architecture_is_refused_naming_the_field():
    model = build_model(256, hidden=64, layers=1, heads=4, kv_heads=2)
    model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        shape_from_hf_config(model.config)
