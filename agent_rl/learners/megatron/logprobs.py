"""Per-token log-probs from a Megatron GPTModel shard: vocab-parallel, sequence- and context-parallel.

Same contract as `vcpo.logprobs.logprobs_of` ([B, T] log p(x_t | x_<t), position 0 is 0), so
the VCPO math above it is backend-agnostic. The model returns its final hidden states
(`gpt.HiddenStatesGPTModel`); `linear_logprobs` applies the vocab-split output layer and the
log-softmax chunk by chunk, so no [tokens, V / tp] logits are kept (in fp32 or otherwise).

Rows run either right-padded ([B, T], padded to a multiple of `ParallelConfig.seq_multiple`;
causal attention: padding at the end changes nothing before it) or packed into one sequence
(`packing`, THD `PackedSeqParams`, for Transformer Engine and `attention.SDPAttention` alike).
Context parallelism needs packing: each CP rank holds chunks r and 2cp−1−r of every
sequence, and the log-probs are all-gathered differentiably (backward: reduce-scatter), so every
CP rank computes the same loss and back-propagates into its own chunks (`grads.finish_backward`
averages the CP ranks' gradients, which that gather multiplied by cp).
"""

from __future__ import annotations

import torch
from torch import Tensor

from agent_rl.learners.megatron import packing
from agent_rl.learners.megatron.model import ParallelConfig


def pad_to_multiple(x: Tensor, multiple: int, value: int | float = 0) -> Tensor:
    """Right-pad the last dim of x to a multiple of `multiple`."""
    extra = (-x.shape[-1]) % multiple
    return torch.nn.functional.pad(x, (0, extra), value=value) if extra else x


def megatron_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    par: ParallelConfig,
    cp_group=None,
    temperature: float = 1.0,
    pack: bool = False,
    head_fp32: bool = False,
) -> Tensor:
    """[B, T] float32 log p(input_ids[t] | input_ids[:t]) with gradients into this rank's shard.

    Right-padded rows: padded positions never influence real ones (their log-probs are garbage and
    must be outside the loss mask). `pack` (required under context parallelism): run the rows' real
    tokens as one packed sequence (`packing`), which needs `attention_mask`.
    """
    if par.cp > 1 and not pack:
        raise ValueError(
            "megatron_logprobs: context parallelism needs pack=True (it splits packed sequences)"
        )
    if pack:
        return _packed_logprobs(
            model,
            input_ids,
            attention_mask,
            par=par,
            cp_group=cp_group,
            temperature=temperature,
            head_fp32=head_fp32,
        )
    b, t = input_ids.shape
    ids = pad_to_multiple(input_ids, par.seq_multiple)
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]  # position t predicts token t+1
    s = ids.shape[1]
    positions = torch.arange(s, device=ids.device).expand(b, s)
    lp = _token_logprobs(model, model(ids, positions, None), labels, par, temperature, head_fp32)
    out = lp.new_zeros(b, t)
    out[:, 1:] = lp[:, : t - 1]
    return out


def _token_logprobs(
    model, hidden: Tensor, labels: Tensor, par: ParallelConfig, temperature: float, head_fp32: bool = False
) -> Tensor:
    """[B, S] log p(labels) from the final hidden states [S (/ tp under SP), B, H], never gathering the vocabulary.
    `head_fp32` (model.lm_head_fp32): the final norm's output (fp32 already where the rank built its final norm
    with `rank.final_norm_in_fp32`) and this rank's vocabulary shard of the output weight upcast to fp32, so the
    head's GEMMs (forward and backward) run in fp32; gradients flow back through the casts into the model's dtype."""
    from megatron.core import parallel_state as ps

    from agent_rl.learners.megatron.linear_logprobs import linear_logprobs

    weight = model.output_weight()
    if head_fp32:
        hidden, weight = hidden.float(), weight.float()
    lp = linear_logprobs(
        hidden,
        weight,
        labels.t(),
        temperature=temperature,
        tp_group=ps.get_tensor_model_parallel_group() if par.tp > 1 else None,
        sequence_parallel=par.sp,
        observe=getattr(model, "head_observer", None),  # set by ghost.MegatronGhostNorms while it captures
    )
    return lp.t()


def _packed_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    *,
    par: ParallelConfig,
    cp_group,
    temperature: float,
    head_fp32: bool = False,
) -> Tensor:
    """megatron_logprobs over one packed sequence: same [B, T] result, no compute spent on row padding."""
    if attention_mask is None:
        raise ValueError("megatron_logprobs(pack=True) needs the attention_mask to find each row's length")
    device = input_ids.device
    layout = packing.plan(attention_mask, par)
    ids = packing.pack(input_ids, layout)
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]  # across a sequence boundary the label is garbage; unpack never reads it
    pos = packing.positions(layout, device)
    if par.cp > 1:
        if cp_group is None:
            raise ValueError("megatron_logprobs: learner.cp > 1 needs the context-parallel group")
        cp_rank = torch.distributed.get_rank(cp_group)
        local = packing.thd_partition_index(layout, cp_rank, par.cp).to(device, non_blocking=True)
        ids, labels, pos = ids[:, local], labels[:, local], pos[:, local]
    seq_params = packing.packed_seq_params(layout, device)
    lp = _token_logprobs(
        model, model(ids, pos, None, packed_seq_params=seq_params), labels, par, temperature, head_fp32
    )
    if par.cp > 1:
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        order = torch.cat([packing.thd_partition_index(layout, r, par.cp) for r in range(par.cp)])
        gathered = gather_from_sequence_parallel_region(
            lp[0], tensor_parallel_output_grad=True, group=cp_group
        )
        lp = gathered[torch.argsort(order).to(device, non_blocking=True)][None]
    rows = packing.unpack(lp, layout)  # rows[i, t]: log p(token t+1 | tokens <= t)
    out = rows.new_zeros(rows.shape)
    out[:, 1:] = rows[:, :-1]
    return out
