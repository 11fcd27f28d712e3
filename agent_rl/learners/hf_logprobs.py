"""The torch learner's log-probs of a Hugging Face causal LM: packed trajectories, chunked log-softmax.

A micro-batch arrives as right-padded rows ([B, T], vcpo's contract). Packed (`pack`), its real tokens
run as one row of N = Σ lengths tokens, with position ids restarting at 0 for every trajectory and the
document boundaries passed as `cu_seq_lens_q/k` (FlashAttention's names): `packed_attention` runs causal
SDPA one document at a time, flash-attention 2 (where installed and chosen) its variable-length kernel,
and otherwise transformers builds a block-diagonal mask from the position ids; no token attends across
trajectories, and no padding is computed. Unpacked, the rows run as they are (right padding needs no
mask: padding never precedes a real token in a causal LM).

The output head never makes [tokens, vocab] fp32 logits: the decoder's last hidden state at the
positions that predict a token goes through `vcpo.logprobs.linear_logprobs` in chunks. Models whose
head is more than a linear map of the last hidden state (logit soft-capping, scaling) are detected when
the rank is built and go through the model's own `.logits`, upcast chunk by chunk
(`vcpo.logprobs.logits_logprobs`), unpacked.

`compile`: the decoder runs under `torch.compile(dynamic=True)` (lengths change every micro-batch).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from agent_rl.learners.packed_attention import NAME as PACKED
from agent_rl.learners.packed_attention import use_packed_attention
from vcpo.logprobs import CHUNK_TOKENS, linear_logprobs, logits_logprobs, logits_sum_p2, proxy_sq_norm

log = logging.getLogger(__name__)


class HFLogprobs:
    """`logprobs(model, ids, mask)` and `proxy(model, ids, mask)` with vcpo's signatures, for one HF model."""

    def __init__(
        self, model: nn.Module, *, pack: bool = True, chunk_tokens: int = CHUNK_TOKENS, compile: bool = False
    ):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the model
        if pack and _linear_attention_cannot_pack(base):
            log.info(
                "%s: Gated DeltaNet layers keep packed trajectories apart only with flash-linear-attention "
                "(pip install flash-linear-attention); micro-batches run as padded rows",
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
        am = attention_mask > 0
        if bool((am[:, 1:] & ~am[:, :-1]).any()):
            raise ValueError(
                "HFLogprobs: attention_mask rows must be right-padded (a real token follows padding)"
            )
        # predicts[b, t]: position t - 1 of row b predicts token t (both real: right padding)
        predicts = am[:, 1:]
        targets = input_ids[:, 1:][predicts]
        if self.plain_head:
            hidden = self._hidden(input_ids, am)  # [B, T, H] rows, or [1, N, H] packed
            if hidden.shape[0] == input_ids.shape[0]:
                h = hidden[:, :-1][predicts]
            else:  # packed: the real tokens in row order; the one before each target is its predictor
                index = am.flatten().cumsum(0).view(am.shape) - 1
                h = hidden[0, index[:, :-1][predicts]]
            head = self.head
            out = linear_logprobs(
                h, head.weight, targets, bias=head.bias, chunk_tokens=self.chunk_tokens, with_sum_p2=proxy
            )
            lp, p2 = out if proxy else (out, None)
        else:
            logits = model(input_ids).logits[:, :-1][predicts]
            lp = logits_logprobs(logits, targets, chunk_tokens=self.chunk_tokens)
            p2 = logits_sum_p2(logits, chunk_tokens=self.chunk_tokens) if proxy else None
        width = input_ids.shape[1]
        full = lp.new_zeros(input_ids.shape[0], width)
        full[:, 1:][predicts] = lp
        if p2 is None:
            return full, None
        gsq = torch.zeros_like(full, requires_grad=False)
        with torch.no_grad():
            gsq[:, 1:][predicts] = proxy_sq_norm(lp.detach(), p2)
        return full, gsq

    def _hidden(self, input_ids: Tensor, am: Tensor) -> Tensor:
        """The decoder's last hidden state: [1, N, H] for the packed real tokens, or [B, T, H] per row."""
        rows = input_ids.shape[0]
        if self.pack and rows > 1:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            lengths = am.sum(-1)
            cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
            bounds = tuple(cu.tolist())  # one device sync here, not one per layer
            longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
            # compiled: Python ints in the call would specialise the graph on every new set of lengths
            plain = {} if self.compiled else {"packed_bounds": bounds}
            out = self._run(
                input_ids=input_ids[am][None], position_ids=positions[am][None],
                cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest, **plain,
            )  # fmt: skip
        else:
            out = self._run(input_ids=input_ids)
        return out.last_hidden_state


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


def _linear_attention_cannot_pack(base: nn.Module) -> bool:
    """A hybrid model (Qwen3-Next / Qwen3.5: linear-attention layers) without flash-linear-attention installed:
    transformers' torch fallback of the gated delta rule refuses packed sequences."""
    import importlib.util

    layers = getattr(base.config, "layer_types", None) or ()
    return "linear_attention" in layers and importlib.util.find_spec("fla") is None
