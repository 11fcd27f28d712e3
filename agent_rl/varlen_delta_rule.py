"""Gated DeltaNet over packed documents: the short causal convolution and the chunked gated delta rule with
every document's state starting afresh (or from its own given state) at its boundary, in pure torch.

A packed row holds several documents (trajectories, prompts) back to back; `bounds` = (0, e₁, e₂, ..., N) says
where each ends, as Python ints (no device read). What a Gated DeltaNet layer carries along the sequence, the
last K-1 conv inputs and the [d_k, d_v] recurrent state per value head, must not flow from one document into the
next: NVIDIA Automodel#2131 measured a layer difference of 0.40 from that leak, torchtitan PR#3892 saw the trainer
and generator disagree. transformers' torch fallback of the rule takes no boundaries (it refuses `cu_seqlens`
without flash-linear-attention), and with fla installed its causal convolution still runs over the whole row.

- `causal_conv1d_varlen`: the depthwise causal conv (kernel K, no bias) with K-1 zeros (or the document's own
  previous inputs) laid before each document, one `F.conv1d` over the whole row: each output sees only its own
  document's inputs, as the conv of the document alone computes it.
- `chunk_gated_delta_rule_varlen`: the chunked (UT-transform) form of the rule as transformers'
  `torch_chunk_gated_delta_rule` computes it for one sequence (chunks of 64, q and k L2-normalised in fp32, q
  scaled by d_k^-½), with every document starting at a chunk boundary of its own (its last chunk zero-padded:
  β = 0, g = 0 there leave the state untouched). The intra-chunk work runs over all documents' chunks at once;
  the scan over chunks runs the documents side by side, one state per document, longest first, so a step
  updates the documents that still have a chunk at that index. Each document's state is its own tensor row from
  its first chunk on: nothing of another document can reach it. Work: the real tokens rounded up to 64 per
  document (a padded batch computes every row to the longest), and as many scan steps as the longest document
  has chunks.

Hand-written because no library has it for CPU: flash-linear-attention (`fla.ops.gated_delta_rule`, Triton,
GPU only) takes `cu_seqlens` and is used instead of the torch rule when it is installed (`fla_available`); that
path is not run here (no GPU, fla not installed) and is listed in docs/not-tested.md.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 64  # transformers' and fla's chunk size


@functools.cache
def fla_available() -> bool:
    """Whether flash-linear-attention is importable (its kernels are Triton: CUDA tensors only)."""
    return importlib.util.find_spec("fla") is not None


@dataclass(frozen=True)
class ChunkPlan:
    """Where the documents' tokens go in a chunk-aligned buffer, and the scan's schedule (host tensors)."""

    slot: torch.Tensor  # [N] each token's row in the [chunks · CHUNK] buffer
    order: tuple[int, ...]  # documents, most chunks first
    steps: tuple[tuple[int, torch.Tensor], ...]  # per chunk index j: (active documents a_j, their chunk ids)
    inverse: torch.Tensor  # [chunks]: where each chunk's output sits in the scan's concatenated outputs
    chunks: int
    counts: tuple[int, ...]  # chunks per document

    @staticmethod
    def of(bounds: tuple[int, ...], chunk: int = CHUNK) -> ChunkPlan:
        lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        counts = [-(-n // chunk) for n in lengths]
        first = [0]
        for c in counts[:-1]:
            first.append(first[-1] + c)
        slot = torch.cat(
            [torch.arange(n) + f * chunk for n, f in zip(lengths, first, strict=True)]
            or [torch.zeros(0, dtype=torch.long)]
        )
        order = sorted(range(len(counts)), key=lambda d: -counts[d])
        steps, seen = [], []
        for j in range(max(counts, default=0)):
            active = sum(1 for d in order if counts[d] > j)
            ids = torch.tensor([first[d] + j for d in order[:active]], dtype=torch.long)
            steps.append((active, ids))
            seen.append(ids)
        total = sum(counts)
        inverse = torch.empty(total, dtype=torch.long)
        if total:
            inverse[torch.cat(seen)] = torch.arange(total)
        return ChunkPlan(slot, tuple(order), tuple(steps), inverse, total, tuple(counts))


def causal_conv1d_varlen(
    x: torch.Tensor, weight: torch.Tensor, bounds: tuple[int, ...], initial: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, C] (the packed documents), weight [C, K] → (the conv's output [N, C] before the activation, each
    document's last K-1 inputs [D, C, K-1]). `initial` [D, C, K-1]: the inputs before each document (a continued
    sequence); zeros when None. Computed in weight's dtype (as transformers' `causal_conv1d_fn`), returned in x's."""
    n, c = x.shape
    k1 = weight.shape[-1] - 1
    d = len(bounds) - 1
    # document i's tokens sit after (i + 1) gaps of K-1: its own preceding inputs
    where = torch.cat(
        [
            torch.arange(a, b) + (i + 1) * k1
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
        or [torch.zeros(0, dtype=torch.long)]
    ).to(x.device)
    # each document's gap of K-1 starts where its tokens would start without the gaps before it
    gap_at = torch.tensor([a + i * k1 for i, a in enumerate(bounds[:-1])], dtype=torch.long)
    gap_rows = (gap_at[:, None] + torch.arange(k1)[None, :]).flatten().to(x.device)  # [D·(K-1)]
    buf = x.new_zeros(n + d * k1, c).index_copy(0, where, x)
    if initial is not None and k1 > 0:
        buf = buf.index_copy(0, gap_rows, initial.to(x.dtype).transpose(1, 2).reshape(d * k1, c))
    out = F.conv1d(buf.t()[None].to(weight.dtype), weight[:, None, :], groups=c)[0].t()  # [N + (D-1)(K-1), C]
    out = out[where - k1].to(x.dtype)
    # the K-1 inputs ending at each document's last token (its gap included where the document is shorter)
    ends = torch.tensor([b + (i + 1) * k1 for i, b in enumerate(bounds[1:])], dtype=torch.long)
    last = (ends[:, None] - k1 + torch.arange(k1)[None, :]).to(x.device)  # [D, K-1]
    return out, buf[last].transpose(1, 2)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # as transformers and fla normalise q and k


def chunk_gated_delta_rule_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    bounds: tuple[int, ...],
    *,
    initial_state: torch.Tensor | None = None,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over packed documents, q and k L2-normalised in the kernel (Qwen3-Next's setting).

    q, k [N, Hk, dk]; v [N, Hv, dv] (Hv a multiple of Hk: each q/k head serves Hv/Hk value heads); g (log decay,
    <= 0) and beta [N, Hv]; `initial_state` [D, Hv, dk, dv] (zeros when None). Returns (output [N, Hv, dv] in
    q's dtype, each document's final state [D, Hv, dk, dv] fp32)."""
    n, hk, dk = k.shape
    hv, dv = v.shape[-2:]
    dtype = q.dtype
    plan = ChunkPlan.of(bounds, chunk)
    dev = q.device
    if hv != hk:
        q, k = q.repeat_interleave(hv // hk, dim=1), k.repeat_interleave(hv // hk, dim=1)
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    q, k = _l2norm(q), _l2norm(k)
    q = q * dk**-0.5
    m, slot = plan.chunks, plan.slot.to(dev)

    def chunked(
        t: torch.Tensor,
    ) -> torch.Tensor:  # [N, H, ...] -> [M, H, C, ...], zero past each document's end
        buf = t.new_zeros(m * chunk, *t.shape[1:]).index_copy(0, slot, t)
        return buf.view(m, chunk, *t.shape[1:]).transpose(1, 2)

    q, k, v, g, beta = (chunked(t) for t in (q, k, v, g, beta))  # [M, H, C, d] / [M, H, C]
    cum = g.cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=dev).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [M, H, C, C]
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # I + its strict lower part is the UT system
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    q_in = q * cum.exp()[..., None]  # reads the state carried into the chunk
    k_out = k * (cum[..., -1:] - cum).exp()[..., None]  # writes into the state carried out of it
    chunk_decay = cum[..., -1].exp()[..., None, None]

    d = len(bounds) - 1
    state = torch.zeros(d, hv, dk, dv, device=dev) if initial_state is None else initial_state.float().to(dev)
    order = torch.tensor(plan.order, dtype=torch.long, device=dev)
    s = state[order]  # one state row per document, longest first
    finals: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    for j, (active, ids) in enumerate(plan.steps):
        ids = ids.to(dev)
        s = s[:active]
        v_new = u[ids] - w[ids] @ s
        outs.append(q_in[ids] @ s + intra[ids] @ v_new)
        s = s * chunk_decay[ids] + k_out[ids].transpose(-1, -2) @ v_new
        after = plan.steps[j + 1][0] if j + 1 < len(plan.steps) else 0
        finals.append(s[after:active])  # the documents whose last chunk this was
    # finals[j] holds the documents at places [a_(j+1), a_j) of `order`: reversed, they run from place 0 on; the
    # documents without tokens (the last places) keep their initial state
    empty = sum(1 for c in plan.counts if c == 0)
    final_sorted = torch.cat([*finals[::-1], state[order[d - empty :]]])
    final = torch.empty_like(final_sorted).index_copy(0, order, final_sorted)
    if not outs:
        return v.new_zeros(0, hv, dv).to(dtype), final
    out = torch.cat(outs)[plan.inverse.to(dev)]  # [M, H, C, dv] in chunk order
    out = out.transpose(1, 2).reshape(m * chunk, hv, dv)[slot]
    return out.to(dtype), final


def fla_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    bounds: tuple[int, ...],
    *,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_gated_delta_rule_varlen`'s contract through flash-linear-attention's kernel (CUDA only; not run
    here). q and k are repeated to the value heads, which every fla version accepts."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    hk, hv = k.shape[1], v.shape[1]
    if hv != hk:
        q, k = q.repeat_interleave(hv // hk, dim=1), k.repeat_interleave(hv // hk, dim=1)
    cu = torch.tensor(bounds, dtype=torch.long, device=q.device)
    out, final = chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=initial_state,
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )  # fmt: skip
    return out[0], final
