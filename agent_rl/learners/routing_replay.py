"""Rollout routing replay (R3) for the torch learner: transformers' MoE routers take the experts the engine chose.

An MoE learner recomputes every token's routing from its own activations; kernels and batch shapes that
differ from the engine's move router scores a little, and a near-tie then sends the token to another
expert: the learner's log-prob of a sampled token is then of another network than the one that sampled
it (the train-inference mismatch is much larger for MoE than for dense models, and is reported to
collapse RL runs). Replaying the rollout's routing (`algorithm.routing_replay: rollout`) makes the
learner use, for every position the engine fed, the engine's top-k experts, while the gate weights are
still the learner's: softmax(router logits) gathered at those experts (renormalised when the model
renormalises), so the router keeps its gradient through the chosen gates. Positions without a record
(the last sampled token, never fed) keep the learner's own choice.

How: a forward hook on each `*TopKRouter` of the loaded transformers model (Qwen3-MoE, Qwen3-Next,
Qwen3.5-MoE: they return (logits, gate weights, expert ids)) replaces the weights and ids it returns. The
router sees the tokens of a micro-batch flattened: [B·T] of the padded rows, or the packed real tokens
[Σ lengths] in row order; the hook tells them apart by the count (with no padding they coincide). Rows are
found by their token ids (vcpo's Step hands the log-prob function sub-batches, not row numbers); two rows
with equal ids share one record (sampled from the same tokens, the engine routed them alike up to
near-ties). Under gradient checkpointing a layer is re-run in the backward pass, after the forward's
context closed: the hook then replays what that layer's last grad-enabled forward used (vcpo runs each
micro-batch's backward right after its forward).

`rollout/routing_replayed_fraction`: of the (token, MoE layer) pairs the engine fed (real tokens but each
row's last, which is sampled and never fed), the share whose recorded experts the learner used: 0 without
replay, 1 when every turn's record reached the learner. Each turn's positions carry the routing of the call
that first fed them (types.RoutedExperts.then), so a multi-turn trajectory is replayed turn by turn. Under
replay a row that finds no record is an error, never silently the learner's own routing.

The same hook measures, with or without replay, `rollout/routing_agreement`: the share of (token, MoE
layer) pairs, over the trained tokens sampled by the learner's current weights, whose learner top-k
equals the engine's as a set; and it logs the load-balancing loss (`learner/moe_aux_loss`, transformers'
`load_balancing_loss_func` over the routing in use, real tokens only). The loss is logged, not trained on:
RL fine-tuning updates the router only through the policy gradient here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

_ROUTER = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.gate$")
_STATS = (
    "routing/agree", "routing/total", "routing/aux_sum", "routing/aux_calls", "routing/replayed", "routing/fed"
)  # fmt: skip


@dataclass(frozen=True)
class RouteBatch:
    """A rank's share of the rollout routing, row-aligned with its PolicyBatch."""

    ids: Tensor  # [B, T, layers x top_k] int16: the engine's experts per position, -1 where not recorded
    counted: Tensor  # [B, T] bool: positions counted in rollout/routing_agreement


def route_batch(
    routed_experts: Tensor | None, loss_mask: Tensor, versions: Tensor, version: int
) -> RouteBatch | None:
    """The rank's RouteBatch: agreement is counted on trained tokens sampled by `version` (as the mismatch is)."""
    if routed_experts is None:
        return None
    return RouteBatch(routed_experts, (loss_mask > 0) & (versions == version))


def routers_of(model: nn.Module) -> dict[int, nn.Module]:
    """Decoder layer index -> its MoE router, for transformers models whose routers return (logits, weights, ids)."""
    out = {}
    for name, module in model.named_modules():
        m = _ROUTER.search(name)
        if m and type(module).__name__.endswith("TopKRouter"):
            out[int(m[1])] = module
    return out


class RoutingReplay:
    """Hooks on a model's routers; `step(...)` scopes a step's records, `rows(...)` a forward pass's rows."""

    def __init__(
        self,
        routers: Mapping[int, nn.Module],
        *,
        layers: int,
        replay: bool,
        top_k: int | None = None,
        seq_major: bool = False,
    ):
        """`routers`: transformers routers to hook (none: a caller that routes by `choose`, as Megatron's MoE).
        `seq_major`: routers see padded rows as [T, B] flattened (Megatron's unpacked layout), not [B, T]."""
        self.replay, self.layers = replay, layers
        self.top_k = int(top_k if top_k is not None else next(iter(routers.values())).top_k)
        self._records: dict[bytes, tuple[Tensor, Tensor]] = {}  # row ids -> (experts [n, L, k], counted [n])
        # ids [B,T,L,k], counted, real-token mask, fed mask (real tokens but each row's last, which no engine feeds)
        self._rows: tuple[Tensor | None, Tensor | None, Tensor, Tensor] | None = None
        self._used: dict[int, Tensor] = {}  # layer -> experts the last grad-enabled forward used (recompute)
        self._stats = dict.fromkeys(_STATS, 0.0)
        self.seq_major = seq_major
        self._handles = [
            router.register_forward_hook(self._hook(layer, router)) for layer, router in routers.items()
        ]

    @classmethod
    def attach(cls, model: nn.Module, *, replay: bool) -> RoutingReplay | None:
        """None for a model without MoE routers (replay asked of a dense model is refused at config load)."""
        routers = routers_of(model)
        config = getattr(model, "config", None)
        layers = getattr(getattr(config, "text_config", config), "num_hidden_layers", None)
        if not routers:
            return None
        if layers is None:
            raise ValueError(
                f"{type(model).__name__}: MoE routers but no config.num_hidden_layers to read routing by"
            )
        return cls(routers, layers=int(layers), replay=replay)

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    @contextlib.contextmanager
    def step(self, input_ids: Tensor, attention_mask: Tensor, routes: RouteBatch | None) -> Iterator[None]:
        """Within: forwards over rows of this batch find their records by token ids."""
        if routes is None and self.replay:
            raise ValueError(
                "algorithm.routing_replay: rollout, but the batch carries no routed experts: the engines must "
                "return them (embedded: always for MoE; SGLang: start it with --enable-return-routed-experts)"
            )
        self._records = {}
        if routes is not None:
            b, t, width = routes.ids.shape
            if width != self.layers * self.top_k:
                raise ValueError(
                    f"the engines report {width} routed expert ids per token, but the learner's model has "
                    f"{self.layers} layers x top-{self.top_k}: engines and learner must serve the same model"
                )
            ids = routes.ids.view(b, t, self.layers, self.top_k)
            for row, n in enumerate(attention_mask.sum(-1).tolist()):
                self._records[_key(input_ids[row, :n])] = (ids[row, :n], routes.counted[row, :n])
        try:
            yield
        finally:
            self._records, self._used = {}, {}

    @contextlib.contextmanager
    def rows(self, input_ids: Tensor, attention_mask: Tensor) -> Iterator[None]:
        """Within: the routers see the tokens of these rows (padded [B, T], or packed in row order)."""
        am = attention_mask > 0
        b, t = input_ids.shape
        fed = am.clone()
        lengths = am.sum(-1)
        fed[torch.arange(b, device=am.device)[lengths > 0], lengths[lengths > 0] - 1] = False
        ids = counted = None
        if self._records:
            first = next(iter(self._records.values()))[0]
            ids = torch.full((b, t, *first.shape[1:]), -1, dtype=torch.long, device=input_ids.device)
            counted = torch.zeros(b, t, dtype=torch.bool, device=input_ids.device)
            for r in range(b):
                n = int(am[r].sum())
                hit = self._records.get(_key(input_ids[r, :n]))
                if hit is not None:
                    ids[r, :n], counted[r, :n] = hit[0].to(ids.device), hit[1].to(ids.device)
                elif self.replay and n > 0:  # never silently the learner's own routing (issue 60)
                    raise ValueError(
                        f"routing replay: row {r} of this forward ({n} tokens, starting {input_ids[r, :4].tolist()}) "
                        f"matches none of the step's {len(self._records)} trajectories, so it has no routing record "
                        "to replay: the rows a forward sees must be the step's rows (their real tokens unchanged)"
                    )
        self._rows = (ids, counted, am, fed)
        try:
            yield
        finally:
            self._rows = None

    def pop_stats(self) -> dict[str, float]:
        """Counts since the last call (summed over ranks by `routing_metrics`)."""
        out, self._stats = self._stats, dict.fromkeys(_STATS, 0.0)
        return out

    def _hook(self, layer: int, router: nn.Module):
        norm = bool(getattr(router, "norm_topk_prob", True))  # Qwen3.5-MoE's router always renormalises

        def hook(module: nn.Module, args: tuple, output: tuple[Tensor, Tensor, Tensor]):
            logits, _weights, own = output
            if not self.in_scope:  # outside a forward of ours: a checkpointed layer re-run in backward?
                used = self.recomputed(layer, logits.shape[0])
                return output if used is None else _gates(logits, used, norm)
            with torch.no_grad():  # statistics only: nothing saved for backward (checkpointing recounts it)
                probs = logits.float().softmax(-1)
            used = self.choose(layer, probs, own)
            if used is None or not self.replay:
                return output
            if torch.is_grad_enabled():
                self.remember(layer, used)
            return _gates(logits, used, norm)

        return hook

    @property
    def in_scope(self) -> bool:
        """Whether a forward pass of ours (`rows`) is running: else a router call is a recomputed layer."""
        return self._rows is not None

    def remember(self, layer: int, used: Tensor) -> None:
        """The experts layer `layer` used in this step's forward, for activation recompute to replay."""
        self._used[layer] = used

    def recomputed(self, layer: int, n: int) -> Tensor | None:
        """What a layer re-run outside a forward of ours (activation recompute) replays for its `n` tokens: the
        experts its forward used, when replay is on and the token count matches; else None (its own routing)."""
        used = self._used.get(layer)
        return used if self.replay and used is not None and used.shape[0] == n else None

    def choose(self, layer: int, probs: Tensor, own: Tensor) -> Tensor | None:
        """The experts layer `layer` uses for the tokens of the rows in scope: the recorded ones where replay is
        on and a record exists, else `own` (the router's top-k [n, k]); counts agreement and the aux loss.
        `probs`: the router's softmax [n, E]. None when the n tokens are not the rows in scope."""
        if self._rows is None:
            return None
        ids, counted, am, fed = self._rows
        n = probs.shape[0]
        if n == am.numel():  # padded rows, flattened
            pick = None
        elif n == int(am.sum()):  # packed real tokens in row order
            pick = am.reshape(-1)
        else:
            return None

        def flat(x: Tensor) -> Tensor:  # [B, T, ...] -> [n, ...] in the order the router sees the tokens
            if self.seq_major and pick is None:
                x = x.transpose(0, 1)
            return x.reshape(n if pick is None else am.numel(), *x.shape[2:])

        real = flat(am) if pick is None else torch.ones(n, dtype=torch.bool, device=probs.device)
        fed_n = flat(fed) if pick is None else flat(fed)[pick]
        self._stats["routing/fed"] += float(fed_n.sum())
        used = own
        if ids is not None and counted is not None:
            rec, cnt = flat(ids[:, :, layer]), flat(counted)
            if pick is not None:
                rec, cnt = rec[pick], cnt[pick]
            has = (rec >= 0).all(-1)
            with torch.no_grad():
                same = (own.sort(-1).values == rec.sort(-1).values).all(-1)
                scored = cnt & has
                self._stats["routing/agree"] += float((same & scored).sum())
                self._stats["routing/total"] += float(scored.sum())
            if self.replay:
                used = torch.where(has[:, None], rec, own)
                self._stats["routing/replayed"] += float((has & fed_n).sum())
        self._aux(probs, used, real)
        return used

    def _aux(self, probs: Tensor, experts: Tensor, real: Tensor) -> None:
        """transformers' load_balancing_loss_func for one layer: E · Σ_e f_e · P_e over real tokens."""
        with torch.no_grad():
            e = probs.shape[-1]
            probs = probs[real].float()
            if probs.shape[0] == 0:
                return
            share = torch.nn.functional.one_hot(experts[real], e).float().mean(0)  # [k, E]
            self._stats["routing/aux_sum"] += float((share * probs.mean(0)[None]).sum() * e)
            self._stats["routing/aux_calls"] += 1.0


def _gates(logits: Tensor, experts: Tensor, norm: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(logits, the gate weights of `experts` from softmax(logits), experts), as the routers compute them."""
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(-1, experts)
    if norm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights.to(logits.dtype), experts


def _key(row: Tensor) -> bytes:
    return row.detach().to("cpu", torch.int64).numpy().tobytes()


def routing_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """rollout/routing_agreement, rollout/routing_replayed_fraction and learner/moe_aux_loss from every rank's
    counts (none: a dense model)."""
    total = {k: sum(float(r.get(k, 0.0)) for r in per_rank) for k in _STATS}
    out: dict[str, float] = {}
    if total["routing/total"] > 0:
        out["rollout/routing_agreement"] = total["routing/agree"] / total["routing/total"]
        out["rollout/routing_agreement_tokens"] = total["routing/total"]
    if total["routing/fed"] > 0:  # (token, MoE layer) pairs the engine fed whose recorded experts were used
        out["rollout/routing_replayed_fraction"] = total["routing/replayed"] / total["routing/fed"]
    if total["routing/aux_calls"] > 0:
        out["learner/moe_aux_loss"] = total["routing/aux_sum"] / total["routing/aux_calls"]
    return out
