"""The train-inference mismatch: how far the engine's log-probs are from the learner's for the same weights.

On the tokens a step trains that were sampled by the learner's current version (the weights it holds
before the update), log μ (engine) and log π (learner) should be equal; what is left is numerics
(kernels, dtype, batch shapes) or a bug (a template, a tokenizer, an adapter that was never synced).
Tokens of older versions differ by design (that is staleness) and are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agent_rl.batch import LearnerBatch


def mismatch_metrics(
    batches: Sequence[LearnerBatch], logprobs: Sequence[torch.Tensor], version: int, threshold: float
) -> dict[str, float]:
    """mean / max / RMS of |log π − log μ| and the share above `threshold` over loss tokens of `version`;
    `logprobs[i]` is the learner's [B, T] log π for `batches[i]` at the pre-update weights."""
    gaps = []
    for b, lp in zip(batches, logprobs, strict=True):
        p = b.policy
        fresh = (p.loss_mask > 0) & (b.versions == version)
        gaps.append((lp[:, : p.input_ids.shape[1]].float() - p.behavior_logprobs.float()).abs()[fresh])
    gap = torch.cat(gaps) if gaps else torch.zeros(0)
    out = {"rollout/logprob_mismatch_tokens": float(gap.numel())}
    if gap.numel():
        out |= {
            "rollout/logprob_mismatch_mean": float(gap.mean()),
            "rollout/logprob_mismatch_max": float(gap.max()),
            "rollout/logprob_mismatch_frac": float((gap > threshold).float().mean()),
            # the RMS log-ratio (Fast-LLM's and benchmarks/fp32_head.py's measure): weighs the large gaps more
            "rollout/logprob_mismatch_rms": float(gap.double().square().mean().sqrt()),
        }
    return out
