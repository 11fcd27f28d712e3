"""What benchmarks/gpu_learners.py and the CPU peak-memory runs build: model directories, learner ranks in this
process (no Ray, no worker processes), synthetic VCPO batches, timed steps.

Ranks are built the way a run builds them: a `Recipe` (validated like a user's), its `learner_spec`, then
`TorchRank` or (after joining a 1-rank process group) `MegatronRank`. Nothing here imports Ray or aiohttp:
the benchmark travels to a bare GPU machine (see gpu_learners.py).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

# The Qwen2.5-0.5B architecture (its config.json), randomly initialised: the GPU shape.
QWEN25_05B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "intermediate_size": 4864, "tie_word_embeddings": True,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
}  # fmt: skip
# Small shapes: the correctness checks (fp32), the CPU smoke and the CPU memory table.
SMALL: dict[str, Any] = {
    "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 256, "tie_word_embeddings": False,
    "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
}  # fmt: skip
CPU_TABLE: dict[str, Any] = {
    "vocab_size": 2048, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 512, "tie_word_embeddings": False,
    "max_position_embeddings": 16384, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
}  # fmt: skip

Backend = Literal["torch", "megatron", "anchor"]


def write_model(out: Path, config: dict[str, Any], *, device: str = "cpu", seed: int = 0) -> Path:
    """A randomly initialised Qwen2ForCausalLM of `config` saved (fp32 safetensors) to `out`; returns `out`.
    Built on `device` (a 0.5B model initialises in a second on a GPU, in tens of seconds on two cores)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**config, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    del model
    return out


@dataclass(frozen=True)
class Cell:
    """One measured configuration: which learner, the batch (rows x length tokens), and the learner settings."""

    backend: Backend
    length: int  # tokens per trajectory
    rows: int  # trajectories per step (groups of 2: rewards 1 and 0, so exact OPOB back-propagates each)
    recompute: bool = False
    opob: Literal["exact", "proxy"] = "exact"
    lora: bool = False
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    micro_batch_tokens: int | None = None  # proxy: rows per forward = this // length (at least 1)
    hold_group: bool = True  # proxy: learner.proxy_hold_group (false: a forward-only pass first)
    repeats: int = 2  # timed steps after the warm-up step
    norms: Literal["ghost", "backward"] = "backward"  # exact OPOB: algorithm.opob_norms

    @property
    def name(self) -> str:
        what = "anchor" if self.backend == "anchor" else f"{self.backend} {self.opob}"
        extra = (" +ckpt" if self.recompute else "") + (" +lora" if self.lora else "")
        extra += "" if self.hold_group or self.opob != "proxy" else " -hold"
        extra += (
            " ghost" if self.backend != "anchor" and self.opob == "exact" and self.norms == "ghost" else ""
        )
        return f"{what}{extra} {self.rows}x{self.length}"

    @property
    def tokens(self) -> int:
        return self.rows * self.length

    @property
    def micro_batch_rows(self) -> int:
        if self.micro_batch_tokens is None:
            return self.rows
        return max(1, min(self.rows, self.micro_batch_tokens // self.length))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"name": self.name, "tokens": self.tokens}


def recipe(model_dir: Path, cell: Cell):
    """The recipe a user would write for this cell (validated by the same models as `agent-rl train`)."""
    from agent_rl.config import Recipe

    learner: dict[str, Any] = {
        "backend": cell.backend, "lr": 1e-5, "dtype": cell.dtype, "gradient_checkpointing": cell.recompute,
        "micro_batch_size": cell.micro_batch_rows,
    }  # fmt: skip
    if cell.lora:
        learner["lora"] = {"rank": 8}
    if not cell.hold_group:
        learner["proxy_hold_group"] = False
    return Recipe.model_validate({
        "name": "gpu-learners", "model": {"path": str(model_dir), "dtype": cell.dtype},
        "envs": {"train": "unused.yaml"}, "train": {"steps": 1000, "batch_prompts": 1},
        "learner": learner, "algorithm": {"loss": "vcpo", "advantage": "opob", "opob_mode": cell.opob,
                      "opob_norms": cell.norms},
    })  # fmt: skip


class Rank:
    """One learner rank built in this process as the in-process pool builds it (`learners.rank_kind`, then the
    kind's builder with no process group to join; Megatron's joins a 1-rank group of its own):
    `step(batch)`, `logprobs(ids, mask)`, `model`, `vocab`."""

    def __init__(self, model_dir: Path, cell: Cell, device: str):
        from agent_rl.learners import rank_kind

        kind = rank_kind(recipe(model_dir, cell).learner_spec)
        self.backend = cell.backend
        self.impl: Any = kind.build(kind.spec, 0, 1, None, device)
        self._step_args = kind.step_args
        self.model = self.impl.model
        self.vocab: int = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]

    def step(self, batch) -> dict[str, float]:
        (args,) = self._step_args([batch], 1)
        return self.impl.step(*args)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        fn = self.impl.logprobs if self.backend == "megatron" else self.impl._logprobs
        return fn(self.model, input_ids, attention_mask)


GROUP = 2  # trajectories per group in `batch`


def batch(rows: int, length: int, vocab: int, *, seed: int = 0, device: str = "cpu"):
    """`rows` trajectories of `length` tokens in groups of GROUP = 2 (rewards 1, 0: every group has a gradient); the
    first quarter is prompt (loss mask 0); behaviour log-probs -log(vocab), what a random model samples with,
    so importance weights stay near 1."""
    from vcpo.batch import PolicyBatch

    if rows % GROUP:
        raise ValueError(f"rows must be even (groups of {GROUP}), got {rows}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    loss_mask = torch.zeros(rows, length)
    loss_mask[:, length // 4 :] = 1.0
    behaviour = loss_mask * -math.log(vocab)
    rewards = torch.tensor([1.0, 0.0] * (rows // GROUP))
    groups = torch.arange(rows) // GROUP
    return PolicyBatch(ids, torch.ones_like(ids), loss_mask, behaviour, rewards, groups).to(device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Timing:
    step_s: float  # median of the timed steps
    steps_s: tuple[float, ...]
    peak_bytes: int | None  # torch.cuda.max_memory_allocated over the timed steps (None on CPU)
    metrics: dict[str, float]


def timed_steps(step, repeats: int, device: str) -> Timing:
    """One warm-up call of `step()`, then `repeats` timed ones (device synchronised around each)."""
    import statistics

    metrics = step()
    sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        metrics = step()
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    return Timing(statistics.median(times), tuple(times), peak, dict(metrics or {}))


def with_repeats(cell: Cell, repeats: int) -> Cell:
    return replace(cell, repeats=repeats)
