"""Per-trajectory squared gradient norms ‖∇θ f_i‖² from one backward of Σ_i f_i ("ghost norms").

Exact OPOB needs ‖g_i‖² for every trajectory i (g_i = ∇ mean_t log π(τ_i)). The trajectories of a micro-batch
never see each other (separate rows, or documents of one packed row whose attention stops at their bounds),
so one backward of Σ_i f_i gives, at every layer's output, each token's gradient from its own trajectory alone.
A layer's weight gradient of trajectory i is then a sum over i's tokens, and its squared norm is formed from
the layer's inputs and output gradients without any per-trajectory weight gradient being accumulated:

- linear (x_t ∈ R^din in, γ_t ∈ R^dout out): ‖Σ_t γ_t x_tᵀ‖² = Σ_{t,s} (x_t·x_s)(γ_t·γ_s) (the "ghost" form,
  ~T²(din+dout) per trajectory) or the [dout, din] matrix itself (~T·din·dout), whichever costs less, as
  Opacus chooses per layer; the bias adds ‖Σ_t γ_t‖².
- embedding (ids y_t): ‖Σ_t e_{y_t} γ_tᵀ‖² = Σ_{t,s} [y_t = y_s](γ_t·γ_s), exact.
- norm layers (a class named *Norm* whose own parameters are all vectors: RMSNorm, LayerNorm, Qwen3's q/k
  norms): the layer's forward is
  run again on its saved input with each parameter replaced by one copy per trajectory, and autograd gives
  each copy's gradient: exact for any elementwise use of the vector, whatever the norm's formula.
- the output head when the log-probs call it as a function (vcpo.logprobs.linear_logprobs, never materialising
  the logits): its output gradient at a token that predicts y with loss coefficient c is c·(e_y − softmax(z)),
  formed again from the captured last hidden state; then the linear rule.
- Hugging Face fused MoE experts (3-D `gate_up_proj` / `down_proj`, the router's top-k weights as the
  experts' third input): per expert, its tokens' recomputed intermediate activations and output gradients,
  then the linear rule for each expert matrix; the router (a 2-D `weight`, `F.linear` on the flattened
  tokens) by the linear rule.

Any trainable parameter outside these layers, or one used by two of them (tied embeddings), is refused when
the hooks are built, naming it: a norm that silently missed a layer would give a wrong baseline.

Why hand-written: Opacus (the well-kept library for per-sample gradient norms) assumes the batch dimension
indexes the samples; our packed micro-batch is one row holding several trajectories, and its per-sample
hooks do not cover the functional output head or fused experts. The rules above are the same facts Opacus
uses for its linear and embedding layers; the vector-parameter rule replaces its per-norm-type formulas.

Activation recompute: the forward hooks fire again when a checkpointed block is recomputed, so each layer
keeps only the input of its latest forward; the gradient hook reads it. Layers are assumed to run once per
forward (true of decoder layers); a second call before the backward would be caught by the fired-count check.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call


class GhostUnsupported(ValueError):
    """The model holds a trainable parameter the ghost norms cannot account for."""


@dataclass(frozen=True)
class Layout:
    """Where each token of one micro-batch's decoder input lies: the trajectory it belongs to and its place in it.

    `seg[k]`, `pos[k]` for the k-th token of the flattened decoder input ([1, N] packed or [B, T] padded),
    `n` trajectories, the longest `width`; `targets[k]` the token the k-th token predicts and `coef[k]` its
    weight in f_i (1/L_i on a loss token's predictor, else 0), for a head the log-probs call as a function."""

    seg: Tensor
    pos: Tensor
    n: int
    width: int
    targets: Tensor | None = None
    coef: Tensor | None = None

    @staticmethod
    def of(input_ids: Tensor, loss_mask: Tensor, lengths: list[int], packed: bool) -> Layout:
        """The layout of right-padded rows `input_ids` [B, T] (real lengths `lengths`, host ints), packed (the
        real tokens row by row) or as the rows are. f_i = mean over i's loss tokens of log π."""
        b, t = input_ids.shape
        dev = input_ids.device
        tokens = loss_mask.sum(-1, keepdim=True).clamp(min=1.0)
        zero = torch.zeros(b, 1, dtype=input_ids.dtype, device=dev)
        targets = torch.cat([input_ids[:, 1:], zero], 1)
        coef = torch.cat([loss_mask[:, 1:].float() / tokens.float(), zero.float()], 1)
        if packed:
            n = torch.tensor(lengths, dtype=torch.long)
            seg = torch.repeat_interleave(torch.arange(b), n, output_size=sum(lengths))
            starts = n.cumsum(0) - n
            pos = torch.arange(sum(lengths)) - starts[seg]
            flat = (seg * t + pos).to(dev, non_blocking=True)
            return Layout(seg.to(dev), pos.to(dev), b, max(lengths, default=1) or 1,
                          targets.flatten()[flat], coef.flatten()[flat])  # fmt: skip
        seg = torch.arange(b, device=dev).repeat_interleave(t)
        pos = torch.arange(t, device=dev).repeat(b)
        return Layout(seg, pos, b, t, targets.flatten(), coef.flatten())


def _padded(layout: Layout, x: Tensor) -> Tensor:
    """[tokens, d] in layout order -> [n, width, d], zeros where a trajectory is shorter."""
    out = x.new_zeros(layout.n, layout.width, x.shape[-1])
    out[layout.seg, layout.pos] = x
    return out


def linear_sq(layout: Layout, x: Tensor, g: Tensor, *, bias: bool = False) -> Tensor:
    """[n] float64: ‖Σ_{t∈i} g_t x_tᵀ‖² (+ ‖Σ_{t∈i} g_t‖² with `bias`) for tokens x [N, din], g [N, dout].
    Ghost form or materialised, whichever costs fewer multiply-adds (width²·(din+dout) vs width·din·dout)."""
    dt = torch.float64 if torch.float64 in (x.dtype, g.dtype) else torch.float32
    x, g = x.to(dt), g.to(dt)
    din, dout, w = x.shape[-1], g.shape[-1], layout.width
    xp, gp = _padded(layout, x), _padded(layout, g)
    if w * (din + dout) <= din * dout:
        sq = ((xp @ xp.transpose(1, 2)) * (gp @ gp.transpose(1, 2))).sum((1, 2), dtype=torch.float64)
    else:
        sq = (gp.transpose(1, 2) @ xp).pow(2).sum((1, 2), dtype=torch.float64)
    if bias:
        sq = sq + gp.sum(1).pow(2).sum(-1, dtype=torch.float64)
    return sq


def embedding_sq(layout: Layout, ids: Tensor, g: Tensor) -> Tensor:
    """[n] float64: ‖Σ_{t∈i} e_{y_t} g_tᵀ‖² = Σ_{t,s∈i} [y_t = y_s] (g_t·g_s), exact."""
    gp = _padded(layout, g.double() if g.dtype == torch.float64 else g.float())
    yp = _padded(layout, ids.reshape(-1, 1).float() + 1.0)[..., 0]  # 0 where a trajectory is shorter
    same = (yp[:, :, None] == yp[:, None, :]) & (yp[:, :, None] > 0)
    return ((gp @ gp.transpose(1, 2)) * same).sum((1, 2), dtype=torch.float64)


@dataclass
class _Layer:
    module: nn.Module
    kind: str  # linear | embedding | vector | experts | router
    names: list[str]
    path: str  # the module's name in the model
    saved: tuple | None = None  # the latest forward's inputs (and autocast state)
    saved_out: Tensor | None = None  # the latest forward's output, until the backward asks for its gradient
    forwards: int = 0  # forwards with gradients since the hooks were armed
    fired: int = 0  # output gradients seen


class GhostNorms:
    """Hooks on `model` that, while armed (`capture`), add each trajectory's squared gradient norm to `sq`.

    `head`: the output head when the log-probs call it as a function on the decoder's last hidden state
    (`head_input`: the module whose output holds it, e.g. the decoder); None when the head runs as a module.
    `by_layer`: a dict to receive each layer's [n] share (keyed by module name), for tests."""

    def __init__(self, model: nn.Module, params: list[nn.Parameter], *, head: nn.Linear | None = None,
                 head_input: nn.Module | None = None, by_layer: dict[str, Tensor] | None = None) -> None:  # fmt: skip
        self.model = model
        self.by_layer = by_layer
        self.layers: list[_Layer] = []
        owner: dict[int, str] = {}
        names = {id(p): n for n, p in model.named_parameters()}
        want = {id(p) for p in params}
        for mname, m in model.named_modules():
            own = [(n, p) for n, p in m.named_parameters(recurse=False) if id(p) in want]
            if not own:
                continue
            kind = _kind(m, [p for _, p in own])
            if kind is None:
                raise GhostUnsupported(
                    f"ghost norms: {mname or type(m).__name__} ({type(m).__name__}) holds trainable "
                    f"{[n for n, _ in own]} in a layer the ghost norms do not cover; set "
                    "algorithm.opob_norms: backward (one backward per trajectory)"
                )
            for n, p in own:
                tied_head = (
                    head is not None and p is head.weight and (m is head or isinstance(m, nn.Embedding))
                )
                if id(p) in owner and not tied_head:
                    raise GhostUnsupported(
                        f"ghost norms: parameter {names.get(id(p), n)} is used by {owner[id(p)]} and {mname} "
                        "(shared weights other than a functional head tied to the embedding); set "
                        "algorithm.opob_norms: backward"
                    )
                owner.setdefault(id(p), mname)
            self.layers.append(_Layer(m, kind, [n for n, _ in own], mname))
        self.head = head if head is not None and head.weight.requires_grad else None
        # tied embeddings: the head's weight is an embedding's; the per-trajectory gradient of that matrix is the
        # sum of both uses, whose squared norm takes their cross term too (`_add_head`)
        self.tied: _Layer | None = None
        if self.head is not None:
            if head_input is None:
                raise ValueError("GhostNorms: a functional head needs head_input")
            self.tied = next(
                (L for L in self.layers if L.kind == "embedding" and L.module.weight is self.head.weight),
                None,
            )
        missing = want - set(owner)
        if missing:
            raise GhostUnsupported(
                f"ghost norms: trainable parameters outside any module: {sorted(names.get(i, '?') for i in missing)}"
            )
        self.head_input = head_input
        self._head_h: tuple | None = None
        self._tied_grad: tuple[Tensor, Tensor] | None = None  # the tied embedding's (ids, output gradient)
        self._head_layer = next((L for L in self.layers if L.module is self.head), None)
        self.layout: Layout | None = None
        self._choices: tuple[Layout, Layout] | None = None
        self._armed = False
        self._busy = False
        self.sq: Tensor | None = None
        self._handles = [L.module.register_forward_hook(self._forward_hook(L)) for L in self.layers]
        if head_input is not None and self.head is not None:
            self._handles.append(head_input.register_forward_hook(self._head_input_hook))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @contextlib.contextmanager
    def capture(self, input_ids: Tensor, loss_mask: Tensor, lengths: list[int]):
        """Arm the hooks for one micro-batch's forward (right-padded rows, real `lengths` as host ints); the
        caller then runs `norms`. Whether the log-probs pack the rows is read off the first layer's tokens."""
        self._choices = (Layout.of(input_ids, loss_mask, lengths, packed=True),
                         Layout.of(input_ids, loss_mask, lengths, packed=False))  # fmt: skip
        self.layout, self._head_h = None, None
        for L in self.layers:
            L.saved, L.saved_out, L.forwards, L.fired = None, None, 0, 0
        self._armed = True
        try:
            yield self
        finally:
            self._armed = False

    def _pick(self, n_tokens: int) -> Layout:
        """The layout whose token count the decoder input has (packed: Σ lengths; padded: B·T)."""
        if self.layout is None:
            for lay in self._choices:
                if lay.seg.shape[0] == n_tokens:
                    self.layout = lay
                    break
            else:
                raise RuntimeError(
                    f"ghost norms: a layer saw {n_tokens} tokens; the micro-batch holds "
                    f"{self._choices[0].seg.shape[0]} real tokens in {self._choices[1].seg.shape[0]} places"
                )
        return self.layout

    def norms(self, f: Tensor, *, retain_graph: bool) -> Tensor:
        """[n] float64 ‖∇θ f_i‖² after the forward that made `f` = Σ_i f_i: a backward that computes only the
        layers' output gradients (no parameter gradient is accumulated), the hooks summing their norms."""
        layout = self.layout
        if layout is None:
            raise RuntimeError(
                "ghost norms: no hooked layer ran with gradients in the forward (outside capture?)"
            )
        self.sq = torch.zeros(layout.n, dtype=torch.float64, device=f.device)
        head_fn = self.head is not None and (self._head_layer is None or self._head_layer.forwards == 0)
        if self.tied is not None and not head_fn:
            raise GhostUnsupported(
                "ghost norms: a head tied to the embedding ran as a module (not through the chunked log-probs); "
                "set algorithm.opob_norms: backward"
            )
        silent = [L.path for L in self.layers if L.forwards == 0 and not (head_fn and L.module is self.head)]
        if silent:  # a weight used as a function (not through its module) would leave its norm out unseen
            raise RuntimeError(
                f"ghost norms: {silent} ran no forward through their module (a weight used as a function?); "
                "pass the head as GhostNorms(head=...) or set algorithm.opob_norms: backward"
            )
        inputs = [L.saved_out for L in self.layers if L.saved_out is not None]
        if head_fn:
            assert self._head_h is not None, "GhostNorms: the head input's forward did not run"
            inputs.append(self._head_h[0])
        try:
            torch.autograd.grad(f, inputs, retain_graph=retain_graph, allow_unused=True)
        finally:
            for L in self.layers:
                L.saved_out = None
        if head_fn:
            self._add_head()
        for L in self.layers:
            if L.forwards and not L.fired and L.module is not self.head:
                raise RuntimeError(
                    f"ghost norms: {type(L.module).__name__} ran with gradients but its output gradient was "
                    "never seen (its output is not on the path to the log-probs?)"
                )
        sq, self.sq, self.layout = self.sq, None, None
        return sq

    # -- hooks ------------------------------------------------------------------------------------------------

    def _forward_hook(self, layer: _Layer):
        def hook(module: nn.Module, args: tuple, out) -> None:
            if not self._armed or self._busy or not torch.is_grad_enabled():
                return
            y = out[0] if isinstance(out, tuple) else out
            if not (isinstance(y, Tensor) and y.requires_grad):
                return
            x = args[0]
            n = x.numel() if layer.kind == "embedding" else x.numel() // x.shape[-1]
            if layer.kind == "vector" and x.dim() >= 3:
                n = x.shape[0] * x.shape[1]
            self._pick(n)
            dev = y.device.type
            amp = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
            layer.saved = (tuple(a.detach() if isinstance(a, Tensor) else a for a in args), amp)
            layer.forwards += 1
            layer.saved_out = y
            y.register_hook(self._grad_hook(layer))

        return hook

    def _head_input_hook(self, module: nn.Module, args: tuple, out) -> None:
        if not self._armed or not torch.is_grad_enabled():
            return
        h = getattr(out, "last_hidden_state", out)
        if isinstance(h, Tensor) and h.requires_grad:
            self._pick(h.numel() // h.shape[-1])
            dev = h.device.type
            self._head_h = (h, torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None)

    def _grad_hook(self, layer: _Layer):
        def hook(g: Tensor) -> None:
            if self.sq is None or layer.saved is None:
                return
            layer.fired += 1
            args, amp = layer.saved
            pad = getattr(layer.module, "padding_idx", None) if layer.kind == "embedding" else None
            if pad is not None:  # nn.Embedding(padding_idx) gives that row no gradient through the lookup
                g = g * (args[0] != pad)[..., None].to(g.dtype)
            self._busy = True  # a layer run again here (vector parameters) must not re-arm its own hooks
            try:
                with torch.no_grad(), torch.autocast(g.device.type, enabled=False):
                    sq = _LAYER_SQ[layer.kind](self.layout, layer, args, amp, g)
                    self._add(layer.path, sq)
                    if layer is self.tied:
                        self._tied_grad = (args[0].reshape(-1), g.reshape(-1, g.shape[-1]))
            finally:
                self._busy = False

        return hook

    def _add_head(self) -> None:
        """The functional head's norms: its output gradient c_t (e_{y_t} − p_t) formed again from the saved input,
        one trajectory at a time (a [width, vocab] block, never the micro-batch's [tokens, vocab]). Tied to the
        embedding, the head's share is ‖H_i‖² + 2⟨E_i, H_i⟩ (E_i the embedding's gradient, whose ‖E_i‖² its
        hook added): ⟨E_i, H_i⟩ = Σ_{t,s} D_i[s, y_t] (x_s·γ_t)."""
        assert self._head_h is not None and self.head is not None and self.layout is not None
        h, amp = self._head_h
        layout = self.layout
        with torch.no_grad(), torch.autocast(h.device.type, enabled=False):
            x = h.detach().reshape(-1, h.shape[-1])
            w, b = self.head.weight, self.head.bias
            xs, ws = (x.to(amp), w.to(amp)) if amp is not None else (x, w)
            dt = torch.float64 if xs.dtype == torch.float64 else torch.float32
            xp = _padded(layout, xs.to(dt))
            tp = _padded(layout, layout.targets[:, None].to(dt))[..., 0].long()
            cp = _padded(layout, layout.coef[:, None].to(dt))[..., 0]
            tied = None
            if self.tied is not None:
                if self._tied_grad is None:
                    raise RuntimeError("ghost norms: the tied embedding's output gradient was never seen")
                ids, g_emb = self._tied_grad
                tied = (_padded(layout, ids[:, None].to(dt))[..., 0].long(), _padded(layout, g_emb.to(dt)))
            sq = torch.zeros(layout.n, dtype=torch.float64, device=x.device)
            for i in range(layout.n):
                z = (xp[i].to(ws.dtype) @ ws.t()).to(dt)
                if b is not None:
                    z = z + b.to(dt)
                d = -torch.softmax(z, -1)
                d.scatter_add_(1, tp[i][:, None], torch.ones_like(cp[i])[:, None])
                d *= cp[i][:, None]  # [width, vocab]; rows past the trajectory's end are 0
                one = Layout(layout.seg.new_zeros(xp.shape[1]), torch.arange(xp.shape[1], device=x.device), 1,
                             xp.shape[1], tp[i], cp[i])  # fmt: skip
                sq[i] = linear_sq(one, xp[i], d, bias=b is not None)[0]
                if tied is not None:
                    ids_i, g_i = tied[0][i], tied[1][i]  # rows past the end: id 0, gradient 0
                    sq[i] += 2 * (d[:, ids_i] * (xp[i] @ g_i.t())).sum(dtype=torch.float64)
            path = self._head_layer.path if self._head_layer is not None else "head"
            self._add(path, sq)
        self._tied_grad = None

    def _add(self, path: str, sq: Tensor) -> None:
        assert self.sq is not None
        self.sq += sq
        if self.by_layer is not None:
            self.by_layer[path] = self.by_layer.get(path, 0) + sq


def _kind(m: nn.Module, own: list[nn.Parameter]) -> str | None:
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, nn.Embedding):
        return "embedding"
    if all(p.dim() == 1 for p in own) and "norm" in type(m).__name__.lower():
        return "vector"  # a norm's scale (and shift): used elementwise on the normalised input
    names = {n for n, _ in m.named_parameters(recurse=False)}
    if {"gate_up_proj", "down_proj"} <= names and all(p.dim() == 3 for p in own) and hasattr(m, "act_fn"):
        return "experts"
    if names == {"weight"} and own[0].dim() == 2 and hasattr(m, "top_k"):
        return "router"
    return None


def _linear(layout: Layout, layer: _Layer, args: tuple, amp, g: Tensor) -> Tensor:
    m = layer.module
    x = args[0]
    x = x.to(amp) if amp is not None else x
    return linear_sq(layout, x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), bias=m.bias is not None)


def _embedding(layout: Layout, layer: _Layer, args: tuple, amp, g: Tensor) -> Tensor:
    return embedding_sq(layout, args[0].reshape(-1), g.reshape(-1, g.shape[-1]))


def _vector(layout: Layout, layer: _Layer, args: tuple, amp, g: Tensor) -> Tensor:
    """Run the layer again with one copy of each vector parameter per trajectory; autograd gives each copy's
    gradient. The copies are indexed per token, so any elementwise use of the vector is covered."""
    m = layer.module
    x = args[0]
    n_tok = layout.seg.shape[0]
    lead = x.shape[:2] if x.dim() >= 3 and x.shape[0] * x.shape[1] == n_tok else x.shape[:1]
    extra = x.dim() - len(lead) - 1
    with (
        torch.enable_grad(),
        torch.autocast(g.device.type, dtype=amp or torch.float32, enabled=amp is not None),
    ):
        copies = {
            n: getattr(m, n).detach().expand(layout.n, -1).clone().requires_grad_() for n in layer.names
        }
        seg = layout.seg.reshape(lead)
        per_tok = {n: c[seg].reshape(*lead, *([1] * extra), c.shape[-1]) for n, c in copies.items()}
        y = functional_call(m, per_tok, (x.detach(), *args[1:]))
        grads = torch.autograd.grad(y, list(copies.values()), g)
    return sum(gr.double().pow(2).sum(-1) for gr in grads)


def _router(layout: Layout, layer: _Layer, args: tuple, amp, g: Tensor) -> Tensor:
    x = args[0]
    x = x.to(amp) if amp is not None else x
    return linear_sq(layout, x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]))


def _experts(layout: Layout, layer: _Layer, args: tuple, amp, g: Tensor) -> Tensor:
    """HF fused experts: out_t = Σ_k w_tk · down_e(act(gate_e x_t) ⊙ up_e x_t), e = top_k_index[t, k]. Per expert,
    its tokens' gradients at its two matrices' outputs, then the linear rule (trajectories grouped as usual)."""
    m = layer.module
    x, top_i, top_w = args[0], args[1], args[2]
    x2 = x.reshape(-1, x.shape[-1])
    g2 = g.reshape(-1, g.shape[-1]).float()
    sq = torch.zeros(layout.n, dtype=torch.float64, device=g.device)
    n_exp = m.gate_up_proj.shape[0]
    for e in range(n_exp):
        tok, k = torch.where(top_i == e)
        if tok.numel() == 0:
            continue
        sub = Layout(layout.seg[tok], torch.arange(tok.numel(), device=tok.device), layout.n, tok.numel(),
                     layout.targets[tok], layout.coef[tok])  # fmt: skip
        with (
            torch.enable_grad(),
            torch.autocast(g.device.type, dtype=amp or torch.float32, enabled=amp is not None),
        ):
            xe = x2[tok].detach()
            gu = nn.functional.linear(xe, m.gate_up_proj[e].detach()).detach().requires_grad_()
            gate, up = gu.chunk(2, dim=-1)
            h = m.act_fn(gate) * up
            hd = h.detach().requires_grad_()
            y = nn.functional.linear(hd, m.down_proj[e].detach()) * top_w[tok, k, None].detach()
            dy = g2[tok].to(y.dtype)
            (d_hd,) = torch.autograd.grad(y, [hd], dy)
            (d_gu,) = torch.autograd.grad(h, [gu], d_hd)
            d_out = (dy.float() * top_w[tok, k, None].float()).to(dy.dtype)
        # per-trajectory sums restricted to the expert's tokens: pos in the padded block by rank within the seg
        sub = _rank_in_seg(sub)
        xs = xe.to(amp) if amp is not None else xe
        hs = hd.detach().to(amp) if amp is not None else hd.detach()
        sq += linear_sq(sub, xs, d_gu) + linear_sq(sub, hs, d_out)
    return sq


def _rank_in_seg(layout: Layout) -> Layout:
    """The same tokens with `pos` renumbered 0.. within each trajectory (their order kept)."""
    seg = layout.seg
    order = torch.argsort(seg, stable=True)
    counts = torch.bincount(seg, minlength=layout.n)
    starts = counts.cumsum(0) - counts
    pos = torch.empty_like(seg)
    pos[order] = torch.arange(seg.numel(), device=seg.device) - starts[seg[order]]
    width = int(counts.max()) if seg.numel() else 1
    return Layout(seg, pos, layout.n, max(width, 1), layout.targets, layout.coef)


_LAYER_SQ = {"linear": _linear, "embedding": _embedding, "vector": _vector, "router": _router,
             "experts": _experts}  # fmt: skip
