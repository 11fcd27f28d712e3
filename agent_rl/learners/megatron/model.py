"""Megatron-core GPTModel built from a Hugging Face config's shape, for TP / SP / CP.

Two layer specs: Transformer Engine's (GPUs where TE is installed, the first choice; norms
fused into the following linear, TE's flash / cuDNN attention for packed THD sequences and
context parallelism) and megatron's local spec (CPU, and GPUs without TE) with
`cpu_compat.SequenceParallelRMSNorm` and `attention.SDPAttention`: torch's fused attention,
O(S) memory, packed sequences and context parallelism too. `uses_te_spec` tells the weight
converter which parameter names to expect; `attention_backend` names the attention in use.

The model is `gpt.HiddenStatesGPTModel`: its forward returns the final norm's output, and
`linear_logprobs` applies the output layer chunk by chunk. Parameters are in `dtype`
(bfloat16: megatron's bf16 training, fp32 main copies in `mixed_precision.MainParams`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent_rl.learners.megatron.shape import ModelShape


@dataclass(frozen=True)
class ParallelConfig:
    """The model-parallel layout of one learner rank; dp is whatever the world size leaves."""

    tp: int = 1
    sp: bool = False
    cp: int = 1

    def __post_init__(self) -> None:
        if self.sp and self.tp < 2:
            raise ValueError("sequence parallelism shards over tensor-parallel ranks: set tp >= 2")

    @property
    def seq_multiple(self) -> int:
        """Sequence lengths are padded to this: SP splits the sequence over tp, CP into 2*cp load-balanced chunks."""
        return (self.tp if self.sp else 1) * (2 * self.cp if self.cp > 1 else 1)


@dataclass(frozen=True)
class Recompute:
    """Activation recompute, as megatron-core's TransformerConfig takes it (learner.gradient_checkpointing)."""

    granularity: str | None = None  # None | "full" | "selective"
    method: str | None = None  # full: "uniform" | "block"
    num_layers: int | None = None  # full: layers per recomputed chunk (uniform) or recomputed layers (block)
    modules: tuple[str, ...] = ("core_attn",)  # selective: the submodules recomputed

    @classmethod
    def of(cls, lc) -> Recompute:  # a LearnerConfig (config.py stays free of megatron)
        gc = lc.gradient_checkpointing
        if gc in (True, "full"):
            return cls("full", lc.recompute_method, lc.recompute_num_layers)
        if gc == "selective":
            return cls("selective", modules=tuple(lc.recompute_modules))
        return cls()

    def config(self, layers: int) -> dict:
        """TransformerConfig fields; num_layers is capped at the model's layer count."""
        if self.granularity is None:
            return {}
        if self.granularity == "selective":
            return {"recompute_granularity": "selective", "recompute_modules": list(self.modules)}
        n = min(self.num_layers or 1, layers)
        return {"recompute_granularity": "full", "recompute_method": self.method, "recompute_num_layers": n}


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def transformer_config(
    shape: ModelShape,
    par: ParallelConfig,
    *,
    dtype: torch.dtype,
    cpu: bool,
    recompute: Recompute = Recompute(),
):
    """Megatron TransformerConfig reproducing the HF decoder exactly: no dropout, no fusions that change numerics;
    activations recomputed in the backward pass as `recompute` says (same gradients, less memory)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    from agent_rl.learners.megatron.moe import moe_config

    return TransformerConfig(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        # Fusions are numerically equivalent but CUDA-only; they stay off on CPU.
        bias_activation_fusion=not cpu,
        bias_dropout_fusion=not cpu,
        apply_rope_fusion=False,
        masked_softmax_fusion=not cpu,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=par.tp,
        sequence_parallel=par.sp,
        context_parallel_size=par.cp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=cpu,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint right after
        **recompute.config(shape.layers),
        **(moe_config(shape.moe) if shape.moe is not None else {}),
    )


def build_gpt_model(
    shape: ModelShape,
    par: ParallelConfig,
    *,
    dtype: torch.dtype = torch.float32,
    cpu: bool,
    recompute: Recompute = Recompute(),
):
    """This rank's GPTModel shard (untrained: load weights with convert.load_hf_into_megatron)."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from agent_rl.learners.megatron.gpt import HiddenStatesGPTModel
    from agent_rl.learners.megatron.host_bounds import read_rope_bounds_on_host

    shape.check_tp(par.tp)
    config = transformer_config(shape, par, dtype=dtype, cpu=cpu, recompute=recompute)
    if uses_te_spec(cpu, moe=shape.moe is not None):
        from megatron.core.extensions.transformer_engine import TENorm
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        layers, final_norm = [get_gpt_layer_with_transformer_engine_spec()] * shape.layers, TENorm
    else:
        from agent_rl.learners.megatron.cpu_compat import SequenceParallelRMSNorm

        sparse = shape.moe.sparse if shape.moe is not None else (False,) * shape.layers
        if any(sparse):
            from agent_rl.learners.megatron.moe import patch_missing_te_names

            patch_missing_te_names()
        experts = shape.moe.experts if shape.moe is not None else None
        layers = [_local_layer(shape, experts if s else None) for s in sparse]
        final_norm = SequenceParallelRMSNorm
    block = TransformerBlockSubmodules(layer_specs=layers, layer_norm=final_norm)
    read_rope_bounds_on_host()  # packed sequences' RoPE reads cu_seqlens from their host copy (host_bounds.py)
    theta = int(shape.rope_theta) if float(shape.rope_theta).is_integer() else shape.rope_theta
    model = HiddenStatesGPTModel(
        config,
        block,
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_positions,
        pre_process=True,
        post_process=True,
        parallel_output=True,  # the output weight stays vocab-sharded (linear_logprobs)
        share_embeddings_and_output_weights=shape.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=theta,
    )
    if shape.qk_norm and par.tp > 1:  # each TP rank normalises its own heads: sum the q/k norm grads over TP
        for name, p in model.named_parameters():
            if name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                p.sequence_parallel = True  # the tag grads.finish_backward sums over TP
    if cpu:
        from agent_rl.learners.megatron.cpu_compat import keep_rotary_on_cpu

        keep_rotary_on_cpu(model)
    return model if cpu else model.cuda()


def _local_layer(shape: ModelShape, experts: int | None):
    """megatron's local layer spec with torch SDPA and our RMSNorm; `experts`: megatron's MoE layer as the MLP
    (router, allgather token dispatcher, SequentialMLP: plain torch)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from agent_rl.learners.megatron.attention import SDPAttention
    from agent_rl.learners.megatron.cpu_compat import SequenceParallelRMSNorm

    layer = get_gpt_layer_local_spec(
        num_experts=experts, moe_grouped_gemm=False, normalization="RMSNorm", qk_layernorm=shape.qk_norm
    )
    layer.submodules.input_layernorm = SequenceParallelRMSNorm
    layer.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    attn = layer.submodules.self_attention.submodules
    attn.core_attention = SDPAttention  # megatron's DotProductAttention keeps [heads, s, s] scores
    if shape.qk_norm:
        attn.q_layernorm = attn.k_layernorm = SequenceParallelRMSNorm
    return layer


def freeze_padding_row(model: torch.nn.Module, shape: ModelShape, *, tp_rank: int) -> None:
    """No gradient into the pad token's embedding row through the lookup, as HF's nn.Embedding(padding_idx) does.

    The embedding output's gradient is zeroed where the input is the pad id (its only path back is
    that row), so a tied output layer still trains the row, exactly like the HF model. Without this
    the two learners' updates and per-trajectory gradient norms differ whenever the pad id occurs.
    """
    pad = shape.pad_token_id
    if pad is None:
        return

    def forward_hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if not output.requires_grad:
            return
        keep = args[0] != pad  # [b, s]
        if output.shape[:2] != keep.shape:  # SP: reduce-scattered to this rank's [s / tp, b, h]
            n = output.shape[0]
            keep = keep.t()[tp_rank * n : (tp_rank + 1) * n]
        mask = keep[..., None].to(output.dtype)
        output.register_hook(lambda grad: grad * mask)

    model.embedding.word_embeddings.register_forward_hook(forward_hook)


def uses_te_spec(cpu: bool, *, moe: bool = False) -> bool:
    """GPUs use Transformer Engine layers when TE is installed; the CPU path always uses the local spec, and so do
    MoE models (megatron's local MoE layer is the one tested; TE's grouped-GEMM experts are not wired in)."""
    return not cpu and not moe and have_transformer_engine()


def attention_backend(cpu: bool, *, moe: bool = False) -> str:
    """The attention the model runs: Transformer Engine's where it is used, else torch SDPA (attention.py)."""
    return "transformer_engine" if uses_te_spec(cpu, moe=moe) else "torch_sdpa"
