"""Policy losses behind one switch, so the paper's comparison can be rerun by name.

Every loss maps per-token current log-probs (differentiable), behaviour log-probs, the loss
mask and one advantage per trajectory to a per-trajectory loss ℓ_i; the driver minimises
Σ_i ℓ_i / N. Token terms are averaged within a trajectory (token-mean), never KL-regularised.
Ratios are always current / behaviour (π/μ): with one update per batch there is no separate
"old" policy. When behaviour equals current every loss has the vanilla REINFORCE gradient
−A_i ∇ mean_t log π.

Losses with one weight per trajectory (``seq_log_weight`` set) have the form
ℓ_i = −w̃_i A_i mean_t log π; only those admit the OPOB baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # token ratios are exp(clamp(δ, ±20)): finite, and far past every clip range


@dataclass(frozen=True)
class LossInputs:
    logprobs: Tensor  # [b, T] log π of each token, differentiable
    behavior_logprobs: Tensor  # [b, T] log μ
    loss_mask: Tensor  # [b, T] float, 1 on tokens that count
    advantages: Tensor  # [b] detached
    is_truncation: float  # c, the IS truncation of the step config
    extra: Mapping[str, float] = field(default_factory=dict)  # batch statistics from LossSpec.prepare


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # [b] per-trajectory loss ℓ_i
    clipped_tokens: Tensor  # [b] loss tokens whose weight was truncated, clipped or masked


SeqLogWeight = Callable[[Tensor, float], Tensor]  # (s [b] float64, c) -> log w̃ [b] (-inf = rejected)
Prepare = Callable[..., dict[str, float]]  # (δ² of local loss tokens, group, **kwargs) -> extra


@dataclass(frozen=True)
class LossSpec:
    name: str
    fn: Callable[..., LossOutput]  # fn(inputs, **kwargs)
    defaults: Mapping[str, float]  # accepted kwargs and their defaults
    doc: str
    seq_log_weight: SeqLogWeight | None = None  # set for sequence-weighted losses (OPOB-compatible)
    prepare: Prepare | None = None  # needs every token's current log-ratio before any backward


def _count(mask: Tensor) -> Tensor:
    return mask.sum(-1).clamp(min=1.0)


def token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over each row's loss tokens; 0 for a row without any."""
    return (x * mask).sum(-1) / _count(mask)


def _delta(inp: LossInputs, *, grad: bool) -> Tensor:
    lp = inp.logprobs if grad else inp.logprobs.detach()
    return torch.where(inp.loss_mask > 0, lp - inp.behavior_logprobs.to(lp.dtype), 0.0)


def _ratio(delta: Tensor) -> Tensor:
    return torch.exp(delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _seq_s(inp: LossInputs) -> Tensor:
    return torch.where(
        inp.loss_mask > 0, inp.logprobs.detach().double() - inp.behavior_logprobs.double(), 0.0
    ).sum(-1)


def kl_k3_sum(logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-row Σ_t (r − 1 − log r), r = π/μ: the k3 estimate of KL(μ‖π) from tokens sampled by μ.

    Non-negative and unbiased; the log-ratio is clamped to ±20 so exp() stays finite.
    """
    d = torch.where(mask > 0, logp.detach().double() - behavior_logp.double(), 0.0)
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return ((torch.exp(d) - 1.0 - d) * mask).sum(-1)


def sequence_weighted(seq_log_weight: SeqLogWeight, *, corrects: bool = True) -> Callable[..., LossOutput]:
    """ℓ_i = −w̃_i A_i mean_t log π, with log w̃ = seq_log_weight(s, c).

    ``corrects``: w̃ is a truncated/masked version of w, so w̃ != w counts as clipped.
    """

    def fn(inp: LossInputs) -> LossOutput:
        s = _seq_s(inp)
        log_wt = seq_log_weight(s, inp.is_truncation)
        wt = torch.exp(log_wt).to(inp.logprobs.dtype)
        mean_lp = token_mean(inp.logprobs, inp.loss_mask)
        loss = -(wt * inp.advantages.to(mean_lp.dtype)).detach() * mean_lp
        clipped = torch.where((log_wt != s) & corrects, inp.loss_mask.sum(-1), 0.0)
        return LossOutput(loss=loss, clipped_tokens=clipped)

    return fn


def _no_weight(s: Tensor, c: float) -> Tensor:
    return torch.zeros_like(s)


def _truncate(s: Tensor, c: float) -> Tensor:
    return s.clamp(max=math.log(c))


def _reject(s: Tensor, c: float) -> Tensor:
    return torch.where(s <= math.log(c), s, -torch.inf)


def tis_token(inp: LossInputs) -> LossOutput:
    """Token-level truncated IS: −A mean_t sg(min(r_t, c)) log π_t."""
    d = _delta(inp, grad=False)
    log_c = math.log(inp.is_truncation)
    w = torch.exp(d.clamp(max=log_c))
    loss = -inp.advantages[:, None] * w * inp.logprobs
    return LossOutput(token_mean(loss, inp.loss_mask), ((d > log_c).float() * inp.loss_mask).sum(-1))


def icepop(inp: LossInputs, *, alpha: float, beta: float) -> LossOutput:
    """IcePop: token IS weight r_t kept only inside [alpha, beta], tokens outside masked."""
    d = _delta(inp, grad=False)
    inside = (d >= math.log(alpha)) & (d <= math.log(beta))
    w = torch.where(inside, _ratio(d), 0.0)
    loss = -inp.advantages[:, None] * w * inp.logprobs
    return LossOutput(token_mean(loss, inp.loss_mask), ((~inside).float() * inp.loss_mask).sum(-1))


def cispo(inp: LossInputs, *, eps_low: float, eps_high: float) -> LossOutput:
    """CISPO: −A mean_t sg(clip(r_t, 1−eps_low, 1+eps_high)) log π_t; no token loses its gradient."""
    d = _delta(inp, grad=False)
    r = _ratio(d)
    w = r.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -inp.advantages[:, None] * w * inp.logprobs
    return LossOutput(token_mean(loss, inp.loss_mask), ((w != r).float() * inp.loss_mask).sum(-1))


def _clipped_surrogate(r: Tensor, adv: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    surr = torch.minimum(r * adv, r.clamp(lo, hi) * adv)
    active = ((adv > 0) & (r > hi)) | ((adv < 0) & (r < lo))
    return surr, active


def ppo_clip(inp: LossInputs, *, clip_low: float, clip_high: float) -> LossOutput:
    """PPO ratio clipping against the behaviour policy, token level."""
    r = _ratio(_delta(inp, grad=True))
    surr, active = _clipped_surrogate(r, inp.advantages[:, None], 1.0 - clip_low, 1.0 + clip_high)
    return LossOutput(-token_mean(surr, inp.loss_mask), (active.float() * inp.loss_mask).sum(-1))


def gspo(inp: LossInputs, *, clip_low: float, clip_high: float) -> LossOutput:
    """GSPO: PPO clipping of the length-normalised sequence ratio exp(mean_t δ_t)."""
    r = _ratio(token_mean(_delta(inp, grad=True), inp.loss_mask))
    surr, active = _clipped_surrogate(r, inp.advantages, 1.0 - clip_low, 1.0 + clip_high)
    tokens = inp.loss_mask.sum(-1)
    return LossOutput(torch.where(tokens > 0, -surr, 0.0), torch.where(active, tokens, 0.0))


def m2po(inp: LossInputs, *, tau: float) -> LossOutput:
    """M2PO: IS surrogate −A mean_t r_t on tokens kept by the batch's second-moment mask."""
    d = _delta(inp, grad=True)
    keep = (d.detach() ** 2 <= inp.extra["m2_threshold"]) & (inp.loss_mask > 0)
    r = torch.where(keep, _ratio(d), 0.0)
    loss = -token_mean(inp.advantages[:, None] * r, inp.loss_mask)
    return LossOutput(loss, ((~keep).float() * inp.loss_mask).sum(-1))


def m2po_threshold(delta_sq: Tensor, group: object = None, *, tau: float) -> dict[str, float]:
    """Largest δ² kept so that the mean δ² of the kept tokens (global batch) is at most tau.

    Tokens are masked from the largest δ² down until the second moment of the rest is <= tau.
    """
    import torch.distributed as dist

    x = delta_sq.detach().double().flatten()
    if group is not None:
        n = torch.tensor([x.numel()], device=x.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
        padded = torch.full((int(n),), -1.0, dtype=torch.float64, device=x.device)
        padded[: x.numel()] = x
        parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, padded, group=group)
        x = torch.cat(parts)
        x = x[x >= 0]
    if x.numel() == 0 or float(x.mean()) <= tau:
        return {"m2_threshold": math.inf}
    xs = torch.sort(x).values
    cummean = torch.cumsum(xs, 0) / torch.arange(1, xs.numel() + 1, dtype=torch.float64, device=xs.device)
    k = int((cummean <= tau).sum())
    return {"m2_threshold": float(xs[k - 1]) if k > 0 else -1.0}


def _spec(name: str, fn: Callable[..., LossOutput], doc: str, **kw: object) -> LossSpec:
    defaults = kw.pop("defaults", {})
    return LossSpec(name=name, fn=fn, defaults=MappingProxyType(dict(defaults)), doc=doc, **kw)  # type: ignore[arg-type]


LOSSES: Mapping[str, LossSpec] = MappingProxyType(
    {
        s.name: s
        for s in (
            _spec(
                "reinforce",
                sequence_weighted(_no_weight, corrects=False),
                "off-policy REINFORCE/GRPO, no correction",
                seq_log_weight=_no_weight,
            ),
            _spec("tis_token", tis_token, "token-level truncated IS min(r_t, c)"),
            _spec(
                "tis_seq",
                sequence_weighted(_truncate),
                "sequence-level truncated IS min(w, c)",
                seq_log_weight=_truncate,
            ),
            _spec(
                "mis",
                sequence_weighted(_reject),
                "sequence-level masked IS: reject w > c, else weight w",
                seq_log_weight=_reject,
            ),
            _spec(
                "icepop",
                icepop,
                "token IS weight, masked outside [alpha, beta]",
                defaults={"alpha": 0.5, "beta": 5.0},
            ),
            _spec(
                "m2po",
                m2po,
                "second-moment trust: mask largest δ² until mean δ² <= tau",
                defaults={"tau": 0.04},
                prepare=m2po_threshold,
            ),
            _spec(
                "ppo_clip",
                ppo_clip,
                "PPO clipping of r_t = π/μ",
                defaults={"clip_low": 0.2, "clip_high": 0.2},
            ),
            _spec(
                "gspo",
                gspo,
                "PPO clipping of the sequence ratio exp(mean_t δ)",
                defaults={"clip_low": 3e-4, "clip_high": 4e-4},
            ),
            _spec(
                "cispo",
                cispo,
                "clipped IS weight, gradient kept on every token",
                defaults={"eps_low": 1.0, "eps_high": 4.0},
            ),
            _spec(
                "vcpo",
                sequence_weighted(_truncate),
                "sequence-level truncated IS; with advantage='opob' and an ESS lr rule this is VCPO",
                seq_log_weight=_truncate,
            ),
        )
    }
)


def get_loss(name: str) -> LossSpec:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; registered losses: {', '.join(LOSSES)}") from None


def loss_kwargs(spec: LossSpec, given: Mapping[str, float]) -> dict[str, float]:
    """The spec's defaults overridden by ``given``; unknown keys are an error naming the valid ones."""
    unknown = sorted(set(given) - set(spec.defaults))
    if unknown:
        valid = ", ".join(spec.defaults) or "none"
        raise ValueError(f"loss {spec.name!r} does not take {unknown}; its loss_kwargs are: {valid}")
    return {**spec.defaults, **{k: float(v) for k, v in given.items()}}
