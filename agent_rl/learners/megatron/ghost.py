"""Ghost norms on a Megatron TP (+SP) shard: each trajectory's ‖∇θ f_i‖² of the whole model, from one backward.

The rules are vcpo/ghost.py's (a weight's per-trajectory gradient is a sum over the trajectory's tokens of
output-gradient ⊗ input, whose squared norm is formed in the ghost form or materialised, whichever costs less);
what this module adds is where the tokens and the shards live on a tensor-parallel rank:

- ColumnParallelLinear (q/k/v, gate/up; weight [dout / tp, din]): output gradient over the full sequence, input
  gathered over the sequence under SP (the layer takes it as this rank's slice). This rank's share is the
  squared norm of its rows; the shares of the TP ranks add up to the weight's. A bias is sharded the same way.
- RowParallelLinear (attention output, down; weight [dout, din / tp]): input over the full sequence, output
  gradient gathered over the sequence under SP (its output was reduce-scattered). Shares add up over TP.
- VocabParallelEmbedding (weight [V / tp, H]): the output gradient over the full sequence (gathered under SP,
  where the lookup's output is reduce-scattered), restricted to the ids this rank owns: shares add up over TP.
  The gradient the hook sees is the one `model.freeze_padding_row` already zeroed at the pad id.
- the output head, which `linear_logprobs` applies as a function to this rank's vocabulary shard
  (`HeadCall`: the hidden states it took, gathered under SP, and the full vocabulary's log-sum-exp): its output
  gradient at a token is g·(e_y − softmax(z / T)) / T over this shard's columns, g the log-prob's gradient
  (captured, not re-derived from the loss), then the linear rule; shares add up over TP. Tied to the embedding,
  the cross term 2⟨E_i, H_i⟩ over this shard's rows too.
- RMSNorm weights (`cpu_compat.SequenceParallelRMSNorm`: the layer norms, the final norm, Qwen3's q/k norms):
  the per-trajectory gradient vector Σ_t γ_t ⊙ x̂_t exactly ([n, d] per norm). A weight tagged
  `sequence_parallel` (SP's norms: this rank's slice of the sequence; q/k norms under TP: this rank's heads)
  holds a partial sum, so the vectors are summed over TP *before* squaring; a TP-duplicated one (no SP) is
  counted once, on TP rank 0.

The TP reduction is one all-reduce per micro-batch of [the n shares | every norm's [n, d] vector]; the gathers
under SP happen inside the backward's gradient hooks, which fire in the same order on every TP rank (the
graphs are the same), as megatron's own backward collectives do. Nothing is read on the host.

Activation recompute (megatron's reentrant `CheckpointFunction`, which refuses `torch.autograd.grad`): the
hooks fire when a checkpointed layer is re-run inside the backward, and the norm backward is a plain
`backward()` whose parameter gradients are put back as they were (the step's accumulated gradients untouched).

Refused (`GhostUnsupported`, the step then runs a backward per trajectory): context parallelism (a trajectory's
tokens on several CP ranks would need the cross-rank token pairs), Transformer Engine's fused layers (GPUs with
TE) and MoE layers (router, experts), and any trainable parameter outside the layers above, named.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from agent_rl.learners.megatron import packing
from agent_rl.learners.megatron.grads import ShardGroups
from agent_rl.learners.megatron.linear_logprobs import HeadCall
from agent_rl.learners.megatron.model import ParallelConfig
from vcpo.ghost import GhostUnsupported, Layout, _padded, embedding_sq, linear_sq


@dataclass(frozen=True)
class Tokens:
    """Where the tokens of one micro-batch's model input [S, B] (sequence-major, megatron's order) lie:
    `layout` over the S·B tokens; a rank's SP slice is tokens [r·S/tp·B, (r+1)·S/tp·B)."""

    layout: Layout
    seq: int  # S: the sequence the model runs (packed: the pack; padded: T padded to the parallel multiple)
    rows: int  # B

    @staticmethod
    def of(lengths: list[int], width: int, par: ParallelConfig, pack: bool, device: torch.device) -> Tokens:
        n = len(lengths)
        if pack:
            plan = packing.plan_of_lengths(lengths, width, par)
            spans = torch.tensor(plan.padded)
            seg = torch.repeat_interleave(torch.arange(n), spans, output_size=plan.total)
            pos = (
                torch.arange(plan.total) - torch.tensor(plan.starts)[seg]
            )  # the pack's padding: the last row's
            lay = Layout(seg.to(device), pos.to(device), n, max(plan.padded))
            return Tokens(lay, plan.total, 1)
        seq = width + (-width) % par.seq_multiple
        seg = torch.arange(n, device=device).repeat(seq)
        pos = torch.arange(seq, device=device).repeat_interleave(n)
        return Tokens(Layout(seg, pos, n, seq), seq, n)


@dataclass
class _Layer:
    module: nn.Module
    kind: str  # column | row | embedding | norm
    path: str
    params: list[nn.Parameter]
    saved: tuple[Tensor, ...] | None = None  # the latest forward's input
    saved_out: Tensor | None = None  # the latest forward's output, until the backward asks for its gradient
    forwards: int = 0
    fired: int = 0
    shares: list[Tensor] = field(default_factory=list)  # [n] this rank's shares (sharded weights)
    vectors: list[Tensor] = field(default_factory=list)  # [n, d] per-trajectory vectors (norms) to reduce


class MegatronGhostNorms:
    """The ghost hooks of one Megatron model shard; the protocol of vcpo.ghost.GhostNorms that vcpo.Step uses
    (`capture`, then `norms`), returning the whole model's ‖g_i‖² on every TP rank.

    `grad_holders`: parameters whose `.grad` the norm pass must leave as it found them besides the model's (the
    fp32 main copies in bf16). `by_layer`: a dict to receive each layer's [n] whole-model share (TP-reduced in the
    same all-reduce), for tests."""

    def __init__(
        self,
        model: nn.Module,
        *,
        par: ParallelConfig,
        groups: ShardGroups,
        pack: bool,
        grad_holders: Sequence[nn.Parameter] = (),
        by_layer: dict[str, Tensor] | None = None,
    ) -> None:
        from megatron.core.tensor_parallel import (
            ColumnParallelLinear,
            RowParallelLinear,
            VocabParallelEmbedding,
        )

        from agent_rl.learners.megatron.cpu_compat import SequenceParallelRMSNorm

        if par.cp > 1:
            raise GhostUnsupported(
                "ghost norms: context parallelism (learner.cp > 1) is not covered (a trajectory's tokens lie on "
                "several CP ranks); set algorithm.opob_norms: backward"
            )
        self.model, self.par, self.groups, self.pack, self.by_layer = model, par, groups, pack, by_layer
        self.tp = par.tp
        head_w = model.output_weight()
        self.head_weight = head_w if head_w.requires_grad else None
        head_module = getattr(model, "output_layer", None)
        self.layers: list[_Layer] = []
        kinds = [(ColumnParallelLinear, "column"), (RowParallelLinear, "row"),
                 (VocabParallelEmbedding, "embedding"), (SequenceParallelRMSNorm, "norm")]  # fmt: skip
        for path, m in model.named_modules():
            own = [p for p in m.parameters(recurse=False) if p.requires_grad]
            if not own or (m is head_module and all(p is head_w for p in own)):
                continue  # the output layer runs as a function (linear_logprobs): the head rule
            kind = next((k for cls, k in kinds if type(m) is cls), None)
            if kind is None:
                names = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
                raise GhostUnsupported(
                    f"ghost norms (megatron): {path} ({type(m).__name__}) holds trainable {names} in a layer the "
                    "ghost norms do not cover; set algorithm.opob_norms: backward"
                )
            if kind == "row" and getattr(m, "bias", None) is not None and m.bias.requires_grad:
                raise GhostUnsupported(
                    f"ghost norms (megatron): {path} has a bias (model.add_bias_linear), which the ghost norms do "
                    "not cover; set algorithm.opob_norms: backward"
                )
            self.layers.append(_Layer(m, kind, path, own))
        self.tied = next(
            (L for L in self.layers if L.kind == "embedding" and L.module.weight is self.head_weight), None
        )
        self.recompute = getattr(getattr(model, "config", None), "recompute_granularity", None) is not None
        self.holders = list({id(p): p for p in [*model.parameters(), *grad_holders]}.values())
        self.tokens: Tokens | None = None
        self._armed = False
        self._collect = False  # true inside `norms`' backward: the gradient hooks compute
        self._head: tuple[HeadCall, list[Tensor]] | None = None
        self._tied_grad: tuple[Tensor, Tensor] | None = None
        self._handles = [L.module.register_forward_hook(self._forward_hook(L)) for L in self.layers]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- the protocol vcpo.Step uses -------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture(self, input_ids: Tensor, loss_mask: Tensor, lengths: list[int]):
        """Arm the hooks for one micro-batch's forward (right-padded rows of real `lengths`, host ints)."""
        self.tokens = Tokens.of(lengths, input_ids.shape[1], self.par, self.pack, input_ids.device)
        for L in self.layers:
            L.saved, L.saved_out, L.forwards, L.fired, L.shares, L.vectors = None, None, 0, 0, [], []
        self._head, self._tied_grad = None, None
        self._armed = True
        if self.head_weight is not None:
            self.model.head_observer = self._observe_head
        try:
            yield self
        finally:
            self._armed = False
            self.model.head_observer = None

    def norms(self, f: Tensor, *, retain_graph: bool) -> Tensor:
        """[n] float64 ‖∇θ f_i‖² of the whole model (every TP rank gets the same) after the forward that made
        `f` = Σ_i f_i."""
        tokens = self.tokens
        assert tokens is not None, "MegatronGhostNorms.norms outside capture"
        if self.head_weight is not None and self._head is None:
            raise RuntimeError(
                "ghost norms (megatron): the output head did not run (linear_logprobs not called)"
            )
        self._collect = True
        try:
            if self.recompute:  # CheckpointFunction refuses autograd.grad: a backward, the gradients put back
                kept = [p.grad for p in self.holders]
                for p in self.holders:
                    p.grad = None
                try:
                    f.backward(retain_graph=retain_graph)
                finally:
                    for p, g in zip(self.holders, kept, strict=True):
                        p.grad = g
            else:
                inputs = [L.saved_out for L in self.layers if L.saved_out is not None]
                if self._head is not None:
                    inputs.append(self._head[0].logprobs)
                torch.autograd.grad(f, inputs, retain_graph=retain_graph, allow_unused=True)
        finally:
            self._collect = False
            for L in self.layers:
                L.saved_out = None
        silent = [L.path for L in self.layers if not L.fired]
        if silent:
            raise RuntimeError(
                f"ghost norms (megatron): {silent} saw no output gradient (did not run with gradients, or a weight "
                "used as a function); set algorithm.opob_norms: backward"
            )
        head = self._head_share() if self._head is not None else None
        return self._reduce(tokens.layout.n, f.device, head)

    # -- hooks -----------------------------------------------------------------------------------------------

    def _forward_hook(self, layer: _Layer):
        def hook(module: nn.Module, args: tuple, out) -> None:
            if not self._armed or not torch.is_grad_enabled():
                return
            y = out[0] if isinstance(out, tuple) else out
            if not (isinstance(y, Tensor) and y.requires_grad):
                return
            layer.saved = (args[0].detach(),)
            layer.forwards += 1
            layer.saved_out = y
            y.register_hook(self._grad_hook(layer))

        return hook

    def _grad_hook(self, layer: _Layer):
        def hook(g: Tensor) -> None:
            if not self._collect or layer.saved is None:
                return
            layer.fired += 1
            with torch.no_grad():
                _RULES[layer.kind](self, layer, layer.saved[0], g)

        return hook

    def _observe_head(self, call: HeadCall) -> None:
        if not self._armed or not call.logprobs.requires_grad:
            return
        grads: list[Tensor] = []
        call.logprobs.register_hook(lambda g: grads.append(g.detach()) if self._collect else None)
        self._head = (call, grads)

    # -- where the tokens are ----------------------------------------------------------------------------------

    def _full(self, x: Tensor, what: str) -> Tensor:
        """[S, B, ...] of a tensor that is over the full sequence, or gathered from this rank's SP slice."""
        tokens = self.tokens
        assert tokens is not None
        if x.shape[0] == tokens.seq:
            return x
        if self.par.sp and x.shape[0] * self.tp == tokens.seq:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            return gather_from_sequence_parallel_region(x.contiguous(), group=self.groups.tp)
        raise RuntimeError(
            f"ghost norms (megatron): {what} has {x.shape[0]} positions; the micro-batch runs {tokens.seq}"
        )

    def _local_segments(self, x: Tensor) -> Tensor:
        """The trajectory of each token of x [s, b, ...]: the full sequence, or this rank's SP slice of it."""
        tokens = self.tokens
        assert tokens is not None
        seg = tokens.layout.seg
        if x.shape[0] == tokens.seq:
            return seg
        per = x.shape[0] * tokens.rows
        r = self.groups.tp_rank
        return seg[r * per : (r + 1) * per]

    # -- the TP reduction ------------------------------------------------------------------------------------

    def _reduce(self, n: int, device: torch.device, head: Tensor | None) -> Tensor:
        """One all-reduce over TP of every layer's share (the head's too) and every norm's vectors, which are
        squared after it: [n] whole-model ‖g_i‖²."""
        zero = torch.zeros(n, dtype=torch.float64, device=device)
        shares = [torch.stack(L.shares).sum(0) if L.shares else zero for L in self.layers]
        shares.append(head if head is not None else zero)
        vectors = [torch.stack(L.vectors).sum(0) if L.vectors else None for L in self.layers]
        flat = torch.cat([torch.stack(shares, 1).flatten()] + [v.flatten() for v in vectors if v is not None])
        if self.groups.tp is not None:
            dist.all_reduce(flat, group=self.groups.tp)
        k = len(shares)
        reduced, at = flat[: n * k].view(n, k), n * k
        per_layer = {}
        for j, (L, v) in enumerate(zip(self.layers, vectors, strict=True)):
            per_layer[L.path] = reduced[:, j]
            if v is not None:
                per_layer[L.path] = per_layer[L.path] + flat[at : at + v.numel()].view_as(v).pow(2).sum(-1)
                at += v.numel()
            L.shares, L.vectors = [], []
        if (
            head is not None and self.tied is not None
        ):  # one weight: the head's share and the cross term join it
            per_layer[self.tied.path] = per_layer[self.tied.path] + reduced[:, k - 1]
        elif head is not None:
            per_layer["output_layer"] = reduced[:, k - 1]
        if self.by_layer is not None:
            for path, share in per_layer.items():
                self.by_layer[path] = self.by_layer.get(path, 0) + share
        return torch.stack(list(per_layer.values())).sum(0)

    # -- the head ----------------------------------------------------------------------------------------------

    def _head_share(self) -> Tensor:
        """This rank's share of the output head for every trajectory: its output gradient formed again from the
        saved hidden states, one trajectory at a time (a [width, V / tp] block)."""
        assert self._head is not None and self.tokens is not None
        call, grads = self._head
        if len(grads) != 1:
            raise RuntimeError(f"ghost norms (megatron): the log-probs' gradient was seen {len(grads)} times")
        lay = self.tokens.layout
        with torch.no_grad():
            w = call.weight.detach()
            x = call.hidden.detach()
            dt = torch.float64 if x.dtype == torch.float64 else torch.float32
            t = call.temperature
            xp = _padded(lay, x)
            local = call.labels - call.vocab_start
            owned = (local >= 0) & (local < w.shape[0])
            cols = _padded(lay, torch.where(owned, local, 0)[:, None].to(dt))[..., 0].long()
            own = _padded(lay, owned[:, None].to(dt))[..., 0]
            coef = _padded(lay, (grads[0].to(dt) / t)[:, None])[..., 0]
            lse = _padded(lay, call.lse.to(dt)[:, None])[..., 0]
            tied = None
            if self.tied is not None:
                if self._tied_grad is None:
                    raise RuntimeError(
                        "ghost norms (megatron): the tied embedding's output gradient was never seen"
                    )
                ids, g_emb = self._tied_grad
                e_local = ids - call.vocab_start
                e_owned = (e_local >= 0) & (e_local < w.shape[0])
                tied = (
                    _padded(lay, torch.where(e_owned, e_local, 0)[:, None].to(dt))[..., 0].long(),
                    _padded(lay, (g_emb.to(dt) * e_owned[:, None]).to(dt)),
                )
            sq = torch.zeros(lay.n, dtype=torch.float64, device=x.device)
            one = Layout(lay.seg.new_zeros(lay.width), torch.arange(lay.width, device=x.device), 1, lay.width)
            for i in range(lay.n):
                z = (xp[i] @ w.t()).to(dt)  # the forward's GEMM, in the weights' dtype
                if t != 1.0:
                    z = z / t
                d = -(z - lse[i][:, None]).exp()  # softmax over the full vocabulary, on this shard's columns
                d.scatter_add_(1, cols[i][:, None], own[i][:, None])
                d *= coef[i][:, None]
                xi = xp[i].to(dt)
                sq[i] = linear_sq(one, xi, d)[0]
                if tied is not None:
                    sq[i] += 2 * (d[:, tied[0][i]] * (xi @ tied[1][i].t())).sum(dtype=torch.float64)
        return sq


# -- the layer rules: this rank's share ([n], into layer.shares) or per-trajectory vector ([n, d]) --------------


def _column(self: MegatronGhostNorms, layer: _Layer, x: Tensor, g: Tensor) -> None:
    x = self._full(x, f"{layer.path}'s input")
    m = layer.module
    bias = (
        getattr(m, "bias", None) is not None
        and m.bias.requires_grad
        and not getattr(m, "skip_bias_add", False)
    )
    lay = self.tokens.layout
    layer.shares.append(linear_sq(lay, x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), bias=bias))


def _row(self: MegatronGhostNorms, layer: _Layer, x: Tensor, g: Tensor) -> None:
    g = self._full(g, f"{layer.path}'s output gradient")
    lay = self.tokens.layout
    layer.shares.append(linear_sq(lay, x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])))


def _embedding(self: MegatronGhostNorms, layer: _Layer, ids: Tensor, g: Tensor) -> None:
    """ids [B, S]; g [S / tp, B, H] under SP (reduce-scattered), else [B, S, H]."""
    m = layer.module
    g = self._full(g, f"{layer.path}'s output gradient") if self.par.sp else g.transpose(0, 1)
    ids = ids.t().reshape(-1)
    g = g.reshape(-1, g.shape[-1])
    local = ids - m.vocab_start_index
    owned = (local >= 0) & (local < m.weight.shape[0])
    g = g * owned[:, None].to(g.dtype)  # another rank's rows: not this shard's gradient
    layer.shares.append(embedding_sq(self.tokens.layout, ids, g))
    if layer is self.tied:
        self._tied_grad = (ids, g)


def _norm(self: MegatronGhostNorms, layer: _Layer, x: Tensor, g: Tensor) -> None:
    """RMSNorm y = x̂ ⊙ w (rms_norm.py, fp32 inside): ∂f_i/∂w = Σ_{t∈i} γ_t ⊙ x̂_t, summed over heads for q/k norms."""
    m = layer.module
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    x_hat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + m.eps)
    per_tok = (g.to(xf.dtype) * x_hat).reshape(x.shape[0] * x.shape[1], -1, x.shape[-1]).sum(1)
    seg = self._local_segments(x)
    vec = torch.zeros(self.tokens.layout.n, x.shape[-1], dtype=torch.float64, device=x.device)
    vec.index_add_(0, seg, per_tok.double())
    partial = self.tp > 1 and bool(getattr(m.weight, "sequence_parallel", False))
    if not partial and self.groups.tp_rank != 0:
        vec.zero_()  # a TP-duplicated weight whose gradient every rank holds whole: counted once
    layer.vectors.append(vec)


_RULES = {"column": _column, "row": _row, "embedding": _embedding, "norm": _norm}
