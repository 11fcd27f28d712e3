"""How far two computations of the same float quantity may drift apart when only their rounding differs
(other kernels: another CPU, ATEN_CPU_CAPABILITY, another thread count, another batch shape or summation
order), derived from the arithmetic instead of from what passed on one CPU. `make test-cpus` runs the suite
under several kernel sets and thread counts to check them.

Reordering a sum of n terms moves it by at most n·u·Σ|terms|, u = eps/2 the unit roundoff (Higham, Accuracy
and Stability of Numerical Algorithms, 2nd ed., §4.2); rounding errors whose signs are independent add like a
random walk, √n·u·Σ|terms| (ibid. §2.8), and a four-sigma bound on that walk is what a test can rely on
without holding the worst case, which is never reached. A value computed through a chain of `depth` such
reductions (a network's layers) carries the sum of their errors.
"""

from __future__ import annotations

import math

import torch

EPS32 = float(torch.finfo(torch.float32).eps)  # 1.19e-7
EPS64 = float(torch.finfo(torch.float64).eps)  # 2.2e-16


def drift(n: int, depth: int, scale: float, *, eps: float = EPS32, sigmas: float = 4.0) -> float:
    """Bound on |a − b| for two roundings of a value of magnitude ~`scale` computed through `depth` chained
    reductions of at most `n` terms each: depth · sigmas · √n · (eps / 2) · scale."""
    return depth * sigmas * math.sqrt(n) * (eps / 2) * scale


def logprob_atol(logit_scale: float = 8.0) -> float:
    """Log-probs of the tests' tiny models (agent_rl.tools.tiny: 2 layers, hidden 128, intermediate 512, vocab
    512, contexts up to 512 tokens) in float32, computed twice (engine vs Hugging Face forward, cached vs
    uncached decode, another batch or thread count): the longest reduction has n = 512 terms (attention over
    the context, the MLP's down projection, the vocabulary's log-sum-exp); a log-prob passes through depth = 17
    of them (per layer: norm, q/k/v, scores, attention sum, output projection, norm, gate/up, down; then the
    final norm, lm_head, log-softmax), with logits of magnitude `logit_scale` (at most ~8 for the random tiny
    model, whose log-probs are ~ -6.2; larger for a model over-fitted to an answer: pass its largest |logit|)."""
    return drift(512, 17, max(8.0, logit_scale))


# drift(512, 17, 8) = 7.3e-4. A real difference (another token, another weight version, a wrong position or
# mask) moves log-probs by 1e-2 or more (one version apart in the kill-resume test: 1.3e-2).
TINY_LOGPROB_ATOL = logprob_atol()


def sum_atol(n: int, atol: float = TINY_LOGPROB_ATOL) -> float:
    """A sum of n per-token differences, each within `atol` (a four-sigma bound on independent rounding):
    four sigmas of their random walk, √n·atol (a sequence's log importance weight: Σ_t log π − log μ)."""
    return math.sqrt(n) * atol
