"""The off-policy optimal baseline (OPOB) in closed form.

The estimator the learner uses for one prompt group is Σ_i w̃_i (R_i − b) g_i, with g_i the
gradient that multiplies trajectory i's advantage in the loss. Its variance (trace of the
covariance, samples independent) is Σ_i w̃_i² ‖g_i‖² (R_i − b)² + const, minimised by

    b* = Σ_j w̃_j² ‖g_j‖² R_j / Σ_j w̃_j² ‖g_j‖²,

a reward average weighted by how much each sample moves the parameters. The loss averages
tokens within a trajectory, so the g_i that multiplies the advantage is ∇ mean_t log π(τ_i)
= ∇log π(τ_i) / L_i; the driver measures that one (exactly, or by the logit proxy). Two
choices of weight are offered (``opob_weight`` in the driver):

- default: ``log_w = log w̃`` (the truncated weight that multiplies the loss), power 2;
  without truncation that is the README formula w²‖∇log π‖².
- reference (mit-han-lab/vcpo): the norm is taken of the already-w̃-weighted gradient of the
  token-summed log-likelihood and multiplied by w² again, i.e. ``log_w = log w̃ + s`` and
  ``grad_sq_norms = L² ‖g‖²`` (w̃² w² ‖∇Σ_t log π‖²). Kept for reproducing the paper's runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vcpo.advantages import dense_groups
from vcpo.importance import _check_log_weights


def opob_baseline(
    rewards: Tensor,
    log_w: Tensor,
    grad_sq_norms: Tensor,
    group_ids: Tensor,
    *,
    weight_power: float = 2,
    eps: float = 1e-8,
    num_groups: int | None = None,
    check: bool = True,
) -> Tensor:
    """Per-trajectory b_g = Σ_j w_j^p ‖g_j‖² R_j / Σ_j w_j^p ‖g_j‖² over j in the same group.

    The weights are formed in log space and shifted by the group's max before
    exponentiating, so log-weights of ±1e4 are fine. Squared norms at most ``eps`` count as
    zero; a group where every weight is zero falls back to its plain mean reward.

    `num_groups`: the group ids are already 0..num_groups-1 (no `torch.unique`, no read of their max); `check=False`
    leaves the inputs' finiteness checks to the caller. Both spare a read that on a GPU waits for the device.
    """
    n = rewards.shape[0]
    for name, t in (("log_w", log_w), ("grad_sq_norms", grad_sq_norms), ("group_ids", group_ids)):
        if t.shape != (n,):
            raise ValueError(
                f"opob_baseline: {name} has shape {tuple(t.shape)}, expected ({n},) like rewards"
            )
    lw = _check_log_weights(log_w, "opob_baseline") if check else log_w.detach().double().flatten()
    gsq = grad_sq_norms.detach().double()
    if check and bool((~torch.isfinite(gsq) | (gsq < 0)).any()):
        raise ValueError(f"opob_baseline: grad_sq_norms must be finite and >= 0, got {gsq.tolist()}")
    r = rewards.detach().double()
    log_v = torch.where(gsq > eps, weight_power * lw + torch.log(gsq.clamp(min=eps)), -torch.inf)

    index, g = dense_groups(group_ids, num_groups)
    zeros = torch.zeros(g, dtype=torch.float64, device=r.device)
    gmax = torch.full((g,), -torch.inf, dtype=torch.float64, device=r.device)
    gmax = gmax.scatter_reduce(0, index, log_v, reduce="amax")
    live = torch.isfinite(gmax)
    shift = torch.where(live, gmax, 0.0)
    v = torch.exp(log_v - shift[index])  # largest weight in each live group is exactly 1
    num = zeros.index_add(0, index, v * r)
    den = zeros.index_add(0, index, v)
    count = zeros.index_add(0, index, torch.ones_like(r))
    mean = zeros.index_add(0, index, r) / count
    b = torch.where(live, num / den.clamp(min=1.0), mean)
    return b[index].to(rewards.dtype if rewards.is_floating_point() else torch.float64)
