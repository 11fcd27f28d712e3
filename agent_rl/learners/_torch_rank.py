"""One data-parallel rank of the torch learner: model, AdamW, lr schedule, the vcpo step, checkpoint I/O.

The same class runs in-process (dp=1) and inside each worker process (dp>1); it never
splits or collates data (the facade does) and never talks to other ranks except through
the vcpo step's collectives on `dp_group`.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from safetensors.torch import load_model, save_model

from agent_rl.learners._optim import adamw, load_adamw_state
from agent_rl.learners._schedule import build_scheduler
from agent_rl.learners.hf_logprobs import HFLogprobs
from agent_rl.learners.routing_replay import RouteBatch, RoutingReplay
from agent_rl.weights import group as weight_group
from vcpo.batch import PolicyBatch
from vcpo.logprobs import CHUNK_TOKENS
from vcpo.step import RowResults, Step, StepConfig

if TYPE_CHECKING:
    from agent_rl.config import LoraConfig
    from agent_rl.weights.adapters import Adapter

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs to build itself (picklable: it crosses a process boundary)."""

    model_path: str
    weights_dtype: Literal["float32", "bfloat16"]  # dtype handed to engines by hf_state_dict
    compute_dtype: Literal["float32", "bfloat16"]  # autocast dtype of forward passes; master weights are fp32
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    lr_schedule: Literal["constant", "cosine", "linear"]
    warmup_steps: int
    total_steps: int
    gradient_checkpointing: bool
    step: StepConfig
    seed: int
    lora: LoraConfig | None = None  # train adapters only (learners/lora.py)
    pack: bool = True  # a micro-batch's trajectories as one packed row (hf_logprobs.py); False: padded rows
    logprob_chunk_tokens: int = CHUNK_TOKENS  # tokens per chunk of the output head + log-softmax
    compile: bool = False  # torch.compile the decoder (dynamic shapes)
    share_prefixes: bool = True  # run a micro-batch's common prefixes once (shared_prefix.py)
    routing_replay: Literal["off", "rollout"] = "off"  # MoE: replay the engine's experts (routing_replay.py)
    lm_head_fp32: bool = False  # the output head in fp32 outside bf16 autocast (hf_logprobs.py)


class TorchRank:
    def __init__(self, spec: RankSpec, *, dp_group: dist.ProcessGroup | None = None, device: str = "cpu"):
        from transformers import AutoModelForCausalLM

        self.spec = spec
        self.device = torch.device(device)
        self.rank = dist.get_rank(dp_group) if dp_group is not None else 0
        _seed_everything(spec.seed)
        model = AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=torch.float32).to(self.device)
        if spec.gradient_checkpointing:
            # transformers 5 renamed it; older releases only have gradient_checkpointing_enable
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model.config.use_cache = False
        if spec.lora is not None:
            from agent_rl.learners import lora

            model = lora.wrap(model, spec.lora, gradient_checkpointing=spec.gradient_checkpointing)
        model.train()
        self.model = model
        self._lp = HFLogprobs(
            model,
            pack=spec.pack,
            chunk_tokens=spec.logprob_chunk_tokens,
            compile=spec.compile,
            head_fp32=spec.lm_head_fp32,
            share_prefixes=spec.share_prefixes,
        )
        self._routing = RoutingReplay.attach(model, replay=spec.routing_replay == "rollout")
        self._weight_group: tuple[dist.ProcessGroup, str] | None = None  # (group, backend) once joined
        self.optimizer = adamw(
            (p for p in model.parameters() if p.requires_grad),
            lr=spec.lr,
            betas=spec.betas,
            weight_decay=spec.weight_decay,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            schedule=spec.lr_schedule,
            warmup_steps=spec.warmup_steps,
            total_steps=spec.total_steps,
        )
        self._autocast = DTYPES[spec.compute_dtype] if spec.compute_dtype != "float32" else None
        # where the step's time goes (perf/learner_{forward,optimizer}_seconds; the rest is backward and the
        # loss): wall time on this rank, exact on CPU; on CUDA the launches only (kernels run async)
        self._phase = {"forward": 0.0, "optimizer": 0.0}
        self._t_opt = 0.0
        self.optimizer.register_step_pre_hook(self._optimizer_starts)
        self.optimizer.register_step_post_hook(self._optimizer_ends)
        self._step = Step(
            model,
            self.optimizer,
            spec.step,
            dp_group=dp_group,
            logprob_fn=self._logprobs,
            proxy_fn=self._proxy,
            # the log-probs call the output head as a function of the decoder's last hidden state
            ghost_head=(self._lp.head, self._lp.decoder) if self._lp.plain_head else None,
        )
        # ghost norms read each trajectory's own activations, routing replay each token's own routes: no sharing
        self._lp.share_prefixes = (
            self._lp.share_prefixes and self._step.ghost is None and self._routing is None
        )

    def _optimizer_starts(self, *_: Any) -> None:
        self._t_opt = time.perf_counter()

    def _optimizer_ends(self, *_: Any) -> None:
        self._phase["optimizer"] += time.perf_counter() - self._t_opt

    def _logprobs(
        self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        t0 = time.perf_counter()
        try:
            return self._logprobs_timed(model, input_ids, attention_mask)
        finally:
            self._phase["forward"] += time.perf_counter() - t0

    def _logprobs_timed(
        self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        with (
            torch.autocast(
                self.device.type, dtype=self._autocast or torch.float32, enabled=self._autocast is not None
            ),
            self._rows(input_ids, attention_mask),
        ):
            return self._lp.logprobs(model, input_ids, attention_mask)

    def _proxy(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        t0 = time.perf_counter()
        try:
            return self._proxy_timed(model, input_ids, attention_mask)
        finally:
            self._phase["forward"] += time.perf_counter() - t0

    def _proxy_timed(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        with (
            torch.autocast(
                self.device.type, dtype=self._autocast or torch.float32, enabled=self._autocast is not None
            ),
            self._rows(input_ids, attention_mask),
        ):
            return self._lp.proxy(model, input_ids, attention_mask)

    def _rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return self._routing.rows(input_ids, attention_mask) if self._routing else contextlib.nullcontext()

    def step(self, batch: PolicyBatch, routes: RouteBatch | None = None) -> dict[str, float]:
        """One optimizer update on this rank's share; every rank must call it (collectives inside).
        `routes`: the rollout's routed experts of an MoE model (replayed, and measured: routing_replay.py)."""
        lr = self.scheduler.get_last_lr()[0]
        self._phase = dict.fromkeys(self._phase, 0.0)
        batch = batch.to(self.device)
        with (
            self._routing.step(batch.input_ids, batch.attention_mask, routes)
            if self._routing
            else contextlib.nullcontext()
        ):
            metrics = dict(self._step(batch).as_dict())
        if self._routing is not None:
            metrics |= self._routing.pop_stats()
        self.scheduler.step()
        metrics["lr_scheduled"] = lr
        metrics |= {f"perf/learner_{k}_seconds": v for k, v in self._phase.items()}
        return metrics

    def set_lr_scale(self, scale: float) -> None:
        """Base lr = spec.lr x scale from now on (the schedule's factor still applies); saved with the
        scheduler's state. The collapse monitor's rollback lowers it."""
        self.scheduler.base_lrs = [self.spec.lr * scale for _ in self.optimizer.param_groups]
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base * factor
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]  # what get_last_lr() reports

    def last_rows(self) -> RowResults | None:
        """Per-trajectory results of this rank's last step (current log-probs, baseline, advantage)."""
        return self._step.last_rows

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights under HF names in the engines' dtype (LoRA: the adapter merged in)."""
        dtype = DTYPES[self.spec.weights_dtype]
        if self.spec.lora is not None:
            from agent_rl.learners.lora import merged_state_dict

            return merged_state_dict(self.model, dtype)
        return {k: v.detach().to("cpu", dtype=dtype, copy=True) for k, v in self.model.state_dict().items()}

    def adapter(self) -> Adapter | None:
        """LoRA: the adapter tensors (what a weight push ships); None when every weight trains."""
        if self.spec.lora is None:
            return None
        from agent_rl.learners.lora import adapter_of

        return adapter_of(self.model, self.spec.lora)

    def payload_bytes(self) -> int:
        """Bytes one weight push ships: the adapter (LoRA) or every weight in the engines' dtype."""
        if (a := self.adapter()) is not None:
            return a.nbytes
        size = torch.tensor([], dtype=DTYPES[self.spec.weights_dtype]).element_size()
        return sum(t.numel() for t in self.model.state_dict().values()) * size

    # -- weight broadcast to the engines (agent_rl/weights/group.py); rank 0 only ---------------
    def weight_endpoint(self, toward_host: str) -> weight_group.Endpoint:
        """Where this rank can host the weight group: NCCL when it holds a GPU, else gloo."""
        return weight_group.free_endpoint(toward_host, "nccl" if self.device.type == "cuda" else "gloo")

    def join_weight_group(self, spec: weight_group.GroupSpec) -> weight_group.TensorMeta:
        """Join as rank 0 (blocks until every engine rank joined); returns what each broadcast sends."""
        if self.spec.lora is not None:  # the config refuses this pairing; a direct caller gets told too
            raise ValueError("LoRA adapters are published by memory or disk, not by the weight broadcast")
        self._weight_group = weight_group.rejoin(self._weight_group, spec)
        params = self.model.state_dict()
        dtype = weight_group.dtype_name(DTYPES[self.spec.weights_dtype])
        return weight_group.TensorMeta(
            tuple(params), (dtype,) * len(params), tuple(tuple(t.shape) for t in params.values())
        )

    def broadcast_weights(self) -> str | None:
        """Send the current weights in the engines' dtype, in `join_weight_group`'s order; the group's failure
        (a member lost) comes back as text."""
        if self._weight_group is None:
            raise RuntimeError("broadcast_weights before join_weight_group")
        group, backend = self._weight_group
        dtype = DTYPES[self.spec.weights_dtype]
        return weight_group.send_or_error(
            (t.to(dtype) for t in self.model.state_dict().values()), group, backend
        )

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, path: str, version: int) -> None:
        """Rank 0 writes fp32 master weights, optimizer and schedule; every rank writes its RNG state.

        (The checkpoint module exports an HF directory for engines and eval next to this.)
        """
        out = Path(path)
        if self.rank == 0:
            if (adapter := self.adapter()) is not None:
                adapter.save(
                    out / "adapter", base_model=self.spec.model_path
                )  # the adapter: base is model.path
            else:
                save_model(self.model, str(out / "model.safetensors"))
            torch.save(
                {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                out / "optimizer.pt",
            )
            (out / "learner.json").write_text(json.dumps({"version": version, "backend": "torch"}))
        torch.save(_rng_state(), out / f"rng_rank{self.rank}.pt")

    def load(self, path: str) -> int:
        """Restore everything `save` wrote; returns the saved version."""
        src = Path(path)
        weights = "adapter/adapter_model.safetensors" if self.spec.lora is not None else "model.safetensors"
        for name in ("learner.json", weights, "optimizer.pt"):
            if not (src / name).is_file():
                raise FileNotFoundError(
                    f"{src / name} not found: {src} is not a torch learner checkpoint"
                    f"{' with LoRA' if self.spec.lora is not None else ''}"
                )
        meta = json.loads((src / "learner.json").read_text())
        if self.spec.lora is not None:
            from agent_rl.learners.lora import load_adapter_
            from agent_rl.weights.adapters import Adapter

            load_adapter_(self.model, Adapter.load(src / "adapter"))
        else:
            missing, unexpected = load_model(
                self.model, str(src / "model.safetensors"), strict=False, device=str(self.device)
            )
            if missing or unexpected:
                raise ValueError(
                    f"{src / 'model.safetensors'} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
        opt = torch.load(src / "optimizer.pt", map_location=self.device, weights_only=True)
        load_adamw_state(self.optimizer, opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])
        rng = src / f"rng_rank{self.rank}.pt"
        if rng.is_file():
            _set_rng_state(torch.load(rng, weights_only=False))
        return int(meta["version"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def _rng_state() -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
