"""vcpo.Step on a Megatron model-parallel shard: the same VCPO math, with TP/SP/CP-aware gradients.

vcpo.Step sees gradients as whole-model tensors. On a TP x CP shard three things differ, and
this subclass changes exactly those (everything else, the losses, advantages, ESS, lr rule and
metrics, is vcpo's own code):

1. after every backward, `grads.finish_backward` sums sequence-parallel norm gradients over TP
   and averages gradients over CP (exact OPOB: per trajectory, before its norm is taken;
   otherwise once, since both are linear);
2. per-trajectory ‖g_i‖² and the clipping norm are reduced over TP, TP-duplicates counted once
   (`grads.grad_sq_norm`);
3. the data-parallel group is the Megatron DP group; TP/CP ranks of one replica hold the same
   trajectories (all n samples of a prompt on one DP rank), so ESS and metrics reduce over DP.

Gradients still accumulate locally over all trajectories and are summed over DP once per step.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

from agent_rl.learners.megatron.grads import ShardGroups, clip_grads, finish_backward, grad_sq_norm
from vcpo.advantages import STD_EPS
from vcpo.baseline import opob_baseline
from vcpo.batch import PolicyBatch
from vcpo.exact import LogprobFn, TrajResult, new_buffers, opob_weight_inputs
from vcpo.losses import kl_k3_sum
from vcpo.step import Step, StepConfig, StepMetrics, _groups
from vcpo.weights import sequence_log_weights


class ShardedStep(Step):
    """One optimizer update on this rank's shard of the model and DP share of the batch."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: StepConfig,
        *,
        groups: ShardGroups,
        logprob_fn: LogprobFn,
    ) -> None:
        if cfg.advantage == "opob" and cfg.opob_mode == "proxy":
            raise ValueError(
                "algorithm.opob_mode=proxy is not available on the Megatron learner (its logit-gradient proxy "
                "needs the full vocabulary on one rank); use opob_mode: exact"
            )
        self.shards = groups
        self.max_norm = cfg.grad_clip
        self._norm = 0.0
        # vcpo.Step's own clip sees only this shard: disable it and clip TP-aware in _apply.
        super().__init__(
            module,
            optimizer,
            dataclasses.replace(cfg, grad_clip=math.inf),
            dp_group=groups.dp,
            logprob_fn=logprob_fn,
        )

    def __call__(self, batch: PolicyBatch) -> StepMetrics:
        metrics = super().__call__(batch)
        metrics.grad_norm = self._norm
        return metrics

    def _chunked(self, batch: PolicyBatch, rows) -> None:
        super()._chunked(batch, rows)
        finish_backward(self.params, self.shards)

    def _apply(self, lr_scale: float) -> float:
        self._norm = clip_grads(self.params, self.max_norm, self.shards)
        if not math.isfinite(self._norm):
            raise FloatingPointError(f"Megatron step: gradient norm is {self._norm}; no update was applied")
        return super()._apply(lr_scale)

    def _exact(self, batch: PolicyBatch, rows) -> None:
        acc, score = new_buffers(self.params)
        for members in _groups(batch.group_index):
            adv, base, res = self._exact_group(batch, members, acc, score)
            m = members.cpu()
            rows.adv[m], rows.base[m] = adv, base
            for k, r in zip(m.tolist(), res, strict=True):
                rows.s[k], rows.tokens[k], rows.grad_sq[k], rows.kl[k] = r.s, r.tokens, r.grad_sq, r.kl
                rows.loss[k] = -math.exp(r.log_wt) * float(rows.adv[k]) * r.mean_lp
                rows.clipped[k] = r.tokens if r.log_wt != r.s else 0.0
        for p, a in zip(self.params, acc, strict=True):
            p.grad = (-a).to(p.dtype)

    def _exact_group(
        self, batch: PolicyBatch, members: Tensor, acc: list[Tensor], score: list[Tensor]
    ) -> tuple[Tensor, Tensor, list[TrajResult]]:
        """vcpo.exact.exact_opob_group with the shard's backward finish and TP-reduced ‖g_i‖²."""
        params, seq_log_weight = self.params, self.spec.seq_log_weight
        assert seq_log_weight is not None  # StepConfig.check: opob needs a sequence-weighted loss
        rewards = batch.rewards[members].double()
        mean = rewards.mean()
        std = rewards.std(unbiased=False) if len(members) > 1 else torch.zeros((), dtype=torch.float64)
        live = bool(std > STD_EPS)
        results: list[TrajResult] = []
        for k, i in enumerate(members.tolist()):
            sub = batch.select(torch.tensor([i], device=batch.input_ids.device))
            tokens = float(sub.loss_mask.sum())
            needs_grad = live and tokens > 0
            with torch.set_grad_enabled(needs_grad):
                lp = self.logprob_fn(self.module, sub.input_ids, sub.attention_mask)
            s = sequence_log_weights(lp.detach(), sub.behavior_logprobs, sub.loss_mask)
            log_wt = seq_log_weight(s, self.cfg.is_truncation)
            mean_lp = (lp * sub.loss_mask).sum() / max(tokens, 1.0)
            kl = float(kl_k3_sum(lp, sub.behavior_logprobs, sub.loss_mask))
            res = TrajResult(float(s), float(log_wt), float(mean_lp.detach()), -1.0, tokens, kl)
            results.append(res)
            if not needs_grad or res.log_wt == -math.inf:
                continue
            for p in params:
                p.grad = None
            mean_lp.backward()
            finish_backward(params, self.shards)
            grads = [p.grad for p in params]
            res.grad_sq = grad_sq_norm(params, grads, self.shards)
            if not math.isfinite(res.grad_sq):
                raise FloatingPointError(
                    f"exact OPOB: trajectory {i} has a non-finite gradient (‖g‖² = {res.grad_sq})"
                )
            coef = math.exp(res.log_wt) / float(std)
            r_centred = float(rewards[k] - mean)
            for j, g in enumerate(grads):
                if g is not None:
                    acc[j].add_(g, alpha=coef * r_centred)
                    score[j].add_(g, alpha=coef)
        for p in params:
            p.grad = None
        n = len(members)
        if not live:
            return torch.zeros(n, dtype=torch.float64), mean.expand(n).clone(), results
        s_t = torch.tensor([r.s for r in results], dtype=torch.float64)
        log_wt_t = torch.tensor([r.log_wt for r in results], dtype=torch.float64)
        tok_t = torch.tensor([r.tokens for r in results], dtype=torch.float64)
        gsq_t = torch.tensor([max(r.grad_sq, 0.0) for r in results], dtype=torch.float64)
        log_w, gsq = opob_weight_inputs(s_t, log_wt_t, tok_t, gsq_t, self.cfg.opob_weight)
        b = opob_baseline(rewards.cpu(), log_w, gsq, torch.zeros(n, dtype=torch.long))
        shift = float(b[0] - mean)
        for a, sc in zip(acc, score, strict=True):
            a.add_(sc, alpha=-shift)
            sc.zero_()
        return (rewards.cpu() - b) / float(std), b, results
