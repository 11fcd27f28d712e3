"""Grammar-constrained sampling in the embedded engine, with xgrammar (the default backend of vLLM and SGLang).

A request whose `SamplingParams.constraint` is set gets an xgrammar `GrammarMatcher` on admission
(`Grammars.matcher`; a continuation after an abort first accepts the tokens it already sampled).
Each step, for the constrained rows only: the matcher fills the row's allowed-token bitmask, the
row's logits are kept as they were (`Masked.unmasked`) and the disallowed ones set to -inf, the
sampler draws from that masked distribution (temperature, top-k, top-p after the mask, as vLLM
orders them), and `advance` feeds the drawn token to the matcher. The log-prob the engine returns is
the one of the masked distribution actually sampled from; `advance` also returns the same token's
log-prob under the same settings without the mask (`Generation.unmasked_logprobs`), so the learner
can tell the mask's log-normaliser apart (see README, "Constrained decoding").

xgrammar (a core dependency) is imported on the first constrained request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from agent_rl.engines.api import BadRequest, Constraint
from agent_rl.engines.embedded.sampling import RowParams, filtered_logprobs


def xgrammar() -> Any:
    import xgrammar as xgr

    return xgr


class Grammars:
    """Compiles constraints for one tokenizer and vocabulary (compiled grammars are cached by xgrammar)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: frozenset[int]):
        if tokenizer is None:
            raise BadRequest("constrained decoding needs the model's tokenizer files")
        xgr = xgrammar()
        self.xgr, self.vocab_size = xgr, vocab_size
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids)
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)

    def compile(self, c: Constraint) -> Any:
        try:
            if c.kind == "json_schema":
                return self.compiler.compile_json_schema(c.value, any_whitespace=False)
            if c.kind == "ebnf":
                return self.compiler.compile_grammar(c.value)
            if c.kind == "regex":
                return self.compiler.compile_regex(c.value)
            return self.compiler.compile_structural_tag(_structural_tag(self.xgr, c.value))
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise BadRequest(f"constraint {c.kind} does not compile: {e}") from None

    def matcher(self, c: Constraint) -> Any:
        m = self.xgr.GrammarMatcher(self.compile(c))
        for i, t in enumerate(c.resume_ids):
            if not m.accept_token(t):
                raise BadRequest(
                    f"constraint {c.kind}: resumed token {i} (id {t}) does not match the grammar"
                )
        return m


def _structural_tag(xgr: Any, value: str) -> Any:
    """SGLang's (and vLLM's) structural_tag JSON: {"structures": [{"begin", "schema", "end"}], "triggers": [...]}."""
    spec = json.loads(value)
    if "format" in spec:  # xgrammar's own newer form
        return value
    tags = [
        xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
        for s in spec["structures"]
    ]
    return xgr.StructuralTag.from_legacy_structural_tag(tags, spec["triggers"])


@dataclass
class Masked:
    rows: list[int]  # the constrained rows of the batch
    unmasked: torch.Tensor  # their logits before the mask [len(rows), V]


def mask(xgr: Any, logits: torch.Tensor, rows: list[RowParams]) -> Masked | None:
    """Apply each constrained row's allowed-token mask to `logits` in place; None when no row is constrained."""
    idx = [i for i, r in enumerate(rows) if r.matcher is not None]
    if not idx:
        return None
    bitmask = xgr.allocate_token_bitmask(len(rows), logits.shape[-1])
    for i in idx:
        rows[i].matcher.fill_next_token_bitmask(bitmask, i)
    unmasked = logits[idx].clone()
    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=idx)
    return Masked(idx, unmasked)


def advance(masked: Masked | None, rows: list[RowParams], tokens: list[int]) -> list[float | None]:
    """Feed the drawn tokens to their matchers; per row, the token's unmasked log-prob (None: unconstrained)."""
    out: list[float | None] = [None] * len(rows)
    if masked is None:
        return out
    sub = [rows[i] for i in masked.rows]
    drawn = torch.tensor([tokens[i] for i in masked.rows])
    lp = torch.log_softmax(masked.unmasked, dim=-1)
    sampled = [j for j, r in enumerate(sub) if r.temperature > 0]
    if sampled:  # the same temperature / top-k / top-p as the draw, without the mask
        lp[sampled] = filtered_logprobs(
            masked.unmasked[sampled],
            torch.tensor([sub[j].temperature for j in sampled], dtype=masked.unmasked.dtype),
            torch.tensor([sub[j].top_p for j in sampled], dtype=masked.unmasked.dtype),
            torch.tensor([sub[j].top_k for j in sampled]),
        )
    values = lp.gather(-1, drawn[:, None])[:, 0].clamp(min=-1e4).tolist()  # -inf: top-p cut it unmasked
    for j, i in enumerate(masked.rows):
        if not rows[i].matcher.accept_token(tokens[i]):
            raise RuntimeError(f"the grammar refused token {tokens[i]} that its own mask allowed")
        out[i] = values[j]
    return out
