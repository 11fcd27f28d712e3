"""The memory model: how many bytes one learner step needs on one device, and the longest trajectory that fits.

`step_memory(dims, setup, tokens)` adds up named terms: fp32 master weights, gradients, AdamW's two moments,
exact OPOB's two running gradient sums, autocast's bf16 weight copies, activations per token per layer
(with or without recompute), attention scores where the attention kernel materialises them ([heads, S, S]),
and the log-prob workspace ([tokens, vocab] fp32 tensors unless log-probs are chunked). `max_trajectory_tokens`
inverts it for a device's memory; `check_recipe` turns that into the warning `agent-rl train` prints before
it loads anything.

Hand-written arithmetic, because no library models these learners' step (exact OPOB's buffers, the vcpo
log-prob path): the per-layer counts are what autograd saves in the Hugging Face Qwen2/Llama decoder and in
megatron-core's local layer spec, tensor by tensor (tests/learners/test_memory_model.py compares them with
`saved_tensors_hooks`, and the whole estimate with a fresh process's measured peak). Pure Python: no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agent_rl.config import Recipe

GiB = 2**30
MEGATRON_LOGIT_CHUNK_BYTES = 256 * 2**20
"""megatron's log-probs (megatron/linear_logprobs.py): fp32 bytes of one chunk's logits [chunk, V / tp]."""
Backend = Literal["torch", "megatron"]
DType = Literal["float32", "bfloat16"]
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a decoder-only transformer (Qwen2/Qwen3/Llama layout: GQA attention, SwiGLU MLP, RMSNorm)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tie_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], source: str = "config") -> ModelDims:
        """From a Hugging Face config.json's fields; a missing field is named in the error."""
        if cfg.get("num_experts", cfg.get("num_local_experts")) or "linear_attention" in (
            cfg.get("layer_types") or ()
        ):
            raise ValueError(
                f"{source}: Mixture-of-Experts / linear-attention layers are not in this memory model"
            )
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        for name in need:
            if not isinstance(cfg.get(name), int):
                raise ValueError(
                    f"{source}: field {name!r} missing or not an integer (got {cfg.get(name)!r})"
                )
        heads = cfg["num_attention_heads"]
        model_type = cfg.get("model_type", "")
        return cls(
            vocab=cfg["vocab_size"],
            hidden=cfg["hidden_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            ffn=cfg["intermediate_size"],
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
        )

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ModelDims:
        file = Path(path) / "config.json"
        try:
            cfg = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{file}: cannot read the model's config ({e})") from e
        return cls.from_config(cfg, str(file))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        h = self.hidden
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 3 * h * self.ffn

    @property
    def layer_params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return self.layer_matmul_params + bias + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def params(self) -> int:
        return self.embedding_params + self.layers * self.layer_params + self.hidden

    def lora_params(self, rank: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
        """Adapter parameters (A: r x in, B: out x r) over every layer's `targets`."""
        h, f, q, kv = self.hidden, self.ffn, self.q_dim, self.kv_dim
        sizes = {
            "q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
            "gate_proj": h + f, "up_proj": h + f, "down_proj": f + h,
        }  # fmt: skip
        return self.layers * rank * sum(sizes[t] for t in targets)


@dataclass(frozen=True)
class Setup:
    """How a learner step runs, as far as memory goes."""

    backend: Backend = "torch"
    compute_dtype: DType = (
        "float32"  # autocast dtype; master weights, gradients and AdamW are fp32 either way
    )
    recompute: Literal["none", "full", "selective"] = "none"
    attention: Literal["fused", "eager"] = (
        "fused"  # eager materialises [heads, S, S] scores (megatron-core's local DotProductAttention)
    )
    logprobs: Literal["full", "chunked"] = "full"  # full: [tokens, vocab] fp32 log-softmax kept for backward
    logprob_chunk_tokens: int = 4096  # chunked: tokens per chunk
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = LORA_TARGETS
    opob: Literal["exact", "proxy", "none"] = (
        "exact"  # exact: one trajectory per backward + two gradient sums
    )
    micro_batch_rows: int = 4
    micro_batch_tokens: int | None = None
    packed: bool = False  # megatron packs a micro-batch into one sequence: eager attention is [S_total]^2
    group_rows: int = 1  # trajectories per group: proxy OPOB under full recompute holds a group's graphs
    hold_group: bool = True  # torch: learner.proxy_hold_group (false: a forward first, no group held)
    device: Literal["cpu", "cuda"] = "cpu"  # CUDA autocast runs softmax in fp32

    def rows_held(self, tokens: int) -> int:
        """Trajectories whose graphs are alive at once: the torch learner's proxy OPOB under full recompute keeps
        every micro-batch of a group until the group's baseline is known (vcpo StepConfig.proxy_hold_group)."""
        rows = self.rows_per_forward(tokens)
        if self.holds_group:
            return max(rows, self.group_rows)
        return rows

    @property
    def holds_group(self) -> bool:
        """Whether the torch learner keeps a group's graphs until its baseline is known (rows_held)."""
        return (
            self.backend == "torch" and self.opob == "proxy" and self.recompute == "full" and self.hold_group
        )

    def rows_per_forward(self, tokens: int) -> int:
        """Trajectories of `tokens` tokens in one forward/backward pass (exact OPOB: one)."""
        if self.opob == "exact":
            return 1
        rows = self.micro_batch_rows
        if self.micro_batch_tokens is not None:
            rows = min(rows, max(1, self.micro_batch_tokens // tokens))
        return rows


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Estimate:
    """A step's peak bytes as named terms (the peak is the largest of the step's phases; `terms` is that phase)."""

    tokens: int  # per trajectory
    rows: int  # trajectories per forward
    terms: tuple[Term, ...]

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    def describe(self) -> str:
        parts = ", ".join(f"{t.name} {t.bytes / GiB:.1f}" for t in self.terms if t.bytes >= GiB / 20)
        return f"{self.total / GiB:.1f} GiB ({parts})"


def _per_layer_token_bytes(d: ModelDims, s: Setup) -> int:
    """Bytes autograd keeps per token for one decoder layer (attention scores aside).

    torch learner (transformers' Qwen2/Llama layer, SDPA): each RMSNorm keeps its input, 1/rms and the
    normalised input in fp32; q (after RoPE), k, v, the attention output and its log-sum-exp; the MLP keeps
    gate, silu(gate), up and their product. Under bf16 autocast every linear keeps its own bf16 copy of its
    input (q, k, v: three; gate, up: two). megatron-core's own local DotProductAttention (`attention="eager"`, the
    learner before SDPAttention) keeps k and v repeated to every query head, the fused fc1 output (gate and up, 2 x ffn) and RoPE's cos/sin per layer.

    Megatron (the local spec with `megatron.attention.SDPAttention`; parameters and compute in the learner's
    dtype, no autocast): each RMSNorm keeps its input and a per-token fp32 scale (`rms_norm.py`), each linear
    its input (the normalised inputs, the attention output); the fused QKV output (v is a view of it), q and k
    after RoPE with K/V at their num_query_groups heads (grouped-query kernels), the attention's fp32
    log-sum-exp per head; the fc1 output (2 x ffn), silu(gate), its product with up and the product's input to
    fc2; RoPE's cos and sin for q and for k. Where K/V are expanded to the query heads (CUDA fp32) add 8(q-kv).
    """
    h, q, kv, f, a, hd = d.hidden, d.q_dim, d.kv_dim, d.ffn, d.heads, d.head_dim
    bf16 = s.compute_dtype == "bfloat16"
    if s.backend == "torch":
        if bf16:
            return 26 * h + 8 + 4 * q + 4 * kv + 4 * a + 8 * f
        return 24 * h + 8 + 8 * q + 8 * kv + 4 * a + 16 * f
    if s.attention == "eager":  # megatron-core's own DotProductAttention: K/V repeated to every query head
        if bf16:  # under autocast (the learner before SDPAttention): one cos/sin pair for q and k
            return 22 * h + 8 + 8 * q + 10 * f + 8 * hd
        return 24 * h + 8 + 16 * q + 20 * f + 16 * hd
    b = 2 if bf16 else 4  # the model's dtype
    return b * (4 * h + 3 * q + 3 * kv + 5 * f + 4 * hd) + 8 + 4 * a


def _score_bytes(s: Setup) -> int:
    """Bytes kept per attention score by an eager attention: fp32 probabilities, or bf16 ones (CPU autocast), or
    fp32 softmax output plus the bf16 copy the next matmul takes (CUDA autocast, whose softmax runs in fp32)."""
    if s.compute_dtype == "float32":
        return 4
    return 6 if s.device == "cuda" else 2


def step_memory(d: ModelDims, s: Setup, tokens: int) -> Estimate:
    """Peak bytes of one learner step whose longest trajectory has `tokens` tokens."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    rows = s.rows_per_forward(tokens)
    t = rows * tokens  # tokens in one forward pass
    held = s.rows_held(tokens) * tokens  # tokens whose graphs are alive at once (>= t)
    parts = -(-held // t)  # forwards whose graphs are alive at once
    p = d.params
    trainable = d.lora_params(s.lora_rank, s.lora_targets) if s.lora_rank else p
    bf16 = s.compute_dtype == "bfloat16"
    static = [
        Term("weights", 4 * p, "fp32 master weights"),
        Term("adam", 8 * trainable, "AdamW exp_avg + exp_avg_sq (fp32)"),
    ]
    megatron_bf16 = s.backend == "megatron" and bf16
    if megatron_bf16:  # megatron's bf16 scheme: the model itself is bf16, `weights` are its fp32 main copies
        static.append(Term("bf16_weights", 2 * p, "the model's bf16 parameters"))
    if s.opob == "exact":
        static.append(Term("opob_sums", 8 * trainable, "exact OPOB: two gradient-sized fp32 running sums"))
    # Phase 1: the optimizer step (gradients complete). The learners' AdamW is fused (learners/_optim.py): no
    # parameter-sized temporary as foreach keeps on CUDA; at most one parameter's worth is counted.
    scratch = 4 * max(d.vocab * d.hidden, d.hidden * d.ffn)
    optimizer = [
        *static,
        Term("grads", 4 * trainable),
        Term("optimizer_scratch", scratch, "AdamW temporaries"),
    ]

    # Phase 2: the backward pass. Alive throughout: what the layers keep (all their activations, or with full
    # recompute only each layer's input); on top, at its start the log-prob workspace, later one layer's backward
    # (under full recompute: that layer's activations recomputed) and the gradients it holds at once, those of
    # one of its two blocks (attention or MLP): about half its activations, plus three [heads, S, S] gradients
    # through an eager attention's softmax.
    a_layer = _per_layer_token_bytes(d, s) * t
    scores = score_grads = 0
    if s.attention == "eager":  # megatron packs a micro-batch into one sequence: one [S_total]^2 block
        seq, seqs = (t, 1) if s.packed else (tokens, rows)
        scores = d.heads * seq * seq * seqs * _score_bytes(s)
        # in its backward: the gradients of the probabilities, of the masked scores and of the scaled scores
        score_grads = 3 * d.heads * seq * seq * seqs * (2 if bf16 and s.device == "cpu" else 4)
    layer_backward = a_layer // 2 + score_grads
    if s.recompute == "none":
        acts = [Term("activations", d.layers * a_layer), Term("attention_scores", d.layers * scores)]
    elif s.recompute == "selective":  # megatron: core attention recomputed in backward, the rest kept
        acts = [Term("activations", d.layers * a_layer)]
        layer_backward += scores
    else:  # full: each layer's input kept (the fp32 residual stream), one layer recomputed at a time
        residual = 2 if megatron_bf16 else 4  # megatron's residual stream is in the model's dtype
        acts = [Term("checkpoints", d.layers * residual * d.hidden * held)]
        layer_backward += a_layer + scores
    if s.attention == "eager":
        acts.append(Term("attention_mask", (t if s.packed else tokens) ** 2, "bool [S, S]"))
    if s.backend == "megatron":  # the final RMSNorm's input and scale, its output kept by the log-prob head
        final_norm = (4 if megatron_bf16 else 8) * d.hidden + 4
    else:
        final_norm = 10 * d.hidden + 4 if bf16 else 12 * d.hidden + 4
    rope_ids = 8 + 8 * d.head_dim  # bytes per token, as final_norm
    acts.append(Term("embedding_norm_rope", (final_norm + rope_ids) * held))
    if bf16 and s.backend == "torch":  # the head's copy is kept by every held forward
        kept = d.layer_matmul_params * (1 if s.recompute == "full" else d.layers) + parts * d.vocab * d.hidden
        acts.append(
            Term("bf16_weight_copies", 2 * kept, "autocast's casts, kept by each linear for backward")
        )
    logprob = _megatron_logprob_workspace(d, s, t) if s.backend == "megatron" else _logprob_workspace(d, s, t)
    grads_so_far = 4 * trainable if s.opob != "exact" else 4 * (d.vocab * d.hidden if not s.lora_rank else 0)
    backward = [
        *static,
        *acts,
        Term("grads", grads_so_far, "accumulated over micro-batches" if s.opob != "exact" else "lm head"),
        Term(
            "peak_workspace",
            max(logprob, layer_backward),
            "log-prob [tokens, vocab], or one layer's backward",
        ),
    ]
    phase = max((optimizer, backward), key=lambda terms: sum(x.bytes for x in terms))
    return Estimate(tokens, rows, tuple(phase))


def _logprob_workspace(d: ModelDims, s: Setup, t: int) -> int:
    """Bytes of the log-prob computation at its peak, over `t` tokens.

    Full: the fp32 log-softmax [t, V] kept for backward plus, at the start of backward, the gradient scattered
    into [t, V] and the log-softmax's input gradient [t, V]: 12 bytes per token per vocabulary entry. The
    forward holds less (bf16 logits, their fp32 copy and the log-softmax: 10; proxy OPOB's Σp² pass: the
    log-softmax and one [t, V] fp32 temporary, 8). Chunked (vcpo.logprobs.linear_logprobs), one chunk at a time:
    its forward holds the logits, their fp32 copy and the fp32 log-softmax (10 in bf16, 8 in fp32), its backward
    the logits and their gradient in the matmul's dtype (4 in bf16, 8 in fp32); the 12 of the full case stays
    the bound (the estimate's cells on a GPU measured within 25 % with it)."""
    span = min(t, s.logprob_chunk_tokens) if s.logprobs == "chunked" else t
    return 12 * d.vocab * span


def megatron_logprob_chunk(vocab: int, tp: int = 1) -> int:
    """Tokens per chunk of the Megatron learner's log-probs (it sizes its chunks in bytes of fp32 logits)."""
    return max(1, MEGATRON_LOGIT_CHUNK_BYTES // (4 * vocab // tp))


def _megatron_logprob_workspace(d: ModelDims, s: Setup, t: int) -> int:
    """Bytes of megatron's log-prob head (megatron/linear_logprobs.py) at its peak, the start of backward.

    Chunked always: one chunk's logits [c, V]: in bf16 the GEMM's output and its fp32 copy (forward; on a GPU
    the backward holds less: the logits and their softmax in bf16), in fp32 one buffer turned in place into the
    gradient; the fp32 dW accumulator [V, H] and one chunk's dW product in the model's dtype.

    On CPU in bf16 the backward is the peak: it scales the bf16 softmax in place by an fp32 per-token factor
    (`softmax(z).mul_(factor)`), and a CPU kernel given mixed dtypes computes in the common dtype through two
    fp32 temporaries of the chunk's size, the operand's cast and the result, before writing back (a CUDA kernel
    casts per element, no temporaries): logits 2 + softmax 2 + 8 bytes per entry. This is what a measured
    'megatron exact +ckpt 2x8192' peak of 109 MiB against the 62 MiB estimated without it came from (traced
    with torch's profiler, 2026-12-06: `_LinearLogprobsBackward` > `aten::mul_` > `aten::to`, `empty_like`)."""
    span = min(t, s.logprob_chunk_tokens) if s.logprobs == "chunked" else t
    b = 2 if s.compute_dtype == "bfloat16" else 4
    per_entry = 4 if b == 4 else 12 if s.device == "cpu" else 6  # fp32: one buffer; bf16: see above
    return per_entry * d.vocab * span + (4 + b) * d.vocab * d.hidden


def max_trajectory_tokens(d: ModelDims, s: Setup, memory_bytes: int, *, ceiling: int = 1 << 24) -> int:
    """The longest trajectory (tokens) whose step fits in `memory_bytes`; 0 when not even one token does."""
    if step_memory(d, s, 1).total > memory_bytes:
        return 0
    lo, hi = 1, ceiling
    if step_memory(d, s, hi).total <= memory_bytes:
        return hi
    while hi - lo > 1:  # step_memory grows with tokens: bisect
        mid = (lo + hi) // 2
        if step_memory(d, s, mid).total <= memory_bytes:
            lo = mid
        else:
            hi = mid
    return lo


# -- a recipe's learner -> Setup, and the warning before a run -------------------------------------------


def setup_of(
    recipe: Recipe, dims: ModelDims, device: Literal["cpu", "cuda"], *, group_size: int = 1
) -> Setup:
    """The memory-relevant settings of a recipe's learner for the model `dims` on `device`; `group_size`: the
    training environment's trajectories per prompt."""
    lc, ac = recipe.learner, recipe.algorithm
    gc = lc.gradient_checkpointing
    recompute = "full" if gc in (True, "full") else ("selective" if gc == "selective" else "none")
    opob = ac.opob_mode if ac.advantage == "opob" else "none"
    return Setup(
        backend=lc.backend,
        compute_dtype=lc.dtype,
        recompute=recompute,  # type: ignore[arg-type]
        attention="fused",  # torch: SDPA; megatron: Transformer Engine's, else SDPAttention (torch SDPA)
        logprobs="chunked",  # torch: vcpo.logprobs.linear_logprobs; megatron: megatron/linear_logprobs.py
        logprob_chunk_tokens=(
            lc.logprob_chunk_tokens if lc.backend == "torch" else megatron_logprob_chunk(dims.vocab, lc.tp)
        ),
        lora_rank=lc.lora.rank if lc.lora is not None else None,
        lora_targets=tuple(lc.lora.target_modules) if lc.lora is not None else LORA_TARGETS,
        opob=opob,  # type: ignore[arg-type]
        micro_batch_rows=lc.micro_batch_size,
        micro_batch_tokens=lc.micro_batch_tokens,
        packed=lc.pack_sequences is not False,  # on by default for both learners
        device=device,
        group_rows=group_size,
        hold_group=lc.proxy_hold_group,
    )


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    bytes: int


def device_memory() -> DeviceMemory:
    """The learner's device here: GPU 0's memory when CUDA is available, else this machine's available RAM."""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return DeviceMemory(f"cuda:0 ({props.name})", int(props.total_memory))
    except ImportError:
        pass
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return DeviceMemory("cpu (available RAM)", int(fields["MemAvailable"].split()[0]) * 1024)


def check_recipe(recipe: Recipe, memory: DeviceMemory | None = None) -> str | None:
    """A one-line warning when a step on the recipe's longest trajectory (engines.max_seq_len) cannot fit the
    learner's device memory (per rank: tp/cp shard the model, which this model does not split); else None."""
    memory = memory or device_memory()
    device: Literal["cpu", "cuda"] = "cuda" if memory.name.startswith("cuda") else "cpu"
    try:
        dims = ModelDims.from_model_dir(recipe.model.path)
    except ValueError as e:
        return f"note: learner memory not estimated: {e}"
    setup = setup_of(recipe, dims, device, group_size=_group_size(recipe))
    longest = recipe.engines.max_seq_len
    est = step_memory(dims, setup, longest)
    if est.total <= memory.bytes or recipe.learner.tp * recipe.learner.cp > 1:
        return None
    fits = max_trajectory_tokens(dims, setup, memory.bytes)
    return (
        f"warning: learner memory: a step on one {longest}-token trajectory (engines.max_seq_len) needs about "
        f"{est.describe()}; {memory.name} has {memory.bytes / GiB:.1f} GiB, which fits about {fits} tokens. "
        f"Lower engines.max_seq_len{_remedies(setup, longest)}"
    )


def _group_size(recipe: Recipe) -> int:
    """The training environment's group size (1 where its spec does not load: its own check says why)."""
    import envs

    try:
        return envs.load(recipe.envs.train).group_size
    except (envs.ConfigError, OSError):
        return 1


def _remedies(s: Setup, tokens: int) -> str:
    out = []
    if s.recompute == "none":
        out.append("set learner.gradient_checkpointing: true")
    if s.opob == "proxy" or s.opob == "none":
        out.append("lower learner.micro_batch_size / set learner.micro_batch_tokens")
    if s.rows_held(tokens) > s.rows_per_forward(tokens):
        out.append("set learner.proxy_hold_group: false")
    if s.compute_dtype == "float32":
        out.append("set learner.dtype: bfloat16")
    return (", or " + ", or ".join(out)) if out else ""
