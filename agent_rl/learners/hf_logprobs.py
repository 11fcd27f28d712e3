"""The torch learner's log-probs of a Hugging Face causal LM: packed trajectories, chunked log-softmax.

A micro-batch arrives as right-padded rows ([B, T], vcpo's contract). Packed (`pack`), its real tokens
run as one row of N = Σ lengths tokens, with position ids restarting at 0 for every trajectory and the
document boundaries passed as `cu_seq_lens_q/k` (FlashAttention's names): `packed_attention` runs causal
SDPA one document at a time, flash-attention 2 (where installed and chosen) its variable-length kernel,
and otherwise transformers builds a block-diagonal mask from the position ids; no token attends across
trajectories, and no padding is computed. Hybrid models' Gated DeltaNet layers read the same bounds and
start their conv and recurrent state afresh at each (packed_linear_attention.py). Unpacked, the rows run as
they are (right padding needs no mask: padding never precedes a real token in a causal LM).

The output head never makes [tokens, vocab] fp32 logits: the decoder's last hidden state at the
positions that predict a token goes through `vcpo.logprobs.linear_logprobs` in chunks. Models whose
head is more than a linear map of the last hidden state (logit soft-capping, scaling) are detected when
the rank is built and go through the model's own `.logits`, upcast chunk by chunk
(`vcpo.logprobs.logits_logprobs`), unpacked.

`compile`: the decoder runs under `torch.compile(dynamic=True)` (lengths change every micro-batch).

`head_fp32` (model.lm_head_fp32): the head's matmuls (forward and backward) run in fp32 outside bf16 autocast,
on the final norm's output in fp32: under autocast the residual stream and the norm are fp32 already (the
master weights are fp32, elementwise ops are not autocast), so only the head's GEMM changes precision.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from agent_rl.learners import shared_prefix
from agent_rl.learners.packed_attention import NAME as PACKED
from agent_rl.learners.packed_attention import use_packed_attention
from agent_rl.learners.packed_linear_attention import use_packed_linear_attention
from vcpo.logprobs import CHUNK_TOKENS, linear_logprobs, logits_logprobs, logits_sum_p2, proxy_sq_norm

log = logging.getLogger(__name__)


class HFLogprobs:
    """`logprobs(model, ids, mask)` and `proxy(model, ids, mask)` with vcpo's signatures, for one HF model."""

    def __init__(
        self,
        model: nn.Module,
        *,
        pack: bool = True,
        chunk_tokens: int = CHUNK_TOKENS,
        compile: bool = False,
        head_fp32: bool = False,
        share_prefixes: bool = False,
    ):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the model
        if pack and _has_linear_attention(base) and not use_packed_linear_attention(base):
            log.info(
                "%s: a Gated DeltaNet layer of a kind packed_linear_attention.py does not know; micro-batches run "
                "as padded rows",
                type(base).__name__,
            )
            pack = False
        self.model, self.pack, self.chunk_tokens = model, pack, chunk_tokens
        self.decoder: nn.Module = base.get_decoder()
        self.head: nn.Module = base.get_output_embeddings()
        self.plain_head = _head_is_linear(base, self.decoder, self.head)
        self.attention = base.config._attn_implementation
        if pack and self.plain_head and use_packed_attention(base):
            self.attention = PACKED
        if not self.plain_head:
            log.warning(
                "%s: the output head is more than a linear map of the last hidden state; log-probs go through "
                "the model's own logits (upcast to fp32 chunk by chunk), without packing",
                type(base).__name__,
            )
        self.compiled = compile
        self.head_fp32 = head_fp32
        # shared-prefix packing (shared_prefix.py) needs our packed SDPA in every layer (a Gated DeltaNet layer's state
        # runs along the packed row) and eager layers; the ghost norms' per-row
        # activations and routing replay's per-token routes turn it off from outside (TorchRank)
        self.share_prefixes = (
            share_prefixes and self.attention == PACKED and not compile and not _has_linear_attention(base)
        )
        self._run = torch.compile(self.decoder, dynamic=True) if compile else self.decoder

    def logprobs(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B, T] log p(input_ids[t] | input_ids[:t]), position 0 and padding 0 (fp32; fp64 for fp64 models)."""
        return self._forward(model, input_ids, attention_mask, proxy=False)[0]

    def proxy(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(log-probs, per-token ‖∂ log p(y_t)/∂ logits_t‖²) [B, T] as `vcpo.logprobs.logit_grad_proxy_of`."""
        lp, gsq = self._forward(model, input_ids, attention_mask, proxy=True)
        assert gsq is not None
        return lp, gsq

    def _forward(
        self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, proxy: bool
    ) -> tuple[Tensor, Tensor | None]:
        if model is not self.model:
            raise ValueError("HFLogprobs: called with another model than the one it was built for")
        share = self.share_prefixes and input_ids.shape[0] > 1
        at = _Layout.of(attention_mask, input_ids if share else None)
        dev = input_ids.device
        # pred: [P] index into the flattened [B * T] rows of each position that predicts a token (position t - 1
        # of row b predicts t; both real under right padding), row by row
        pred = at.pred.to(dev, non_blocking=True)
        target = pred + 1  # where each predicted token is, in the same flattened rows
        targets = input_ids.flatten()[target]
        if self.plain_head:
            hidden = self._hidden(input_ids, at)  # [B, T, H] rows, or [1, N, H] packed
            if hidden.shape[0] == input_ids.shape[0]:
                h = hidden.flatten(0, 1)[pred]
            else:  # packed: the real tokens in row order; the one before each target is its predictor
                h = hidden[0, at.packed_pred.to(dev, non_blocking=True)]
            head = self.head
            fp32 = self.head_fp32 and h.dtype != torch.float64
            with torch.autocast(dev.type, enabled=False) if fp32 else contextlib.nullcontext():
                out = linear_logprobs(
                    h.float() if fp32 else h, head.weight.float() if fp32 else head.weight, targets,
                    bias=None if head.bias is None else head.bias.float() if fp32 else head.bias,
                    chunk_tokens=self.chunk_tokens, with_sum_p2=proxy,
                )  # fmt: skip
            lp, p2 = out if proxy else (out, None)
        else:
            logits = model(input_ids).logits.flatten(0, 1)[pred]
            lp = logits_logprobs(logits, targets, chunk_tokens=self.chunk_tokens)
            p2 = logits_sum_p2(logits, chunk_tokens=self.chunk_tokens) if proxy else None
        full = lp.new_zeros(input_ids.numel())
        full[target] = lp
        full = full.view(input_ids.shape)
        if p2 is None:
            return full, None
        gsq = lp.new_zeros(input_ids.numel(), requires_grad=False)
        with torch.no_grad():
            gsq[target] = proxy_sq_norm(lp.detach(), p2)
        return full, gsq.view(input_ids.shape)

    def _hidden(self, input_ids: Tensor, at: _Layout) -> Tensor:
        """The decoder's last hidden state: [1, N, H] for the packed real tokens, or [B, T, H] per row."""
        rows, dev = input_ids.shape[0], input_ids.device
        if self.pack and rows > 1 and at.calls:  # prefixes shared: the attention runs the layout's calls
            out = self._run(
                input_ids=input_ids.flatten()[at.real.to(dev, non_blocking=True)][None],
                position_ids=at.positions.to(dev, non_blocking=True)[None],
                use_cache=False, packed_calls=at.calls,
            )  # fmt: skip
        elif self.pack and rows > 1:
            bounds = at.bounds  # Python ints: no read of the device here, nor in any layer
            longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
            cu = at.cu.to(dev, non_blocking=True)
            # compiled: Python ints in the call would specialise the graph on every new set of lengths
            plain = {} if self.compiled else {"packed_bounds": bounds}
            out = self._run(
                input_ids=input_ids.flatten()[at.real.to(dev, non_blocking=True)][None],
                position_ids=at.positions.to(dev, non_blocking=True)[None],
                cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest, use_cache=False,
                **plain,
            )  # fmt: skip
        else:
            out = self._run(input_ids=input_ids)
        return out.last_hidden_state


@dataclass(frozen=True)
class _Layout:
    """Where a right-padded micro-batch's tokens are, as host index tensors into its flattened [B*T] rows, from one
    read of the device (the rows' lengths, and their tokens when prefixes are shared): gathering with them, unlike indexing with a boolean mask, does not make
    the host wait for the device to count the mask's entries (tests/learners/test_packed_logprobs.py counts)."""

    pred: Tensor  # [P] the positions that predict a token (t - 1 for every real t >= 1), row by row
    packed_pred: Tensor  # [P] the same positions among the packed real tokens
    real: Tensor  # [N] the real tokens, row by row
    positions: Tensor  # [N] each real token's position in its row
    cu: Tensor  # [B + 1] int32: where each row starts among the real tokens, and N (empty when prefixes are shared)
    bounds: tuple[int, ...]  # cu as Python ints
    # the attention's calls when prefixes are shared (shared_prefix.py); empty otherwise
    calls: tuple[shared_prefix.Call, ...] = ()

    @staticmethod
    def of(attention_mask: Tensor, input_ids: Tensor | None = None) -> _Layout:
        """`input_ids` given: with the rows' common prefixes shared (shared_prefix.py), read in the same read."""
        am, t = attention_mask > 0, attention_mask.shape[1]
        head = torch.cat([am.sum(-1), (am[:, 1:] & ~am[:, :-1]).any().reshape(1)])
        values = (
            torch.cat([head, input_ids.flatten().to(head.dtype)]) if input_ids is not None else head
        ).tolist()
        *lengths, misplaced = values[: len(head)]
        if misplaced:
            raise ValueError(
                "HFLogprobs: attention_mask rows must be right-padded (a real token follows padding)"
            )
        before_last = [max(n - 1, 0) for n in lengths]  # every real token but a row's last predicts one
        pred_rows, pred_positions, _ = _runs(before_last)
        if input_ids is not None:
            ids = values[len(head) :]
            shared = shared_prefix.plan([ids[b * t : b * t + n] for b, n in enumerate(lengths)])
            if shared.saved:
                index = torch.tensor(
                    [i for row, n in zip(shared.index, before_last, strict=True) for i in row[:n]],
                    dtype=torch.long,
                )
                src = torch.tensor(shared.sources, dtype=torch.long).reshape(-1, 2)
                return _Layout(
                    pred_rows * t + pred_positions, index, src[:, 0] * t + src[:, 1], src[:, 1],
                    torch.zeros(0, dtype=torch.int32), (), shared.calls,
                )  # fmt: skip
        real_rows, positions, starts = _runs(lengths)
        cu = torch.cat([starts, torch.tensor([sum(lengths)])]).to(torch.int32)
        return _Layout(
            pred_rows * t + pred_positions, starts[pred_rows] + pred_positions, real_rows * t + positions,
            positions, cu, tuple(itertools.accumulate(lengths, initial=0)),
        )  # fmt: skip


def _runs(counts: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """For rows holding counts[b] items each: every item's row and its place in the row, and each row's start."""
    n = torch.tensor(counts, dtype=torch.long)
    starts = n.cumsum(0) - n
    rows = torch.repeat_interleave(torch.arange(len(counts)), n, output_size=sum(counts))
    return rows, torch.arange(sum(counts)) - starts[rows], starts


def _head_is_linear(base: nn.Module, decoder: nn.Module, head: nn.Module | None) -> bool:
    """Whether the model's logits are exactly `head(decoder(ids).last_hidden_state)`, `head` an nn.Linear:
    checked on 8 tokens (a soft-capped or scaled head differs), with the model's dropout and training mode
    as they are (the model is fresh: no step has run)."""
    if type(head) is not nn.Linear:  # e.g. a PEFT LoRA layer on lm_head: its weight is not the whole map
        return False
    p = next(base.parameters())
    ids = torch.arange(3, 11, device=p.device)[None] % int(head.weight.shape[0])
    was_training = base.training
    base.eval()
    try:
        with torch.no_grad():
            want = base(input_ids=ids).logits
            got = head(decoder(input_ids=ids).last_hidden_state)
    finally:
        base.train(was_training)
    return bool(torch.equal(want, got))


def _has_linear_attention(base: nn.Module) -> bool:
    """A hybrid model (Qwen3-Next / Qwen3.5): Gated DeltaNet layers, packed by packed_linear_attention.py."""
    return "linear_attention" in (getattr(base.config, "layer_types", None) or ())
