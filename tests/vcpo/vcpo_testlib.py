"""Shared helpers for the vcpo tests: a tiny float64 causal LM, batches, a gloo launcher."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_exit import exit_worker
from torch import nn

from vcpo import PolicyBatch, logprobs_of

# Two algebraically equal float64 computations of an update at these toy sizes (TinyLM; the Qwen2 of
# test_vcpo_hf: reductions of at most 64 terms, at most ~12 chained, 12 trajectories) differ by at most
# depth·n·u ≈ 12·64·1.1e-16 ≈ 1e-13 relative (Higham's worst case, u = eps64 / 2), on any kernels and thread
# count. These bounds leave four orders of margin; a real difference (another update, a term missing) is O(1).
F64_RTOL, F64_ATOL = 1e-9, 1e-12


class TinyLM(nn.Module):
    """A causal LM small enough for per-trajectory gradients in milliseconds: prefix-mean mixing."""

    def __init__(self, vocab: int = 24, hidden: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        h = self.emb(input_ids)
        steps = torch.arange(1, h.shape[1] + 1, dtype=h.dtype)[None, :, None]
        h = h + torch.tanh(self.mix(h.cumsum(1) / steps))  # position t sees tokens <= t only
        return SimpleNamespace(logits=self.head(h))


def tiny_model(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM().double()


def make_batch(
    model: nn.Module,
    *,
    groups: int = 3,
    per_group: int = 4,
    width: int = 12,
    staleness: float = 0.3,
    seed: int = 1,
    binary: bool = False,
) -> PolicyBatch:
    """Random trajectories of varied length; behaviour log-probs = current ones plus noise (stale sampler)."""
    g = torch.Generator().manual_seed(seed)
    b = groups * per_group
    vocab = model.head.out_features
    ids = torch.randint(0, vocab, (b, width), generator=g)
    lengths = torch.randint(width // 2, width + 1, (b,), generator=g)
    pos = torch.arange(width)[None, :]
    am = (pos < lengths[:, None]).long()
    lm = ((pos >= 3) & (am > 0)).double()
    with torch.no_grad():
        cur = logprobs_of(model, ids, am).double()
    noise = staleness * torch.randn(b, width, generator=g, dtype=torch.float64)
    blp = torch.where(lm > 0, (cur + noise).clamp(max=0.0), 0.0)
    rewards = (torch.rand(b, generator=g) < 0.5).double() if binary else torch.rand(b, generator=g).double()
    gid = torch.arange(groups).repeat_interleave(per_group)
    return PolicyBatch(ids, am, lm, blp, rewards, gid)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn, world: int, port: int, args: tuple) -> None:  # noqa: ANN001
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    fn(rank, world, *args)
    exit_worker()


def run_gloo(fn, world: int, *args: object) -> None:  # noqa: ANN001
    """Run fn(rank, world, *args) in ``world`` spawned processes joined by a gloo group on 127.0.0.1."""
    mp.spawn(_entry, args=(fn, world, free_port(), args), nprocs=world, join=True)
