"""Continuous batching over a fixed set of cache slots: admit, prefill, decode, finish, abort.

`Scheduler` is synchronous and single-threaded: `embedded.EmbeddedEngine` runs it on one thread and
applies every command (add, abort, pause, weight update) between two `step()` calls, so weights
change only between decode steps and no lock is needed around the model.

One `step()`: admit waiting requests into free slots (a slot whose cached tokens share a prefix
with the new prompt is preferred, and only the unshared suffix is prefilled), prefill them in one
padded forward, then decode one token for every request that was already running.

A new prompt that shares a longer prefix with a running request's prompt (a GRPO group's other members,
a system prompt) copies those keys from its slot instead (`prefixes.PrefixIndex`, `KVCache.fork`). When the
source is admitted in the same step, the copy waits for its prefill: the step prefills in two forwards,
sources first, then the requests that copy from them (placed after them, so each forward's rows are packed
slots), and samples every new row's first token after both.

A scoring request (`Request.score_from`: log-probs of given tokens, a distillation teacher's call)
is admitted and prefilled like any other, in the same batched forward; it reads the log-prob of
every token from `score_from` on off that prefill and finishes without sampling. Its slot keeps the
keys, so the next member of the same group (same prompt) prefills only what differs.

A weight update normally comes between pause and resume (everything in flight is aborted first).
If it comes while requests run, they go on under the new weights with the keys/values the old
weights computed, and their next tokens carry the new version (PipelineRL-style in-flight update).
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agent_rl.engines.api import BadRequest, EngineOptions, FinishReason, Generation, SamplingParams
from agent_rl.engines.embedded import constrained
from agent_rl.engines.embedded.cache import KVCache
from agent_rl.engines.embedded.loader import load_model
from agent_rl.engines.embedded.prefixes import PrefixIndex, block_keys
from agent_rl.engines.embedded.sampling import RowParams, TopList, sample
from agent_rl.weights.tensors import copy_weights_, read_safetensors_dir

log = logging.getLogger(__name__)
# Prefill tokens per step (padded), so one burst of long prompts can't stall running decodes for long.
MAX_PREFILL_TOKENS = 8192
SCORE_LOGITS = 2**24  # scoring: logits computed for at most this many (position, vocab) entries at once


@dataclass
class Output:
    """A finished request: the Generation plus what the HTTP layer reports in meta_info."""

    rid: str
    generation: Generation
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from a free slot or was copied from a running request
    matched: int | str | None  # the stop token id or stop string that ended it
    latency_s: float
    error: str | None = None  # engine failure: callers raise it rather than treat it as an abort
    top_logprobs: list[TopList] | None = None  # per output token, when the request asked for top_n > 0
    prompt_logprobs: list[float] | None = None  # scoring: log p(prompt[t] | prompt[:t]) for t >= score_from


@dataclass(eq=False)  # identity semantics: `in` / remove() must not compare token lists
class Request:
    rid: str
    prompt: list[int]
    sampling: SamplingParams
    on_finish: Callable[[Output], None]
    top_n: int = 0  # top alternatives to report per output token (OpenAI top_logprobs)
    on_token: Callable[[int, float, int, TopList | None], None] | None = None  # streaming, engine thread
    row: RowParams | None = None  # sampling settings + private RNG, set on admission
    slot: int = -1
    cached_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tops: list[TopList] = field(default_factory=list)
    unmasked: list[float] = field(default_factory=list)  # constrained requests: log-probs without the mask
    routed_experts: bool = (
        False  # MoE: report the experts every fed position was routed to (Output.routed_experts)
    )
    created: float = field(default_factory=time.monotonic)
    score_from: int | None = None  # scoring: return log-probs of prompt[score_from:], sample nothing
    scores: list[float] | None = None
    blocks: list[int] = field(default_factory=list)  # prefixes.block_keys(prompt), when the cache can fork
    source: Request | None = None  # the running request whose first cached_tokens keys this one copies


@dataclass
class SlotState:
    tokens: list[int] = field(default_factory=list)  # tokens whose keys/values are in this slot, in order
    busy: bool = False
    last_used: int = 0


class Scheduler:
    def __init__(self, model_dir: str | Path, opts: EngineOptions = EngineOptions(), *, seed: int = 0):
        max_batch, max_seq_len, dtype = opts.max_batch, opts.max_seq_len, opts.dtype
        self.model_dir = str(model_dir)
        self.model = load_model(model_dir, dtype=dtype, max_seq_len=max_seq_len)
        self.model.head_fp32 = opts.lm_head_fp32  # final norm + LM head in fp32 (model.py, CausalLM.logits)
        cfg = self.model.cfg
        self.cache: KVCache = self.model.new_cache(slots=max_batch, max_seq_len=max_seq_len)
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        log.info("cache: %d slots x %d tokens = %.0f MiB", max_batch, max_seq_len, self.cache.nbytes / 2**20)
        self.eos_ids = frozenset(cfg.eos_token_ids)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0
        self.paused = False
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slots = [SlotState() for _ in range(max_batch)]
        self.prefixes: PrefixIndex[Request] | None = (
            PrefixIndex() if opts.copy_prefixes and self.cache.forkable else None
        )
        self._clock = 0
        self._grammars: constrained.Grammars | None = None  # built at the first constrained request

    @functools.cached_property
    def tokenizer(self):
        """The checkpoint's tokenizer (stop strings, text), loaded at first use: a 150k-token vocabulary
        takes seconds to read, and an engine fed token ids never needs it."""
        return _load_tokenizer(self.model_dir)

    # ---- commands (called between steps) ----

    def add(self, req: Request) -> None:
        n, vocab = len(req.prompt), self.model.cfg.vocab_size
        if n == 0:
            raise BadRequest(f"request {req.rid}: input_ids is empty")
        if req.score_from is not None:
            if not 1 <= req.score_from < n or n > self.max_seq_len:
                raise BadRequest(
                    f"request {req.rid}: scoring {n} tokens from position {req.score_from}: needs "
                    f"1 <= start < {n} and at most max_seq_len={self.max_seq_len} tokens"
                )
        elif n >= self.max_seq_len:
            raise BadRequest(
                f"request {req.rid}: prompt of {n} tokens does not fit the context (max_seq_len={self.max_seq_len}; "
                "at least one token must be generated)"
            )
        bad = [t for t in req.prompt if not 0 <= t < vocab]
        if bad:
            raise BadRequest(
                f"request {req.rid}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
            )
        if req.sampling.stop and self.tokenizer is None:
            raise BadRequest(f"request {req.rid}: stop strings need tokenizer files in {self.model_dir}")
        if any(r.rid == req.rid for r in (*self.running, *self.waiting)):
            raise BadRequest(f"request {req.rid}: a request with this rid is already in flight")
        sp = req.sampling
        generator = None if sp.seed is None else torch.Generator().manual_seed(sp.seed)
        req.row = RowParams(sp.temperature, sp.top_p, sp.top_k, generator, req.top_n)
        if self.prefixes is not None:
            req.blocks = block_keys(req.prompt)
        if sp.constraint is not None:
            if self._grammars is None:
                self._grammars = constrained.Grammars(self.tokenizer, self.model.cfg.vocab_size, self.eos_ids)
            req.row.matcher = self._grammars.matcher(sp.constraint)
        self.waiting.append(req)

    def abort(self, rid: str | None = None) -> int:
        """Finish the request `rid` (or every request when None) with finish_reason "abort"; return how many."""
        hit = [r for r in (*self.running, *self.waiting) if rid is None or r.rid == rid]
        for r in hit:
            self._finish(r, "abort", None)
        return len(hit)

    def pause(self) -> int:
        """Stop admitting; abort everything in flight (they return their tokens so far). Returns how many."""
        self.paused = True
        return self.abort()

    def resume(self) -> None:
        self.paused = False

    def update_weights(
        self, version: int, *, path: str | None = None, tensors: Mapping[str, torch.Tensor] | None = None
    ):
        """Copy new weights into the model in place and set the version that stamps the next tokens."""
        if (path is None) == (tensors is None):
            raise BadRequest("update_weights needs exactly one of path= or tensors=")
        new = read_safetensors_dir(path) if path is not None else tensors
        copy_weights_(self.model, self.model.checkpoint_state(dict(new)))
        self.weights_changed(version)

    def weights_changed(self, version: int) -> None:
        """The weights are `version`'s now (a full update or an adapter): stamp it and drop the free slots' cache."""
        self.version = int(version)
        for (
            s
        ) in self.slots:  # cached keys were computed by the old weights: never reuse them for a new prompt
            if not s.busy:
                s.tokens = []
        if self.prefixes is not None:  # nor copy a running request's
            self.prefixes.clear()

    def has_work(self) -> bool:
        return bool(self.running) or (bool(self.waiting) and not self.paused)

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    # ---- one scheduling step ----

    def step(self) -> None:
        new = self._admit()
        old = [r for r in self.running if r not in new]
        if new:
            self._prefill(new)
        if old:
            self._decode(old)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        copies: list[Request] = []  # copy a prompt admitted in this step: placed after the others
        while self.waiting and not self.paused:
            dense = len(self.running)  # running requests hold slots 0..dense-1
            if dense + len(copies) == self.max_batch:
                break
            req = self.waiting[0]
            slot, shared = self._pick_slot(range(dense, self.max_batch - len(copies)), req.prompt)
            source, forked = (
                (None, 0) if self.prefixes is None else self.prefixes.find(req.prompt, req.blocks)
            )
            if forked <= shared:
                source = None
            # The last prompt token is always fed, even when cached: its logits are needed (scoring: every
            # position from score_from - 1 on).
            start = min(
                max(shared, forked), (len(req.prompt) if req.score_from is None else req.score_from) - 1
            )
            queued = [*admitted, *copies]
            width = max([len(r.prompt) - r.cached_tokens for r in queued] + [len(req.prompt) - start])
            if queued and width * (len(queued) + 1) > MAX_PREFILL_TOKENS:
                break
            self.waiting.popleft()
            req.cached_tokens, req.source = start, source
            if source is not None and source in admitted:
                copies.append(req)
                continue
            self._place(
                req, slot if source is None else self._lru(range(dense, self.max_batch - len(copies)))
            )
            admitted.append(req)
        for req in copies:
            self._place(req, self._lru(range(len(self.running), self.max_batch)))
        return admitted + copies

    def _place(self, req: Request, slot: int) -> None:
        """Run `req` in the first free slot, moving `slot`'s cached keys there (those of its shared prefix)."""
        dense = len(self.running)
        self._swap(slot, dense)
        req.slot = dense
        self.slots[dense] = SlotState(tokens=req.prompt[: req.cached_tokens], busy=True)
        self.running.append(req)
        if self.prefixes is not None:
            self.prefixes.add(req)

    def _lru(self, free: range) -> int:
        return min(free, key=lambda i: self.slots[i].last_used)

    def _pick_slot(self, free: range, prompt: list[int]) -> tuple[int, int]:
        """The free slot sharing the longest cached prefix with `prompt`, else the least recently used one."""
        best, best_len = self._lru(free), 0
        for i in free:
            n = self.cache.usable_prefix(self.slots[i].tokens, prompt)
            if n > best_len:
                best, best_len = i, n
        return best, best_len

    def _swap(self, a: int, b: int) -> None:
        """Exchange two slots (cached keys/values and their state), keeping running requests packed at the front."""
        if a == b:
            return
        held = {r.slot: r for r in self.running if r.slot in (a, b)}
        # Positions holding keys: a running request's prompt and tokens, a free slot's cached tokens.
        length = max(
            len(held[i].prompt) + len(held[i].tokens) if i in held else len(self.slots[i].tokens)
            for i in (a, b)
        )
        self.cache.swap(a, b, min(self.max_seq_len, length))
        self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
        for i, r in held.items():
            r.slot = b if i == a else a

    def _prefill(self, reqs: list[Request]) -> None:
        """Prefill the admitted requests (those copying a prompt admitted with them in a second forward), then
        sample each new row's first token and finish the scoring ones."""
        later = [r for r in reqs if r.source is not None and r.source in reqs]
        first = [r for r in reqs if r not in later]
        rows: list[Request] = []
        logits: list[torch.Tensor] = []
        for group in (first, later):
            if not group:
                continue
            for r in group:
                if r.source is not None:
                    self.cache.fork(r.source.slot, r.slot, r.cached_tokens)
                    r.source = None  # copied: keep no reference to it
            sampling, out = self._prefill_rows(sorted(group, key=lambda r: r.slot))
            rows += sampling
            logits += [out] if sampling else []
        if rows:
            self._sample_rows(rows, logits[0] if len(logits) == 1 else torch.cat(logits))
        for r in reqs:
            if r.score_from is not None:
                self._finish(r, "stop", None)

    def _prefill_rows(self, reqs: list[Request]) -> tuple[list[Request], torch.Tensor]:
        """One padded forward over packed slots: the sampling rows and their last logits [n, V] (scoring rows
        get `scores`)."""
        self._check_packed(reqs)
        chunks = [r.prompt[r.cached_tokens :] for r in reqs]
        width = max(len(c) for c in chunks)
        tokens = torch.zeros(len(reqs), width, dtype=torch.long)
        for i, c in enumerate(chunks):
            tokens[i, : len(c)] = torch.tensor(c)
        starts = torch.tensor([r.cached_tokens for r in reqs])
        # Padding positions run past each chunk; they write keys nobody reads (clamped into the buffer).
        positions = (starts[:, None] + torch.arange(width)[None, :]).clamp(max=self.max_seq_len - 1)
        last = torch.tensor([len(c) - 1 for c in chunks])
        key_len = min(self.max_seq_len, max(r.cached_tokens for r in reqs) + width)
        if all(r.score_from is None for r in reqs):
            return reqs, self.model(tokens, positions, reqs[0].slot, key_len, self.cache, last)
        hidden = self.model.hidden_states(tokens, positions, reqs[0].slot, key_len, self.cache, last)
        for i, r in enumerate(reqs):
            if r.score_from is not None:
                r.scores = self._score(r, hidden[i])
        rest = [i for i, r in enumerate(reqs) if r.score_from is None]
        at = torch.tensor(rest, dtype=torch.long)
        return [reqs[i] for i in rest], self.model.logits(hidden[at, last[at]]) if rest else hidden[:0, 0]

    def _score(self, r: Request, hidden: torch.Tensor) -> list[float]:
        """log p(prompt[t] | prompt[:t]) for t = score_from..n-1, from the row's hidden states (chunk positions,
        the first being cached_tokens); logits in slices of SCORE_LOGITS entries, never [n, vocab] at once."""
        assert r.score_from is not None
        targets = torch.tensor(r.prompt[r.score_from :])
        h = hidden[r.score_from - 1 - r.cached_tokens : len(r.prompt) - 1 - r.cached_tokens]
        step = max(1, SCORE_LOGITS // self.model.cfg.vocab_size)
        out = [
            self.model.logits(h[a : a + step]).log_softmax(-1).gather(-1, targets[a : a + step, None])[:, 0]
            for a in range(0, len(targets), step)
        ]
        return torch.cat(out).tolist()

    def _decode(self, reqs: list[Request]) -> None:
        reqs = sorted(reqs, key=lambda r: r.slot)
        tokens = torch.tensor([[r.tokens[-1]] for r in reqs])
        at = [len(r.prompt) + len(r.tokens) - 1 for r in reqs]
        positions = torch.tensor(at)[:, None]
        self._forward_and_sample(
            reqs, tokens, positions, max(at) + 1, torch.zeros(len(reqs), dtype=torch.long)
        )

    def _forward_and_sample(self, reqs: list[Request], tokens, positions, key_len: int, last) -> None:
        self._check_packed(reqs)
        self._sample_rows(reqs, self.model(tokens, positions, reqs[0].slot, key_len, self.cache, last))

    @staticmethod
    def _check_packed(reqs: list[Request]) -> None:
        start = reqs[0].slot
        assert [r.slot for r in reqs] == list(range(start, start + len(reqs))), "rows must be packed slots"

    def _sample_rows(self, reqs: list[Request], logits: torch.Tensor) -> None:
        """Sample one token per request from its row of logits [B, V]; append it and check for the end."""
        rows = [r.row for r in reqs]
        masked = None if self._grammars is None else constrained.mask(self._grammars.xgr, logits, rows)
        ids, lps, tops = sample(logits, rows, self.generator)
        unmasked = constrained.advance(masked, rows, ids)
        for r, t, lp, top, ulp in zip(reqs, ids, lps, tops, unmasked, strict=True):
            r.tokens.append(t)
            r.logprobs.append(lp)
            if ulp is not None:
                r.unmasked.append(ulp)
            r.versions.append(self.version)
            if top is not None:
                r.tops.append(top)
            if r.on_token is not None:
                r.on_token(t, lp, self.version, top)
            self._check_finished(r)

    def _check_finished(self, r: Request) -> None:
        sp, t = r.sampling, r.tokens[-1]
        if t in sp.stop_token_ids or (not sp.ignore_eos and t in self.eos_ids):
            return self._finish(r, "stop", t)
        if sp.stop:
            matched = self._match_stop(r)
            if matched is not None:
                return self._finish(r, "stop", matched)
        if len(r.tokens) >= sp.max_new_tokens or len(r.prompt) + len(r.tokens) >= self.max_seq_len:
            return self._finish(r, "length", None)

    def _match_stop(self, r: Request) -> str | None:
        # A stop string of b UTF-8 bytes spans at most b + 1 tokens (every token is >= 1 byte, + a split char);
        # anything earlier would have matched on an earlier step.
        window = max(len(s.encode()) for s in r.sampling.stop) + 1
        text = self.tokenizer.decode(r.tokens[-window:])
        return next((s for s in r.sampling.stop if s in text), None)

    def _finish(
        self, r: Request, reason: FinishReason, matched: int | str | None, error: str | None = None
    ) -> None:
        routes = None
        if r.routed_experts and self.cache.routes is not None and r in self.running:
            routes = self.cache.routes.read(r.slot, len(r.prompt) + len(r.tokens) - 1)
        if self.prefixes is not None:
            self.prefixes.remove(r)
        if r in self.running:
            self._clock += 1
            # Keys/values exist for the prompt and every output token but the last (never fed back).
            self.slots[r.slot] = SlotState(tokens=r.prompt + r.tokens[:-1], busy=False, last_used=self._clock)
            self.running.remove(r)
            self._swap(r.slot, len(self.running))  # the last running request takes the freed slot
        else:
            self.waiting.remove(r)
        unmasked = list(r.unmasked) if r.sampling.constraint is not None else None
        gen = Generation(
            list(r.tokens), list(r.logprobs), list(r.versions), reason, unmasked, routed_experts=routes
        )
        tops = list(r.tops) if r.top_n > 0 else None
        latency = time.monotonic() - r.created
        r.on_finish(
            Output(r.rid, gen, len(r.prompt), r.cached_tokens, matched, latency, error, tops, r.scores)
        )

    def fail_all(self, error: BaseException) -> None:
        """A step raised: fail every request with the error so no caller hangs, and free all slots."""
        for r in (*self.running, *self.waiting):
            self._finish(r, "abort", None, error=f"engine step failed: {type(error).__name__}: {error}")
        for s in self.slots:
            s.tokens, s.busy = [], False
        if self.prefixes is not None:
            self.prefixes.clear()


def _load_tokenizer(model_dir: str | Path):
    """The checkpoint's tokenizer (for stop strings and text), or None when the directory has none."""
    path = Path(model_dir)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
