"""The trainer-facing driver: one full optimizer update on this rank's part of the global batch.

    step = vcpo.Step(model, optimizer, vcpo.StepConfig())   # VCPO: seq-TIS + OPOB + sqrt ESS lr
    metrics = step(batch)                                   # batch: vcpo.PolicyBatch

Gradients of the loss Σ_i ℓ_i / N_global are accumulated on each rank without any
communication, summed over the data-parallel group once, then clipped; the learning rate
is scaled by the global batch's ESS for this one optimizer.step() and restored.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.distributed as dist
from torch import Tensor, nn

from vcpo.advantages import ADVANTAGES, STD_EPS, group_stats, grpo_advantages, rloo_advantages
from vcpo.baseline import opob_baseline
from vcpo.batch import BatchError, PolicyBatch
from vcpo.dist import all_reduce, sync_grads
from vcpo.distill import DistillConfig, DistillOutput, distill_term
from vcpo.exact import GradSqFn, LogprobFn, exact_opob_group, local_grad_sq, new_buffers, opob_weight_inputs
from vcpo.ghost import GhostNorms, GhostUnsupported
from vcpo.importance import ESS_RULES, ess_from_sums, ess_lr_scale, sequence_log_weights
from vcpo.logprobs import logit_grad_proxy_of, logprobs_of
from vcpo.losses import LossInputs, _truncate, get_loss, kl_k3_sum, loss_kwargs

log = logging.getLogger(__name__)

ProxyFn = Callable[[nn.Module, Tensor, Tensor], tuple[Tensor, Tensor]]
ClipFn = Callable[[list[nn.Parameter], float], Tensor | float]  # clips in place, returns the pre-clip norm
FinishFn = Callable[[list[nn.Parameter]], None]  # makes raw backward .grad the full model's, in place


def _finished(_params: list[nn.Parameter]) -> None:
    """Unsharded parameters: what backward leaves in .grad is already the model's gradient."""


@dataclass(frozen=True)
class StepConfig:
    """How one step computes its update. Comparison runs set ess_lr_rule='none' and advantage='grpo'."""

    loss: str = "vcpo"  # a key of vcpo.LOSSES
    advantage: str = "opob"  # grpo | rloo | opob (opob needs a sequence-weighted loss)
    is_truncation: float = 8.0  # c in min(w, c)
    ess_lr_rule: str = "sqrt"  # sqrt | linear | none
    ess_base_ratio: float = 1.0  # ρ₀: no damping while ESS/B >= ρ₀
    opob_mode: str = "exact"  # exact: backward per trajectory | proxy: forward-only logit-gradient proxy
    opob_weight: str = "default"  # default: w̃²‖g‖² | reference: w̃² w² ‖∇Σ log π‖² (mit-han-lab/vcpo)
    # exact OPOB's ‖g_i‖²: ghost (vcpo/ghost.py: from each layer's inputs and output gradients, one extra
    # activation-only backward per micro-batch) | backward (one backward per trajectory, vcpo/exact.py)
    opob_norms: str = "backward"
    grad_clip: float = 1.0
    micro_batch_size: int = 4  # trajectories per forward/backward (proxy mode: whole groups)
    micro_batch_tokens: int | None = None  # and at most this many real tokens (a longer row goes alone)
    # proxy OPOB, a group larger than a micro-batch: its baseline needs every member's proxy before any backward.
    # False: a forward without gradients over the group first, then forward + backward per micro-batch. True:
    # forward with gradients over the group, keeping each micro-batch's graph until the baseline is known, then
    # their backwards: one forward fewer, at the memory of the group's graphs (worth it under activation
    # recompute, where a graph holds only each layer's input; the torch learner sets it then).
    proxy_hold_group: bool = False  # (exact OPOB with ghost norms holds the same way)
    loss_kwargs: Mapping[str, float] = field(default_factory=dict)
    distill: DistillConfig | None = None  # on-policy distillation term (vcpo/distill.py); None: no teacher

    def check(self) -> None:
        spec = get_loss(self.loss)
        loss_kwargs(spec, self.loss_kwargs)
        if self.distill is not None:
            self.distill.check()
        choices = {
            "advantage": ADVANTAGES,
            "ess_lr_rule": ESS_RULES,
            "opob_mode": ("exact", "proxy"),
            "opob_weight": ("default", "reference"),
            "opob_norms": ("ghost", "backward"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"StepConfig.{name} = {getattr(self, name)!r}; expected one of {allowed}")
        for name in ("is_truncation", "ess_base_ratio", "grad_clip"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and v > 0 and not math.isnan(v)):
                raise ValueError(f"StepConfig.{name} must be > 0, got {v!r}")
        if not (isinstance(self.micro_batch_size, int) and self.micro_batch_size >= 1):
            raise ValueError(
                f"StepConfig.micro_batch_size must be an int >= 1, got {self.micro_batch_size!r}"
            )
        if self.micro_batch_tokens is not None and not (
            isinstance(self.micro_batch_tokens, int) and self.micro_batch_tokens >= 1
        ):
            raise ValueError(
                f"StepConfig.micro_batch_tokens must be None or an int >= 1, got {self.micro_batch_tokens!r}"
            )
        if self.advantage == "opob" and spec.seq_log_weight is None:
            raise ValueError(
                f"StepConfig: advantage='opob' needs a loss with one weight per trajectory "
                f"(reinforce, tis_seq, mis, vcpo); {self.loss!r} weights tokens: use advantage='grpo' or 'rloo'"
            )


@dataclass
class StepMetrics:
    """Global (all data-parallel ranks) statistics of one step; floats only, never NaN.

    is_weight_* describe the sequence weight truncated at c, min(w, c); log_ratio_abs_max is
    max |s_i|; kl_behavior_current is the k3 estimate of KL(μ‖π) per loss token;
    traj_grad_norm_* are ‖∇ mean_t log π(τ_i)‖ (exact OPOB only, else 0).
    """

    loss: float
    grad_norm: float
    ess: float
    ess_ratio: float
    ess_ratio_truncated: float  # ESS/B of the truncated weights min(w, c)
    lr_scale: float
    lr: float
    is_weight_mean: float
    is_weight_max: float
    is_weight_min: float
    clip_fraction: float
    kl_behavior_current: float
    log_ratio_abs_max: float
    traj_grad_norm_mean: float
    traj_grad_norm_max: float
    baseline_mean: float
    advantage_std: float
    tokens: float
    trajectories: float
    extra: dict[str, float] = field(default_factory=dict)  # keys with their own prefix (distill/...)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "extra":
                continue
            v = float(getattr(self, f.name))
            if math.isnan(v):
                raise FloatingPointError(f"StepMetrics.{f.name} is NaN")
            setattr(self, f.name, v)
        for k, v in self.extra.items():
            if math.isnan(v):
                raise FloatingPointError(f"StepMetrics.extra[{k!r}] is NaN")

    def as_dict(self) -> dict[str, float]:
        out = asdict(self)
        return out | out.pop("extra")


@dataclass(frozen=True)
class RowResults:
    """Per-trajectory results of the last step on this rank, rows in batch order (trajectory logs)."""

    seq_log_weight: Tensor  # [B] float64: s_i = Σ_t (log π − log μ) over loss tokens
    advantage: Tensor  # [B] float64
    baseline: Tensor  # [B] float64
    logprobs: Tensor  # [B, T] float32: current log π of every token (0 at position 0 and padding)


class _Rows:
    """Per-trajectory results on this rank (float64), filled micro-batch by micro-batch on `device` and read once,
    at the end of the step (`on_cpu`): on a GPU every read in between would wait for the device to finish."""

    VECTORS = ("s", "adv", "base", "loss", "tokens", "clipped", "kl", "grad_sq", "bad_gsq",
               "d_loss", "d_kl", "d_teacher", "d_behavior", "d_disagree")  # fmt: skip

    s: Tensor
    adv: Tensor
    base: Tensor
    loss: Tensor
    tokens: Tensor
    clipped: Tensor
    kl: Tensor
    grad_sq: Tensor
    bad_gsq: Tensor
    d_loss: Tensor
    d_kl: Tensor
    d_teacher: Tensor
    d_behavior: Tensor
    d_disagree: Tensor

    def __init__(self, b: int, t: int, device: torch.device) -> None:
        self.device = device
        for name in self.VECTORS:
            setattr(self, name, torch.zeros(b, dtype=torch.float64, device=device))
        self.grad_sq.fill_(-1.0)  # ‖g_i‖² of exact OPOB; -1: not measured
        # bad_gsq: 1 where the proxy's Σ_t ‖∂ log p / ∂z‖² was not finite and >= 0 (checked in on_cpu)
        # lp: one copy per step, cheap next to a forward
        self.lp = torch.zeros(b, t, dtype=torch.float32, device=device)
        # distillation (d_*): ℓ^D_i, Σ_t k_t, Σ_t log π_T, Σ_t log μ, tokens the teacher disagrees with

    def record(self, rows: Tensor, lp: Tensor, sub: PolicyBatch) -> None:
        lp = lp.detach()
        self.lp[rows, : lp.shape[1]] = lp.float().to(self.device)
        s = sequence_log_weights(lp, sub.behavior_logprobs, sub.loss_mask, check=False)
        self.s[rows] = s.to(self.device)
        self.tokens[rows] = sub.loss_mask.double().sum(-1).to(self.device)
        self.kl[rows] = kl_k3_sum(lp, sub.behavior_logprobs, sub.loss_mask).to(self.device)

    def record_distill(self, rows: Tensor, d: DistillOutput) -> None:
        self.d_loss[rows] = d.loss.detach().double().to(self.device)
        self.d_kl[rows] = d.reverse_kl.to(self.device)
        self.d_teacher[rows] = d.teacher_logprob.to(self.device)
        self.d_behavior[rows] = d.behavior_logprob.to(self.device)
        self.d_disagree[rows] = d.disagree.to(self.device)

    def on_cpu(self) -> _Rows:
        """These rows on the CPU, in two copies (the [B] vectors stacked, then the log-probs), after checking what
        the micro-batches could not without waiting for the device: a NaN or +inf sequence log-ratio (the batch's
        behaviour log-probs passed `validate`, so the current log-probs hold it) and a broken proxy norm."""
        host = _Rows.__new__(_Rows)
        host.device = torch.device("cpu")
        stacked = torch.stack([getattr(self, name) for name in self.VECTORS]).cpu()
        for name, row in zip(self.VECTORS, stacked, strict=True):
            setattr(host, name, row)
        host.lp = self.lp.cpu()
        bad = torch.isnan(host.s) | (host.s == math.inf)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"Step: trajectory {i} has log-ratio {float(host.s[i])}: its current log-probs on loss tokens are "
                "NaN or +inf (the model's output, as the batch's behaviour log-probs passed validation); no update "
                "was applied"
            )
        if bool((host.bad_gsq > 0).any()):
            i = int((host.bad_gsq > 0).nonzero()[0, 0])
            raise ValueError(
                f"opob_baseline: grad_sq_norms must be finite and >= 0; trajectory {i}'s proxy norm is not (the "
                "model's logits are not finite); no update was applied"
            )
        return host


@dataclass(frozen=True)
class _Host:
    """What the step plans its micro-batches from, as Python ints read once per step: each row's real tokens and
    prompt group. Planning from tensors on the device would make the host wait for the device at every
    micro-batch (benchmarks/host_reads.py counts the reads)."""

    lengths: list[int]
    group_index: list[int]

    @staticmethod
    def of(batch: PolicyBatch) -> _Host:
        read = torch.stack([(batch.attention_mask > 0).sum(-1), batch.group_index]).tolist()
        return _Host(read[0], read[1])


@dataclass(frozen=True)
class _Part:
    """Rows of one forward pass: their indices (as ints, on the host and on the batch's device), the longest's
    length."""

    rows: list[int]
    host: Tensor
    dev: Tensor
    width: int

    @staticmethod
    def of(idx: list[int], host: _Host, device: torch.device) -> _Part:
        on_host = torch.tensor(idx, dtype=torch.long)
        # non_blocking: a copy from pageable host memory is staged at once; the host does not wait for the device
        width = max([host.lengths[k] for k in idx], default=1) or 1
        return _Part(idx, on_host, on_host.to(device, non_blocking=True), width)

    def on(self, device: torch.device) -> Tensor:
        """The indices on `device` (the host's copy for rows kept on the host)."""
        return self.host if device.type == "cpu" else self.dev


class Step:
    """One optimizer update per call; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: StepConfig,
        *,
        dp_group: dist.ProcessGroup | None = None,
        logprob_fn: LogprobFn = logprobs_of,
        proxy_fn: ProxyFn | None = None,
        grad_sq_fn: GradSqFn = local_grad_sq,
        clip_fn: ClipFn = torch.nn.utils.clip_grad_norm_,
        finish_fn: FinishFn = _finished,
        ghost_head: tuple[nn.Linear, nn.Module] | None = None,
        ghost_sq_fn: Callable[[Tensor], Tensor] | None = None,
        ghost_norms: Callable[[], GhostNorms] | None = None,
    ) -> None:
        """logprob_fn / proxy_fn: how to get per-token log-probs (and the proxy) from the model.
        grad_sq_fn / clip_fn: ‖g‖² of one trajectory's gradient and grad clipping; a tensor-parallel
        trainer passes versions that reduce over its TP group (the defaults see local tensors).
        finish_fn: turns the .grad that backward passes left into the full model's gradient, in place (Megatron:
        the sequence-parallel sum over TP, the CP average). Called exactly once on every gradient grad_sq_fn did
        not see: after the micro-batched passes, and on the distillation pass after exact OPOB on its own (exact
        OPOB's per-trajectory gradients go through grad_sq_fn, which a sharded trainer finishes them in).
        ghost_head: (head, the module whose output is its input) when logprob_fn calls the output head as a
        function (opob_norms='ghost'); ghost_sq_fn: the ghost norms of a micro-batch's trajectories made whole (a
        tensor-parallel trainer sums its ranks' shares there). ghost_norms: builds the hooks instead of GhostNorms,
        for layers it does not know (Megatron's TP-sharded ones: agent_rl/learners/megatron/ghost.py), with the same
        `capture` / `norms` protocol; GhostUnsupported from it falls back to a backward per trajectory.
        """
        cfg.check()
        ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        # Forward through the inner module: DDP's own hooks would all-reduce on every backward
        # and sync buffers on every forward (a collective per call, which deadlocks when ranks
        # hold different numbers of trajectories). We sum gradients ourselves, once.
        self.module = model.module if ddp else model
        self.no_sync = model.no_sync if ddp else contextlib.nullcontext  # belt and braces
        self.group = model.process_group if ddp else dp_group
        self.optimizer, self.cfg, self.logprob_fn = optimizer, cfg, logprob_fn
        self.spec = get_loss(cfg.loss)
        self.kwargs = loss_kwargs(self.spec, cfg.loss_kwargs)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("Step: the model has no parameter with requires_grad=True")
        self.proxy_fn, self.grad_sq_fn, self.clip_fn = proxy_fn, grad_sq_fn, clip_fn
        self.finish_fn = finish_fn
        self.distill = cfg.distill
        # distillation alone (task_weight 0): every task advantage is 0, no baseline pass is needed
        self.task_scale = 1.0 if cfg.distill is None else float(cfg.distill.task_weight)
        self._distill_log_weight = self.spec.seq_log_weight or _truncate  # the task loss's own IS weight
        if cfg.advantage == "opob" and cfg.opob_mode == "proxy" and proxy_fn is None and self.task_scale > 0:
            if logprob_fn is not logprobs_of:
                raise ValueError("Step: opob_mode='proxy' with a custom logprob_fn also needs proxy_fn")
            self.proxy_fn = logit_grad_proxy_of
        self.last_rows: RowResults | None = None  # the last step's per-trajectory results, for logging
        self.ghost: GhostNorms | None = None
        self.ghost_sq_fn = ghost_sq_fn
        if (
            cfg.advantage == "opob"
            and cfg.opob_mode == "exact"
            and cfg.opob_norms == "ghost"
            and self.task_scale > 0
        ):
            head, head_input = ghost_head if ghost_head is not None else (None, None)
            try:
                if ghost_norms is not None:
                    self.ghost = ghost_norms()
                else:
                    self.ghost = GhostNorms(self.module, self.params, head=head, head_input=head_input)
            except (
                GhostUnsupported
            ) as e:  # e.g. a hybrid model's linear-attention layers: still exact, slower
                log.warning("%s; exact OPOB runs one backward per trajectory instead", e)

    def __call__(self, batch: PolicyBatch) -> StepMetrics:
        batch.validate()
        if self.distill is not None and batch.teacher_logprobs is None:
            raise BatchError(
                "the step distils (StepConfig.distill is set) but the batch has no teacher_logprobs"
            )
        host = _Host.of(batch)  # read before the move: a batch on the host costs no wait for the device
        batch = batch.to(self.params[0].device)
        self.optimizer.zero_grad(set_to_none=True)
        exact = self.cfg.advantage == "opob" and self.cfg.opob_mode == "exact" and self.task_scale > 0
        ghost = exact and self.ghost is not None
        exact = exact and not ghost
        # exact OPOB reads each trajectory's results on the host as it goes; the others never read a row until the end
        where = torch.device("cpu") if exact else batch.input_ids.device
        rows = _Rows(batch.size, int(batch.input_ids.shape[1]), where)
        try:
            with self.no_sync():
                if exact or ghost:
                    if ghost:
                        self._ghost(batch, rows, host)
                        self.finish_fn(self.params)
                    else:
                        self._exact(batch, rows, host)
                    if self.distill is not None:  # the exact pass backs up the task term alone
                        self._distill_pass(batch, rows, host)
                else:
                    self._chunked(batch, rows, host)
                    self.finish_fn(self.params)
            done = rows.on_cpu()
            metrics = self._finish(done)
            self.last_rows = RowResults(done.s, done.adv, done.base, done.lp)
            return metrics
        finally:
            self.optimizer.zero_grad(set_to_none=True)

    # -- gradient accumulation -------------------------------------------------------------

    def _exact(self, batch: PolicyBatch, rows: _Rows, host: _Host) -> None:
        acc, score = new_buffers(self.params)
        for group in _groups(host.group_index):
            members = torch.tensor(group)
            adv, base, res = exact_opob_group(
                self.module, self.params, batch, members, acc, score,
                logprob_fn=self.logprob_fn, seq_log_weight=self.spec.seq_log_weight,  # type: ignore[arg-type]
                truncation=self.cfg.is_truncation, variant=self.cfg.opob_weight, grad_sq_fn=self.grad_sq_fn,
            )  # fmt: skip
            rows.adv[members], rows.base[members] = adv, base
            for k, r in zip(group, res, strict=True):
                rows.s[k], rows.tokens[k], rows.grad_sq[k], rows.kl[k] = r.s, r.tokens, r.grad_sq, r.kl
                rows.lp[k, : r.logprobs.shape[0]] = r.logprobs
                rows.loss[k] = -math.exp(r.log_wt) * float(rows.adv[k]) * r.mean_lp
                rows.clipped[k] = r.tokens if r.log_wt != r.s and self.cfg.loss != "reinforce" else 0.0
        for p, a in zip(self.params, acc, strict=True):
            p.grad = (-self.task_scale * a).to(p.dtype)
        rows.adv *= self.task_scale
        rows.loss *= self.task_scale

    def _ghost(self, batch: PolicyBatch, rows: _Rows, host: _Host) -> None:
        """Exact OPOB from ghost norms: per chunk of whole groups, a forward, an activation-only backward of
        Σ_i mean_t log π(τ_i) whose hooks give every ‖g_i‖², the groups' baselines, then one backward of
        −Σ_i w̃_i A_i mean_t log π(τ_i) (what `_exact`'s running sums add up to). A group split over several
        micro-batches is forwarded twice (norms first, then the update), like proxy OPOB without held graphs."""
        dev = batch.input_ids.device
        for idx in _packed_groups(host.group_index, self.cfg.micro_batch_size):
            parts = self._micro_batches(idx, host, dev)
            whole = _Part.of(idx, host, dev)
            # a group split over micro-batches: its parts' graphs held until the baseline is known (proxy_hold_group,
            # as proxy OPOB), or each part forwarded again for the update
            keep = len(parts) == 1 or self.cfg.proxy_hold_group
            held = [self._ghost_forward(batch, part, host, keep=keep) for part in parts]
            adv, log_wt = self._ghost_advantages(batch, whole, host, [h[2:] for h in held], rows)
            for part, (sub, lp, _, _) in zip(parts, held, strict=True):
                if lp is None:  # the group spans micro-batches: forward again, now for the update
                    lp = self.logprob_fn(self.module, sub.input_ids, sub.attention_mask)
                at = [whole.rows.index(k) for k in part.rows]
                coef = (torch.exp(log_wt[at]) * adv[at]).to(lp.dtype)  # −∂loss/∂ mean_lp_i, before task_scale
                tokens = sub.loss_mask.sum(-1).clamp(min=1.0)
                mean_lp = (lp * sub.loss_mask).sum(-1) / tokens
                loss = -(coef * mean_lp).sum() * self.task_scale
                if loss.requires_grad:
                    loss.backward()
                rows.record(part.dev, lp, sub)
                rows.loss[part.dev] = (-coef.double() * mean_lp.detach().double()) * self.task_scale
                s = rows.s[part.dev]
                clip = (log_wt[at] != s) & (self.cfg.loss != "reinforce")
                rows.clipped[part.dev] = torch.where(clip, sub.loss_mask.double().sum(-1), 0.0)

    def _ghost_forward(
        self, batch: PolicyBatch, part: _Part, host: _Host, *, keep: bool
    ) -> tuple[PolicyBatch, Tensor | None, Tensor, Tensor]:
        """A part's forward with the ghost hooks armed and its activation-only backward: (sub, log-probs with
        their graph when `keep`, else None; the sequence log-weights, each trajectory's ‖∇ mean_t log π‖²)."""
        assert self.ghost is not None
        sub = batch.select(part.dev, width=part.width)
        with self.ghost.capture(sub.input_ids, sub.loss_mask, [host.lengths[k] for k in part.rows]):
            lp = self.logprob_fn(self.module, sub.input_ids, sub.attention_mask)
            tokens = sub.loss_mask.sum(-1).clamp(min=1.0)
            f = ((lp * sub.loss_mask).sum(-1) / tokens).sum()
            gsq = self.ghost.norms(f, retain_graph=keep) if f.requires_grad else torch.zeros(len(part.rows))
        if self.ghost_sq_fn is not None:
            gsq = self.ghost_sq_fn(gsq)
        s = sequence_log_weights(lp.detach(), sub.behavior_logprobs, sub.loss_mask, check=False)
        return sub, (lp if keep else None), s, gsq.to(s.device, torch.float64)

    def _ghost_advantages(
        self, batch: PolicyBatch, whole: _Part, host: _Host, parts: list[tuple[Tensor, Tensor]], rows: _Rows
    ) -> tuple[Tensor, Tensor]:
        """Exact OPOB's baseline and advantages (as `exact_opob_group`) of one chunk of whole groups from their
        ghost norms; returns the unscaled advantages and truncated log-weights of the chunk's rows."""
        s = torch.cat([p[0] for p in parts])
        gsq = torch.cat([p[1] for p in parts])
        tokens = batch.loss_mask[whole.dev].double().sum(-1)
        log_wt = self.spec.seq_log_weight(s, self.cfg.is_truncation)  # type: ignore[misc]
        measured = (tokens > 0) & (log_wt > -math.inf)
        gsq = torch.where(measured, gsq, 0.0)
        rows.bad_gsq[whole.dev] = (~torch.isfinite(gsq) | (gsq < 0)).double()  # raised by rows.on_cpu()
        log_w, wgsq = opob_weight_inputs(s, log_wt, tokens, gsq, self.cfg.opob_weight)
        dense, n_groups = _numbered(host.group_index, whole.rows, whole.dev.device)
        r = batch.rewards[whole.dev].double()
        b = opob_baseline(r, log_w, wgsq.clamp(min=0.0), dense, num_groups=n_groups, check=False)
        g = group_stats(r, dense, num_groups=n_groups)
        live = g.std > STD_EPS
        adv = torch.where(live, (r - b) / g.std.clamp(min=STD_EPS), 0.0)
        rows.adv[whole.dev], rows.base[whole.dev] = adv * self.task_scale, torch.where(live, b, g.mean)
        rows.grad_sq[whole.dev] = torch.where(measured & live, gsq, -1.0)
        return adv, log_wt

    def _distill_pass(self, batch: PolicyBatch, rows: _Rows, host: _Host) -> None:
        """Forward and backward of the distillation term alone, finished on its own (finish_fn) and added to the
        task gradient already there (which exact OPOB finished trajectory by trajectory)."""
        task = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        for part in self._micro_batches(list(range(batch.size)), host, batch.input_ids.device):
            sub = batch.select(part.dev, width=part.width)
            lp = self.logprob_fn(self.module, sub.input_ids, sub.attention_mask)
            d = self._distill(lp, sub)
            if (total := d.loss.sum()).requires_grad:
                total.backward()
            rows.record_distill(part.on(rows.device), d)
        self.finish_fn(self.params)
        for p, g in zip(self.params, task, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)

    def _distill(self, lp: Tensor, sub: PolicyBatch) -> DistillOutput:
        s = sequence_log_weights(lp.detach(), sub.behavior_logprobs, sub.loss_mask, check=False)
        log_wt = self._distill_log_weight(s, self.cfg.is_truncation)
        assert self.distill is not None and sub.teacher_logprobs is not None
        return distill_term(
            lp, sub.teacher_logprobs, sub.behavior_logprobs, sub.loss_mask, log_wt, self.distill
        )

    def _chunked(self, batch: PolicyBatch, rows: _Rows, host: _Host) -> None:
        cfg, mbs, dev = self.cfg, self.cfg.micro_batch_size, batch.input_ids.device
        extra: dict[str, float] = {}
        if self.spec.prepare is not None:
            extra = self._prepare(batch, host)
        if cfg.advantage != "opob" or self.task_scale == 0:
            fn = rloo_advantages if cfg.advantage == "rloo" else grpo_advantages
            groups, n_groups = _numbered(host.group_index, list(range(batch.size)), dev)
            adv, base = fn(batch.rewards, groups, num_groups=n_groups)
            rows.adv[:], rows.base[:] = adv * self.task_scale, base
            for part in self._micro_batches(list(range(batch.size)), host, dev):
                self._loss_backward(batch, part, rows, extra)
            return
        for idx in _packed_groups(host.group_index, mbs):
            parts = self._micro_batches(idx, host, dev)
            whole = _Part.of(idx, host, dev)
            # one forward holds the whole group, or (proxy_hold_group) its parts' graphs are held: forwards with
            # gradients, the baseline, then each part's backward
            if len(parts) == 1 or cfg.proxy_hold_group:
                held = [self._proxy_forward(batch, part) for part in parts]
                self._proxy_advantages(batch, whole, host, [(s, g) for _, _, s, g in held], rows)
                for part, (sub, lp, _, _) in zip(parts, held, strict=True):
                    self._loss_backward(batch, part, rows, extra, sub=sub, lp=lp)  # frees this part's graph
                continue
            with torch.no_grad():  # a group larger than a micro-batch: baseline from a forward-only pass
                forwards = [self._proxy_forward(batch, part)[2:] for part in parts]
            self._proxy_advantages(batch, whole, host, forwards, rows)
            for part in parts:
                self._loss_backward(batch, part, rows, extra)

    def _micro_batches(self, idx: list[int], host: _Host, device: torch.device) -> list[_Part]:
        """`idx` in order, cut at micro_batch_size rows and (if set) micro_batch_tokens real tokens."""
        budget = self.cfg.micro_batch_tokens or math.inf
        chunks = _token_budget_split(idx, host.lengths, self.cfg.micro_batch_size, budget)
        return [_Part.of(c, host, device) for c in chunks]

    def _proxy_forward(self, batch: PolicyBatch, part: _Part) -> tuple[PolicyBatch, Tensor, Tensor, Tensor]:
        """The rows of `part`, their log-probs (with the graph when gradients are on), and what the baseline needs
        of them: the sequence log-weights and Σ_t proxy_t over the loss tokens."""
        sub = batch.select(part.dev, width=part.width)
        lp, gsq = self.proxy_fn(self.module, sub.input_ids, sub.attention_mask)  # type: ignore[misc]
        s = sequence_log_weights(lp.detach(), sub.behavior_logprobs, sub.loss_mask, check=False)
        return sub, lp, s, (gsq.detach() * sub.loss_mask).double().sum(-1)

    def _proxy_advantages(
        self, batch: PolicyBatch, whole: _Part, host: _Host, parts: list[tuple[Tensor, Tensor]], rows: _Rows
    ) -> None:
        """OPOB advantages of one packed chunk of whole groups from its parts' proxy norms:
        ‖∇ mean_t log π‖² ≈ Σ_t proxy_t / L²."""
        s = torch.cat([p[0] for p in parts])
        gsq_sum = torch.cat([p[1] for p in parts])
        tokens = batch.loss_mask[whole.dev].double().sum(-1)
        gsq = gsq_sum / tokens.clamp(min=1.0) ** 2
        rows.bad_gsq[whole.dev] = (~torch.isfinite(gsq) | (gsq < 0)).double()  # raised by rows.on_cpu()
        log_wt = self.spec.seq_log_weight(s, self.cfg.is_truncation)  # type: ignore[misc]
        log_w, gsq = opob_weight_inputs(s, log_wt, tokens, gsq, self.cfg.opob_weight)
        # the chunk's groups numbered 0..G-1 on the host: neither function then reads the device to count them
        dense, n_groups = _numbered(host.group_index, whole.rows, whole.dev.device)
        r = batch.rewards[whole.dev].double()
        b = opob_baseline(r, log_w, gsq, dense, num_groups=n_groups, check=False)
        g = group_stats(r, dense, num_groups=n_groups)
        adv = torch.where(g.std > STD_EPS, (r - b) / g.std.clamp(min=STD_EPS), 0.0)
        rows.adv[whole.dev], rows.base[whole.dev] = adv * self.task_scale, b

    def _loss_backward(
        self,
        batch: PolicyBatch,
        part: _Part,
        rows: _Rows,
        extra: Mapping[str, float],
        *,
        sub: PolicyBatch | None = None,
        lp: Tensor | None = None,
    ) -> None:
        if sub is None or lp is None:
            sub = batch.select(part.dev, width=part.width)
            lp = self.logprob_fn(self.module, sub.input_ids, sub.attention_mask)
        adv = rows.adv[part.dev].to(dtype=lp.dtype)
        out = self.spec.fn(
            LossInputs(lp, sub.behavior_logprobs, sub.loss_mask, adv, self.cfg.is_truncation, extra),
            **self.kwargs,
        )
        total = out.loss.sum()
        d = self._distill(lp, sub) if self.distill is not None else None
        if d is not None:
            total = total + d.loss.sum()
            rows.record_distill(part.dev, d)
        if total.requires_grad:
            total.backward()
        rows.record(part.dev, lp, sub)
        rows.loss[part.dev] = out.loss.detach().double()
        rows.clipped[part.dev] = out.clipped_tokens.detach().double()

    def _prepare(self, batch: PolicyBatch, host: _Host) -> dict[str, float]:
        """Forward-only pass over the local batch for losses that need every token's log-ratio first."""
        parts = []
        with torch.no_grad():
            for part in self._micro_batches(list(range(batch.size)), host, batch.input_ids.device):
                sub = batch.select(part.dev, width=part.width)
                lp = self.logprob_fn(self.module, sub.input_ids, sub.attention_mask)
                d = lp.double() - sub.behavior_logprobs.double()
                parts.append(torch.where(sub.loss_mask > 0, d**2, -1.0).flatten())  # -1: not a loss token
        x = torch.cat(parts)
        return self.spec.prepare(x[x >= 0], self.group, **self.kwargs)  # type: ignore[misc]

    # -- global statistics, gradient sync, optimizer step -------------------------------------

    def _finish(self, rows: _Rows) -> StepMetrics:
        cfg, dev = self.cfg, self.params[0].device
        live = rows.tokens > 0
        s = rows.s[live]
        wt = torch.exp(s.clamp(max=math.log(cfg.is_truncation)))
        gn = rows.grad_sq[rows.grad_sq >= 0].sqrt()
        neg = torch.tensor(-math.inf, dtype=torch.float64)
        maxes = torch.stack([
            s.max() if s.numel() else neg, s.abs().max() if s.numel() else neg,
            wt.max() if wt.numel() else neg, -wt.min() if wt.numel() else neg, gn.max() if gn.numel() else neg,
        ]).to(dev)  # fmt: skip
        all_reduce(maxes, dist.ReduceOp.MAX, self.group)
        s_max, abs_max, w_max, neg_w_min, gn_max = maxes.tolist()
        e = torch.exp(s - s_max) if math.isfinite(s_max) else torch.zeros_like(s)
        et = wt / w_max if w_max > 0 else torch.zeros_like(wt)  # truncated weights, shifted the same way
        a = rows.adv[live]
        sums = torch.stack([
            e.sum(), (e * e).sum(), live.sum().double(), (rows.loss + rows.d_loss)[live].sum(), rows.tokens.sum(),
            rows.clipped.sum(), rows.kl.sum(), wt.sum(), a.sum(), (a * a).sum(), rows.base[live].sum(),
            gn.sum(), torch.tensor(float(gn.numel()), dtype=torch.float64), et.sum(), (et * et).sum(),
        ]).to(dev)  # fmt: skip
        all_reduce(sums, dist.ReduceOp.SUM, self.group)
        e1, e2, n, loss, tokens, clipped, kl, w_sum, a_sum, a_sq, b_sum, gn_sum, gn_n, t1, t2 = sums.tolist()
        if n == 0:
            raise ValueError("Step: no trajectory in the global batch has a loss token (loss_mask is all 0)")
        ess, ratio = ess_from_sums(s_max, e1, e2, int(n))
        extra = self._distill_metrics(rows, live, tokens, n, dev) if self.distill is not None else {}
        ratio_truncated = min(t1 * t1 / t2 / n, 1.0) if t2 > 0 else 0.0
        sync_grads(self.params, self.group, 1.0 / n)
        lr_scale = ess_lr_scale(ratio, cfg.ess_lr_rule, cfg.ess_base_ratio)
        grad_norm = float(self.clip_fn(self.params, cfg.grad_clip))
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"Step: gradient norm is {grad_norm}; no update was applied")
        lr = self._apply(lr_scale)
        mean_a = a_sum / n
        return StepMetrics(
            loss=loss / n, grad_norm=grad_norm, ess=ess, ess_ratio=ratio, ess_ratio_truncated=ratio_truncated, lr_scale=lr_scale, lr=lr,
            is_weight_mean=w_sum / n, is_weight_max=w_max, is_weight_min=-neg_w_min,
            clip_fraction=clipped / max(tokens, 1.0), kl_behavior_current=kl / max(tokens, 1.0),
            log_ratio_abs_max=abs_max, traj_grad_norm_mean=gn_sum / gn_n if gn_n else 0.0,
            traj_grad_norm_max=gn_max if gn_n else 0.0, baseline_mean=b_sum / n,
            advantage_std=math.sqrt(max(a_sq / n - mean_a * mean_a, 0.0)), tokens=tokens, trajectories=n,
            extra=extra,
        )  # fmt: skip

    def _distill_metrics(
        self, rows: _Rows, live: Tensor, tokens: float, n: float, dev: torch.device
    ) -> dict[str, float]:
        """Global (all DP ranks) distillation statistics per loss token; the term's loss per trajectory."""
        sums = torch.stack([rows.d_loss[live].sum(), rows.d_kl.sum(), rows.d_teacher.sum(), rows.d_behavior.sum(),
                            rows.d_disagree.sum()]).to(dev)  # fmt: skip
        all_reduce(sums, dist.ReduceOp.SUM, self.group)
        loss, kl, teacher, behavior, disagree = sums.tolist()
        per = 1.0 / max(tokens, 1.0)
        return {
            "distill/loss": loss / n,
            "distill/reverse_kl": kl * per,
            "distill/teacher_logprob": teacher * per,
            "distill/behavior_logprob": behavior * per,
            "distill/reverse_kl_behavior": (behavior - teacher) * per,
            "distill/disagree_frac": disagree * per,
        }

    def _apply(self, lr_scale: float) -> float:
        """optimizer.step() with every param group's lr multiplied by lr_scale, then restored."""
        groups = self.optimizer.param_groups
        base = [g["lr"] for g in groups]
        try:
            for g, lr in zip(groups, base, strict=True):
                g["lr"] = lr * lr_scale
            scaled = float(groups[0]["lr"])
            self.optimizer.step()
        finally:
            for g, lr in zip(groups, base, strict=True):
                g["lr"] = lr
        return scaled


VCPOStep = Step


def _numbered(group_index: list[int], rows: list[int], device: torch.device) -> tuple[Tensor, int]:
    """The prompt groups of `rows` numbered 0..G-1 in order of id, as `torch.unique` numbers them, on `device`
    (numbered on the host: `torch.unique` and a read of the count on the device would wait for it), and G."""
    gid = [group_index[k] for k in rows]
    number = {g: i for i, g in enumerate(sorted(set(gid)))}
    return torch.tensor([number[g] for g in gid]).to(device, non_blocking=True), len(number)


def _groups(group_index: list[int]) -> list[list[int]]:
    """Row indices of each prompt group, groups in order of first appearance."""
    order: dict[int, list[int]] = {}
    for k, g in enumerate(group_index):
        order.setdefault(g, []).append(k)
    return list(order.values())


def _packed_groups(group_index: list[int], mbs: int) -> list[list[int]]:
    """Whole groups packed greedily into chunks of at most mbs rows; a larger group is its own chunk."""
    chunks: list[list[int]] = []
    for g in _groups(group_index):
        if chunks and len(chunks[-1]) + len(g) <= mbs:
            chunks[-1].extend(g)
        else:
            chunks.append(list(g))
    return chunks


def _token_budget_split(
    idx: list[int], lengths: list[int], max_rows: int, max_tokens: float
) -> list[list[int]]:
    """Greedy in order: a micro-batch closes before it would pass max_rows rows or max_tokens tokens."""
    chunks: list[list[int]] = [[]]
    used = 0
    for k in idx:
        n = lengths[k]
        if chunks[-1] and (len(chunks[-1]) == max_rows or used + n > max_tokens):
            chunks.append([])
            used = 0
        chunks[-1].append(k)
        used += n
    return chunks
