"""Core attention for megatron's local layer spec over torch's fused attention: O(S) memory, no Transformer Engine.

megatron-core 0.16's local `DotProductAttention` computes the scores with `baddbmm` into a
[b·heads, s, s] buffer, softmaxes and keeps them for backward (59.7 GiB for one 4096-token
trajectory of the 0.5B shape on an H200), repeats K/V to the query heads, and refuses packed
(THD) sequences and context parallelism ("use TEDotProductAttention"). `SDPAttention` takes its
place in the local spec (`model.build_gpt_model`, whenever Transformer Engine is not used):

- rows ([s, b, heads, d], right-padded): one `scaled_dot_product_attention(is_causal=True)`;
- packed sequences (THD, `PackedSeqParams` exactly as Transformer Engine takes them): causal
  attention inside each sequence's span of `cu_seqlens_q_padded`, one call per sequence, so no
  token attends across a sequence boundary;
- context parallelism (THD only: `logprobs.megatron_logprobs` packs whenever cp > 1): every CP
  rank holds chunks r and 2cp−1−r of every sequence (`cp_layout.cp_partition_index`, the load
  balancing of megatron's `get_thd_batch_on_this_cp_rank`). K and V are all-gathered over the CP
  group (megatron's `gather_from_sequence_parallel_region`; backward: reduce-scatter) and each
  local query chunk j attends to the keys [0, (j+1)·c) of its sequence, the causal diagonal
  aligned bottom-right: Transformer Engine's `cp_comm_type="all_gather"` scheme.

Kernels: `sdpa_kernel` admits only the fused ones (flash, memory-efficient, cuDNN on CUDA; the
flash kernel on CPU), so attention never silently falls back to the math path that
materialises [heads, s, s]: a shape no fused kernel takes fails loudly instead. GQA: K/V keep
their num_query_groups heads (`enable_gqa`) where the kernel takes grouped heads natively (CPU
flash; CUDA flash in fp16/bf16); elsewhere (CUDA fp32, the bottom-right causal chunks of CP on
CUDA, or a CUDA build whose fused kernels refuse `enable_gqa`) they are expanded to the query
heads, which costs O(s) memory, not O(s²). The one
O(s²/cp) object: on CPU the bottom-right causal mask of a CP chunk is materialised as a
[c, (j+1)·c] bool tensor (torch's CPU flash kernel only aligns causal masks top-left); CPU CP
exists to test the layout, GPUs use `torch.nn.attention.bias.causal_lower_right`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from agent_rl.learners.megatron.cp_layout import cp_partition_index
from agent_rl.learners.megatron.host_bounds import on_host

_CPU_KERNELS = [SDPBackend.FLASH_ATTENTION]
_CUDA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]


def _kernels(device: torch.device) -> list[SDPBackend]:
    return _CUDA_KERNELS if device.type == "cuda" else _CPU_KERNELS


def _native_gqa(q: Tensor) -> bool:
    """Whether the fused kernel SDPA picks for q takes fewer K/V heads than query heads as they are."""
    return q.device.type == "cpu" or q.dtype in (torch.float16, torch.bfloat16)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, past: int = 0) -> Tensor:
    """[b, hq, lq, d] attention of q over k/v [b, hkv, past + lq, d]: query i sees keys 0 .. past + i.

    past = 0 is ordinary causal attention; past > 0 is a context-parallel chunk whose first
    `past` keys precede it (the causal diagonal aligned bottom-right).
    """
    hq, hkv = q.shape[1], k.shape[1]
    lq, lk = q.shape[2], k.shape[2]
    if lk != past + lq:
        raise ValueError(f"causal_attention: {lk} keys for {lq} queries after {past} earlier keys")
    grouped = hq != hkv
    if grouped and (not _native_gqa(q) or (past > 0 and q.device.type == "cuda")):
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        grouped = False
    try:
        return _sdpa(q, k, v, scale=scale, past=past, grouped=grouped)
    except RuntimeError as e:
        # a CUDA build whose fused kernels take no grouped heads: expand K/V (still O(s)) and try once more
        if not grouped or "No available kernel" not in str(e):
            raise
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        return _sdpa(q, k, v, scale=scale, past=past, grouped=False)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, *, scale: float, past: int, grouped: bool) -> Tensor:
    with sdpa_kernel(_kernels(q.device)):
        if past == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=grouped)
        lq, lk = q.shape[2], k.shape[2]
        if q.device.type == "cuda":
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(lq, lk)
        else:
            mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=past)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=grouped)


class SDPAttention(MegatronModule):
    """megatron core attention (the local spec's `core_attention`) over `scaled_dot_product_attention`.

    Constructed by megatron's SelfAttention with DotProductAttention's arguments; see the module
    docstring for what it computes. Causal only, no dropout, no attention bias.
    """

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ) -> None:
        super().__init__(config=config)
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.transformer.enums import AttnMaskType

        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"SDPAttention is causal; got attn_mask_type {attn_mask_type}")
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError(f"SDPAttention runs without dropout; got attention_dropout={dropout}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        tp = pg_collection.tp.size()
        self.cp_group = pg_collection.cp if config.context_parallel_size > 1 else None
        self.heads = divide(config.num_attention_heads, tp)
        self.kv_heads = divide(config.num_query_groups, tp)
        head_dim = config.kv_channels
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type=None,
        attention_bias: Tensor | None = None,
        packed_seq_params=None,
    ) -> Tensor:
        """sbhd: q [s, b, hq, d], k/v [s, b, hkv, d] -> [s, b, hq·d]; THD: [t, h, d] -> [t, hq·d]."""
        if attention_mask is not None or attention_bias is not None:
            raise ValueError(
                "SDPAttention builds its own causal (and per-sequence) mask: pass attention_mask=None, and "
                "packed_seq_params for packed sequences"
            )
        if packed_seq_params is None:
            if self.cp_group is not None:
                raise ValueError("SDPAttention: context parallelism needs packed (THD) sequences")
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, h, s, d]
            out = causal_attention(q, k, v, scale=self.scale)
            return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(
                f"SDPAttention: packed qkv_format {packed_seq_params.qkv_format!r}; expected 'thd'"
            )
        cu = packed_seq_params.cu_seqlens_q_padded
        if cu is None:
            cu = packed_seq_params.cu_seqlens_q
        bounds = [int(x) for x in on_host(cu).tolist()]  # the host copy packing attached: no wait per layer
        if self.cp_group is None:
            out = self._packed(query, key, value, bounds)
        else:
            out = self._packed_cp(query, key, value, bounds)
        return out.reshape(out.shape[0], -1)

    def _packed(self, q: Tensor, k: Tensor, v: Tensor, bounds: list[int]) -> Tensor:
        """[t, h, d] packed sequences -> [t, hq, d], each sequence on its own."""
        if q.shape[0] != bounds[-1]:
            raise ValueError(f"SDPAttention: {q.shape[0]} packed tokens, cu_seqlens end at {bounds[-1]}")
        outs = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            one = [x[start:end].transpose(0, 1)[None] for x in (q, k, v)]  # [1, h, len, d]
            outs.append(causal_attention(*one, scale=self.scale)[0].transpose(0, 1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def _packed_cp(self, q: Tensor, k: Tensor, v: Tensor, bounds: list[int]) -> Tensor:
        """This CP rank's chunks [t / cp, h, d] -> [t / cp, hq, d], over every rank's K/V of the same sequence."""
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        cp, rank = self.cp_group.size(), self.cp_group.rank()
        local = q.shape[0]
        if local * cp != bounds[-1]:
            raise ValueError(
                f"SDPAttention: {local} tokens on each of {cp} CP ranks, cu_seqlens end at {bounds[-1]}"
            )
        # Every rank's chunks, rank after rank -> the sequences in order (one gather per layer for K and V).
        held = torch.cat([cp_partition_index(bounds, r, cp) for r in range(cp)])
        order = torch.argsort(held).to(q.device)
        k_all, v_all = (
            gather_from_sequence_parallel_region(
                x, tensor_parallel_output_grad=True, group=self.cp_group
            ).index_select(0, order)
            for x in (k, v)
        )
        outs, offset = [], 0
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            chunk = (end - start) // (2 * cp)
            for j in (rank, 2 * cp - 1 - rank):
                qj = q[offset : offset + chunk].transpose(0, 1)[None]
                kj, vj = (x[start : start + (j + 1) * chunk].transpose(0, 1)[None] for x in (k_all, v_all))
                outs.append(causal_attention(qj, kj, vj, scale=self.scale, past=j * chunk)[0].transpose(0, 1))
                offset += chunk
        return torch.cat(outs)
