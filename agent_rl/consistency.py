"""`agent-rl consistency RECIPE [--checkpoint DIR]`: where a run's trainer-engine log-prob mismatch comes from.

The recipe's engines sample a batch (the train environment's prompts, the rollout temperature); the learner's
log-prob code (`learners/hf_logprobs.py`, the torch learner's; routing replay as `learners/routing_replay.py`)
scores it at the same weights. `rollout/logprob_mismatch_*` says how far apart the two are; this says why, by
changing one thing at a time and measuring |Δ log p| over the sampled tokens:

| source | compared |
|---|---|
| total | the learner as configured against the engine's decode log-probs (what training sees) |
| dtype | the learner as configured against the learner in fp32 end to end (no autocast, fp32 head) |
| lm head | the learner as configured against the same with `model.lm_head_fp32` flipped |
| routing | MoE: the learner with the engine's routes replayed against its own routing |
| packing | the micro-batch packed into one row (common prefixes shared, as configured) against each trajectory alone |
| engine kernels | the engine's decode log-probs against its own prefill of the same tokens |

Each row reports mean, max and RMS |Δ| and the share above 0.1; `--threshold [SOURCE=]RMS` makes the command exit
1 when a source's RMS exceeds it. Embedded engines run in this process; `engines.urls` are asked over HTTP
(SGLang's API: `agent-rl serve` or SGLang). A Megatron recipe is scored with the torch learner's code (same
weights; Megatron's own kernels are not isolated). Hand-written (no library measures this); each comparison is a
forward of the same model with one setting changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SOURCES = ("total", "dtype", "lm head", "routing", "packing", "engine kernels")
MATCH_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


class ConsistencyError(RuntimeError):
    """A user's input that cannot be measured: printed as one line, exit 2."""


@dataclass(frozen=True)
class Sampled:
    """One engine sample: the prompt, the sampled tokens, their decode and prefill log-probs, the routing."""

    prompt: list[int]
    tokens: list[int]
    decode: list[float]
    prefill: list[float] | None
    routes: Any  # types.RoutedExperts | None


@dataclass(frozen=True)
class Gap:
    """|Δ log p| over the sampled tokens for one source (None: the source does not apply here, with why)."""

    source: str
    compared: str
    mean: float | None = None
    max: float | None = None
    rms: float | None = None
    frac: float | None = None
    tokens: int = 0
    note: str = ""

    @staticmethod
    def of(source: str, compared: str, a: torch.Tensor, b: torch.Tensor, threshold: float = 0.1) -> Gap:
        d = (a.double() - b.double()).abs()
        if d.numel() == 0:
            return Gap(source, compared, note="no tokens")
        return Gap(source, compared, float(d.mean()), float(d.max()), float(d.square().mean().sqrt()),
                   float((d > threshold).double().mean()), int(d.numel()))  # fmt: skip


def model_dir_of(recipe: Any, checkpoint: Path | None) -> Path:
    """The HF directory to measure: --checkpoint (a checkpoint, its hf/ export, or a run dir's latest) or model.path;
    a checkpoint of another model than the recipe's is refused."""
    from agent_rl import checkpoint as ckpt

    base = Path(recipe.model.path)
    if not (base / "config.json").is_file():
        raise ConsistencyError(
            f"model.path {base}: no Hugging Face model (config.json) there; build it first (recipes/tiny_tir.yaml: "
            f"agent-rl tiny-model --out {base}; SmolLM2: agent-rl prepare smollm2 --out {base})"
        )
    if checkpoint is None:
        return base
    if (checkpoint / "checkpoints").is_dir():
        checkpoint = ckpt.latest(checkpoint)
    d = checkpoint / "hf" if (checkpoint / "hf").is_dir() else checkpoint
    if not (d / "config.json").is_file():
        raise ConsistencyError(f"--checkpoint {checkpoint}: no Hugging Face model (config.json) in {d}")
    ours, theirs = (json.loads((p / "config.json").read_text()) for p in (base, d))
    diff = [k for k in MATCH_KEYS if ours.get(k) != theirs.get(k)]
    if diff:
        k = diff[0]
        raise ConsistencyError(
            f"--checkpoint {checkpoint}: a checkpoint of another model than model.path {base} ({k} "
            f"{theirs.get(k)!r}, the recipe's {ours.get(k)!r}); pass a checkpoint of this recipe's runs"
        )
    return d


def _engine(recipe: Any, model_dir: Path) -> tuple[Any, str]:
    eng = recipe.engines
    if eng.urls:
        from agent_rl.engines.client import SGLangClient

        return SGLangClient(eng.urls[0]), eng.urls[0]
    if eng.type != "embedded":
        raise ConsistencyError(
            f"engines.type {eng.type} without engines.urls: start the servers and list them in engines.urls "
            "(consistency samples from embedded engines in this process or from running servers)"
        )
    from agent_rl.engines.embedded.engine import EmbeddedEngine

    return EmbeddedEngine(model_dir, eng.options(recipe.model.dtype, recipe.model.lm_head_fp32)), "embedded"


def sample(recipe: Any, model_dir: Path, *, prompts: int, n: int, tokens: int) -> list[Sampled]:
    """`n` samples for each of `prompts` train prompts, from the recipe's engines."""
    from transformers import AutoTokenizer

    import envs
    from agent_rl.engines.api import EngineError, SamplingParams

    tok = AutoTokenizer.from_pretrained(recipe.model.tokenizer or recipe.model.path)
    env = envs.make(envs.load(recipe.envs.train), tok)
    ids = [env.reset(t) for t in env.tasks("train")[:prompts]]
    engine, where = _engine(recipe, model_dir)

    async def run() -> list[Sampled]:
        out = []
        try:
            for i in range(len(ids) * n):
                prompt = ids[i % len(ids)]
                sp = SamplingParams(
                    temperature=recipe.rollout.temperature, max_new_tokens=tokens, seed=i, ignore_eos=True,
                    return_routed_experts=True,
                )  # fmt: skip
                try:
                    g = await engine.generate(prompt, sp, request_id=f"consistency-{i}")
                except EngineError as e:  # e.g. a Generation without log-probs refused where it is built
                    raise ConsistencyError(
                        f"engine {where}: request consistency-{i}: {e}; the engine must return the sampled "
                        "tokens' log-probs"
                    ) from None
                lps = list(g.logprobs or [])
                if not g.token_ids or len(lps) != len(g.token_ids) or not all(map(math.isfinite, lps)):
                    raise ConsistencyError(
                        f"engine {where}: request consistency-{i} returned {len(g.token_ids)} tokens with "
                        f"{len(lps)} finite log-probs; the engine must return the sampled tokens' log-probs"
                    )
                score = getattr(engine, "score", None)
                pre = None
                if score is not None:
                    pre = await score(prompt + list(g.token_ids), start=len(prompt), request_id=f"score-{i}")
                out.append(Sampled(list(prompt), list(g.token_ids), lps, pre, g.routed_experts))
        finally:
            await engine.close()
        return out

    return asyncio.run(run())


def _batch(samples: list[Sampled]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-padded ids, attention mask, the sampled tokens' mask, and the routes [B, T, width] (or None)."""
    rows = [s.prompt + s.tokens for s in samples]
    t = max(map(len, rows))
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    am = torch.zeros_like(ids)
    sampled = torch.zeros(len(rows), t, dtype=torch.bool)
    for r, (s, row) in enumerate(zip(samples, rows, strict=True)):
        ids[r, : len(row)], am[r, : len(row)] = torch.tensor(row), 1
        sampled[r, len(s.prompt) : len(row)] = True
    routes = None
    if all(s.routes is not None for s in samples):
        width = samples[0].routes.width
        routes = torch.full((len(rows), t, width), -1, dtype=torch.int16)
        for r, s in enumerate(samples):
            rec = torch.tensor(s.routes.ids, dtype=torch.int16).view(s.routes.positions, width)
            routes[r, : rec.shape[0]] = rec
    return ids, am, sampled, routes


class Scorer:
    """The learner's log-probs of a batch under one setting at a time (same fp32 master weights throughout)."""

    def __init__(self, model_dir: Path, ids: torch.Tensor, am: torch.Tensor, routes: torch.Tensor | None):
        from transformers import AutoModelForCausalLM

        from agent_rl.learners.routing_replay import RoutingReplay

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.ids, self.am, self.routes = ids, am, routes
        self.moe = RoutingReplay.attach(self.model, replay=True)

    def __call__(
        self,
        *,
        dtype: str,
        head_fp32: bool,
        pack: bool,
        replay: bool,
        share: bool = False,
        alone: bool = False,
    ) -> torch.Tensor:
        from agent_rl.learners.hf_logprobs import HFLogprobs
        from agent_rl.learners.routing_replay import RouteBatch

        lp = HFLogprobs(self.model, pack=pack, head_fp32=head_fp32, share_prefixes=share)
        rows = [slice(r, r + 1) for r in range(self.ids.shape[0])] if alone else [slice(None)]
        out = []
        for sl in rows:
            ids, am = self.ids[sl], self.am[sl]
            n = int(am.sum(-1).max())
            ids, am = ids[:, :n], am[:, :n]
            ctx = contextlib.ExitStack()
            if self.moe is not None:
                self.moe.replay = replay
                routes = None if self.routes is None else RouteBatch(self.routes[sl, :n], am > 0)
                if replay and routes is None:
                    raise ConsistencyError("routing: the engine reported no routed experts to replay")
                ctx.enter_context(self.moe.step(ids, am, routes))
                ctx.enter_context(self.moe.rows(ids, am))
            bf16 = dtype == "bfloat16"
            with ctx, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                got = lp.logprobs(self.model, ids, am)
            out.append(torch.nn.functional.pad(got, (0, self.ids.shape[1] - n)))
        return torch.cat(out)


def measure(recipe: Any, model_dir: Path, *, prompts: int, n: int, tokens: int) -> list[Gap]:
    samples = sample(recipe, model_dir, prompts=prompts, n=n, tokens=tokens)
    ids, am, sampled, routes = _batch(samples)
    mu = torch.zeros(ids.shape, dtype=torch.float64)
    pre = torch.zeros_like(mu)
    for r, s in enumerate(samples):
        a = len(s.prompt)
        mu[r, a : a + len(s.tokens)] = torch.tensor(s.decode, dtype=torch.float64)
        if s.prefill is not None:
            pre[r, a : a + len(s.tokens)] = torch.tensor(s.prefill, dtype=torch.float64)
    score = Scorer(model_dir, ids, am, routes)
    dtype, head = recipe.learner.dtype, recipe.model.lm_head_fp32
    pack = recipe.learner.pack_sequences is not False
    replay = recipe.algorithm.routing_replay == "rollout"
    # common prefixes shared as the torch learner shares them (never for MoE models: learners/_torch_rank.py)
    share = recipe.learner.share_prefixes and score.moe is None
    cfg = dict(dtype=dtype, head_fp32=head, pack=pack, replay=replay and score.moe is not None, share=share)
    learner = score(**cfg)
    m = sampled
    gaps = [Gap.of("total", "learner as configured vs engine decode", learner[m], mu[m])]
    if dtype == "float32":
        gaps.append(Gap("dtype", "learner in fp32 already", 0.0, 0.0, 0.0, 0.0, int(m.sum())))
    else:
        fp32 = score(**(cfg | {"dtype": "float32", "head_fp32": True}))
        gaps.append(Gap.of("dtype", "learner bf16 vs fp32 end to end", learner[m], fp32[m]))
    if dtype == "float32":
        gaps.append(Gap("lm head", "fp32 already", 0.0, 0.0, 0.0, 0.0, int(m.sum())))
    else:
        flipped = score(**(cfg | {"head_fp32": not head}))
        gaps.append(Gap.of("lm head", f"lm_head_fp32 {head} vs {not head}", learner[m], flipped[m]))
    if score.moe is None:
        gaps.append(Gap("routing", "dense model: no routing", note="n/a"))
    elif routes is None:
        gaps.append(Gap("routing", "engine reported no routing", note="n/a"))
    else:
        own = score(**(cfg | {"replay": False}))
        rep = score(**(cfg | {"replay": True}))
        gaps.append(Gap.of("routing", "replayed vs the learner's own routing", rep[m], own[m]))
        gaps.append(Gap.of("routing", "engine decode vs learner, replay on", rep[m], mu[m]))
        gaps.append(Gap.of("routing", "engine decode vs learner, replay off", own[m], mu[m]))
    alone = score(**(cfg | {"pack": True}), alone=True)
    packed = score(**(cfg | {"pack": True}))
    what = "packed micro-batch" + (", prefixes shared," if share else "") + " vs each trajectory alone"
    gaps.append(Gap.of("packing", what, packed[m], alone[m]))
    if any(s.prefill is None for s in samples):
        gaps.append(Gap("engine kernels", "engine cannot score (no prefill log-probs)", note="n/a"))
    else:
        gaps.append(
            Gap.of("engine kernels", "engine decode vs its prefill of the same tokens", mu[m], pre[m])
        )
    return gaps


def table(gaps: list[Gap]) -> str:
    lines = [
        "| source | compared | mean |Δ| | max |Δ| | RMS | share > 0.1 | tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in gaps:
        if g.rms is None:
            lines.append(f"| {g.source} | {g.compared} | {g.note} | | | | |")
        else:
            lines.append(
                f"| {g.source} | {g.compared} | {g.mean:.2e} | {g.max:.2e} | {g.rms:.2e} | {g.frac:.4f} | {g.tokens} |"
            )
    return "\n".join(lines)


def _thresholds(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v in values:
        source, _, x = v.rpartition("=")
        source = source.strip() or "*"
        if source != "*" and source not in SOURCES:
            raise ConsistencyError(f"--threshold {v}: unknown source {source!r}; one of {', '.join(SOURCES)}")
        try:
            out[source] = float(x)
        except ValueError:
            raise ConsistencyError(
                f"--threshold {v}: {x!r} is not a number (an RMS in nats, e.g. 0.05)"
            ) from None
    return out


def main(argv: list[str] | None = None) -> int:
    from agent_rl.config import load_recipe

    p = argparse.ArgumentParser(prog="agent-rl consistency", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", type=Path, help="the recipe whose engines and learner settings to measure")
    p.add_argument(
        "--checkpoint", type=Path, help="a checkpoint dir or a run dir (its latest); default: model.path"
    )
    p.add_argument("--prompts", type=int, default=4, help="train prompts to sample (default 4)")
    p.add_argument("--samples", type=int, default=2, help="samples per prompt (default 2)")
    p.add_argument("--tokens", type=int, default=32, help="tokens per sample (default 32)")
    p.add_argument(
        "--threshold", action="append", default=[], metavar="[SOURCE=]RMS",
        help="exit 1 when a source's RMS |Δ log p| exceeds RMS (no SOURCE: every source); repeatable",
    )  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    p.add_argument("--json", type=Path, help="also write the rows to this file as JSON")
    args = p.parse_args(argv)
    try:
        limits = _thresholds(args.threshold)
        recipe = load_recipe(args.recipe, args.set)
        model_dir = model_dir_of(recipe, args.checkpoint)
        gaps = measure(recipe, model_dir, prompts=args.prompts, n=args.samples, tokens=args.tokens)
    except ConsistencyError as e:
        print(f"agent-rl consistency: {e}", file=sys.stderr)
        return 2
    print(f"{recipe.name}: {model_dir} ({recipe.model.dtype} engines, learner {recipe.learner.dtype}, "
          f"lm_head_fp32 {recipe.model.lm_head_fp32})")  # fmt: skip
    print(table(gaps))
    if args.json:
        args.json.write_text(json.dumps([g.__dict__ for g in gaps], indent=2))
    over = [
        f"{g.source} ({g.compared}): RMS {g.rms:.3g} > {lim:g}"
        for g in gaps
        if g.rms is not None and (lim := limits.get(g.source, limits.get("*"))) is not None and g.rms > lim
    ]
    for line in over:
        print(f"over the threshold: {line}", file=sys.stderr)
    return 1 if over else 0
