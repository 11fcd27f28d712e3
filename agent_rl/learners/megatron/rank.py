"""One Megatron learner rank: process groups, the model shard, AdamW, the sharded vcpo step, checkpoints.

Runs inside a process where torch.distributed is already initialised with world size
dp * tp * cp (the facade starts them; a single-process run initialises a 1-rank group).
Megatron's own order "tp-cp-dp" places the TP ranks of a replica next to each other.

Precision (learner.dtype): float32 trains the model's own parameters; bfloat16 builds the model
in bf16 (forward and backward in bf16, every recompute setting) and gives vcpo.Step and AdamW
fp32 main copies (`mixed_precision.MainParams`), megatron's bf16 scheme. With model.lm_head_fp32 the decoder's
final norm returns fp32 (`final_norm_in_fp32`), so the head (logprobs.py) gets it unrounded.
"""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agent_rl.learners._optim import adamw, load_adamw_state
from agent_rl.learners._schedule import build_scheduler
from agent_rl.learners._torch_rank import DTYPES, RankSpec
from agent_rl.learners.megatron.convert import gather_hf_state_dict, load_hf_into_megatron
from agent_rl.learners.megatron.grads import ShardGroups
from agent_rl.learners.megatron.logprobs import megatron_logprobs
from agent_rl.learners.megatron.mixed_precision import MainParams
from agent_rl.learners.megatron.model import (
    ParallelConfig,
    Recompute,
    attention_backend,
    build_gpt_model,
    freeze_padding_row,
    uses_te_spec,
)
from agent_rl.learners.megatron.shape import ModelShape, shape_from_hf_config
from agent_rl.learners.megatron.step import sharded_step
from agent_rl.learners.routing_replay import RouteBatch
from agent_rl.weights import group as weight_group
from vcpo.batch import PolicyBatch
from vcpo.step import RowResults


@dataclass(frozen=True)
class MegatronSpec:
    """The torch learner's rank spec plus the model-parallel layout (picklable)."""

    rank: RankSpec
    par: ParallelConfig
    dp: int = 1
    temperature: float = 1.0
    pack: bool = True  # micro-batches as one packed sequence (packing.py)
    recompute: Recompute = Recompute()  # activation recompute (learner.gradient_checkpointing)

    @property
    def world(self) -> int:
        return self.dp * self.par.tp * self.par.cp


def init_model_parallel(par: ParallelConfig, dp: int, *, cpu: bool | None = None) -> ShardGroups:
    """megatron parallel_state for (tp, cp, dp) on the initialised default group. CPU patches when no GPU, or
    when this rank computes on CPU (`cpu`) in a group of several ranks (processes of their own: megatron-core's
    TP/SP paths allocate on the current CUDA device, which a CPU rank must not touch). A one-rank CPU group on a
    machine with GPUs may share its process with CUDA work: it gets megatron's CPU RNG tracker only (the model keeps
    its rotary table on the CPU: cpu_compat.keep_rotary_on_cpu)."""
    from megatron.core import parallel_state as ps

    world = dist.get_world_size()
    if world != dp * par.tp * par.cp:
        raise ValueError(f"world size {world} != learner.dp {dp} x tp {par.tp} x cp {par.cp}")
    cuda = torch.cuda.is_available()
    if not cuda or (cpu and world > 1):
        from agent_rl.learners.megatron.cpu_compat import enable_cpu_megatron

        enable_cpu_megatron()
        cuda = False
    elif cpu:  # one CPU rank in a process that may run CUDA work too: no process-wide patch
        from agent_rl.learners.megatron.cpu_compat import use_cpu_rng

        use_cpu_rng()
        cuda = False
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=par.tp, context_parallel_size=par.cp)
    if cuda:
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)
    return ShardGroups(
        tp=ps.get_tensor_model_parallel_group() if par.tp > 1 else None,
        cp=ps.get_context_parallel_group() if par.cp > 1 else None,
        dp=ps.get_data_parallel_group() if dp > 1 else None,
        tp_rank=ps.get_tensor_model_parallel_rank(),
    )


def load_hf_weights(model_dir: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """(HF config, fp32 state dict) of a model directory, through transformers (any shard layout it reads)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return hf.config, hf.state_dict()


def computes_on_cpu(device: str | None) -> bool:
    """Where this rank computes: `device` when named ("cpu", "cuda", "cuda:N", as the learner's pool resolved
    learner.device), else the GPU when there is one. Megatron-core puts parameters on the current CUDA device
    unless told otherwise, so a rank told "cpu" on a GPU machine must say so."""
    if device not in (None, "auto"):
        return not device.startswith("cuda")
    return not torch.cuda.is_available()


def final_norm_in_fp32(model: torch.nn.Module) -> None:
    """model.lm_head_fp32 on a bf16 model: the decoder's final norm returns its output in fp32, unrounded.

    The norm computes in fp32 either way (rms_norm.py); this keeps it from rounding its output to bf16. Nothing
    between it and the head casts it back (megatron-core 0.16): TransformerBlock passes it through
    `make_viewless_tensor` (which keeps the dtype), HiddenStatesGPTModel returns it as is (no Float16Module or DDP
    wrapper here: mixed_precision.py), and linear_logprobs' sequence-parallel all-gather keeps its dtype. Its
    gradient comes back in fp32 and the norm returns dx in bf16. Transformer Engine's TENorm (GPUs with TE) has
    no such option: it is replaced by `SequenceParallelRMSNorm`, the same RMSNorm with the same parameter name
    (`decoder.final_layernorm.weight`) and SP tag; call this before weights are loaded or copied."""
    from agent_rl.learners.megatron.cpu_compat import SequenceParallelRMSNorm

    decoder = model.decoder
    norm = decoder.final_layernorm
    if not isinstance(norm, SequenceParallelRMSNorm):
        config = model.config
        device = next(norm.parameters()).device
        norm = SequenceParallelRMSNorm(config, config.hidden_size, eps=config.layernorm_epsilon).to(device)
        decoder.final_layernorm = norm
    norm.out_dtype = torch.float32


class MegatronRank:
    def __init__(self, spec: MegatronSpec, device: str | None = None) -> None:
        self.spec, rs = spec, spec.rank
        self.cpu = computes_on_cpu(device)
        self.groups = init_model_parallel(spec.par, spec.dp, cpu=self.cpu)
        from megatron.core import parallel_state as ps

        self.dp_rank = ps.get_data_parallel_rank()
        self.tp_rank, self.cp_rank = ps.get_tensor_model_parallel_rank(), ps.get_context_parallel_rank()
        random.seed(rs.seed)
        torch.manual_seed(rs.seed)
        hf_config, hf_state = load_hf_weights(rs.model_path)
        self.shape: ModelShape = shape_from_hf_config(hf_config)
        self.te = uses_te_spec(self.cpu, moe=self.shape.moe is not None)
        self.attention = attention_backend(self.cpu, moe=self.shape.moe is not None)
        compute = DTYPES[rs.compute_dtype]
        self.model = build_gpt_model(
            self.shape, spec.par, dtype=compute, cpu=self.cpu, recompute=spec.recompute
        )
        if rs.lm_head_fp32 and compute.itemsize < 4:  # before MainParams copies the parameters
            final_norm_in_fp32(self.model)
        # What AdamW and vcpo.Step train: the model's own fp32 parameters, or fp32 main copies of bf16 ones.
        self.main = MainParams(self.model) if compute != torch.float32 else None
        self.trained: torch.nn.Module = self.main if self.main is not None else self.model
        self._load_weights(hf_state)
        del hf_state
        freeze_padding_row(self.model, self.shape, tp_rank=self.tp_rank)
        self._routing = None  # MoE: routing replay and agreement (moe.py)
        if self.shape.moe is not None:
            from agent_rl.learners.megatron.moe import attach_routing

            replay = rs.routing_replay == "rollout"
            self._routing = attach_routing(self.model, self.shape.moe, replay=replay, seq_major=not spec.pack)
        self.model.train()
        self._weight_group: tuple[dist.ProcessGroup, str] | None = None  # (group, backend), global rank 0
        self.optimizer = adamw(
            self.trained.parameters(), lr=rs.lr, betas=rs.betas, weight_decay=rs.weight_decay
        )
        if self.main is not None:
            self.main.attach(self.optimizer)
        self.scheduler = build_scheduler(
            self.optimizer, schedule=rs.lr_schedule, warmup_steps=rs.warmup_steps, total_steps=rs.total_steps
        )
        self._step = sharded_step(
            self.trained, self.optimizer, rs.step, groups=self.groups, logprob_fn=self.logprobs,
            ghost_norms=self._ghost_norms,
        )  # fmt: skip

    def _ghost_norms(self):
        """The TP-aware ghost hooks on the model (opob_norms: ghost); the fp32 main copies' gradients are kept
        through the norms' backward too."""
        from agent_rl.learners.megatron.ghost import MegatronGhostNorms

        return MegatronGhostNorms(
            self.model, par=self.spec.par, groups=self.groups, pack=self.spec.pack,
            grad_holders=list(self.trained.parameters()),
        )  # fmt: skip

    def fp32_parameters(self) -> dict[str, torch.Tensor]:
        """The fp32 weights under megatron names: the main copies in bf16, else the model's parameters."""
        return self.main.named() if self.main is not None else dict(self.model.named_parameters())

    def _load_weights(self, hf_state: dict[str, torch.Tensor]) -> None:
        load_hf_into_megatron(
            self.fp32_parameters(),
            hf_state,
            self.shape,
            tp_rank=self.tp_rank,
            tp_size=self.spec.par.tp,
            te=self.te,
        )
        if self.main is not None:
            self.main.copy_to_model()

    def logprobs(
        self, _module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """[B, T] log-probs of this rank's model (vcpo's logprob_fn: `_module` is what the Step trains, the
        model itself or its fp32 main copies; the forward always runs the model)."""
        with self._routing.rows(input_ids, attention_mask) if self._routing else contextlib.nullcontext():
            return megatron_logprobs(
                self.model,
                input_ids,
                attention_mask,
                par=self.spec.par,
                cp_group=self.groups.cp,
                temperature=self.spec.temperature,
                pack=self.spec.pack,
                head_fp32=self.spec.rank.lm_head_fp32,
            )

    def step(self, shares: list[PolicyBatch], routes: RouteBatch | None = None) -> dict[str, float]:
        """One optimizer update; `shares[d]` is DP rank d's batch (TP/CP ranks of a replica take the same).
        `routes`: an MoE model's rollout routing of this rank's share (replayed and measured: moe.py)."""
        lr = self.scheduler.get_last_lr()[0]
        batch = shares[self.dp_rank].to("cpu" if self.cpu else "cuda")
        if self._routing is None:
            metrics = dict(self._step(batch).as_dict())
        else:
            with self._routing.step(batch.input_ids, batch.attention_mask, routes):
                metrics = dict(self._step(batch).as_dict())
            metrics |= self._routing.pop_stats()
        self.scheduler.step()
        metrics["lr_scheduled"] = lr
        return metrics

    def last_rows(self) -> tuple[int, RowResults | None]:
        """(DP rank, per-trajectory results of this rank's last step): every TP/CP rank of a replica holds
        the same rows (log-probs are gathered over the vocabulary and the sequence)."""
        return self.dp_rank, self._step.last_rows

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Gathered HF weights in the engines' dtype on global rank 0 (a collective: all ranks call); None elsewhere."""
        state = self._gather_fp32()
        if state is None:
            return None
        dtype = DTYPES[self.spec.rank.weights_dtype]
        return {k: v.to(dtype=dtype, copy=True) for k, v in state.items()}

    # -- weight broadcast to the engines (agent_rl/weights/group.py) -----------------------------------
    def weight_endpoint(self, toward_host: str) -> weight_group.Endpoint:
        """Global rank 0 only: where it can host the weight group (NCCL on a GPU, else gloo)."""
        return weight_group.free_endpoint(toward_host, "gloo" if self.cpu else "nccl")

    def join_weight_group(self, spec: weight_group.GroupSpec) -> weight_group.TensorMeta | None:
        """A collective (the HF gather): all ranks call; global rank 0 joins as the group's rank 0."""
        state = self.hf_state_dict()
        if state is None:
            return None
        self._weight_group = weight_group.rejoin(self._weight_group, spec)
        return weight_group.TensorMeta.of(state)

    def broadcast_weights(self) -> str | None:
        """A collective: TP shards are gathered on every rank of replica 0, then global rank 0 sends; the weight
        group's failure (a member lost) comes back as text."""
        state = self.hf_state_dict()
        if state is None:
            return None
        if self._weight_group is None:
            raise RuntimeError("broadcast_weights before join_weight_group")
        return weight_group.send_or_error(state.values(), *self._weight_group)

    def _gather_fp32(self) -> dict[str, torch.Tensor] | None:
        if self.cp_rank != 0 or self.dp_rank != 0:
            return None  # CP and DP replicas hold identical shards: TP ranks of replica 0 gather
        state = gather_hf_state_dict(self.fp32_parameters(), self.shape, tp_group=self.groups.tp, te=self.te)
        return state if dist.get_rank() == 0 else None

    # -- checkpoints: the torch learner's layout (model.safetensors under HF names, learner.json, rng) --
    # -- plus one optimizer file per model-parallel shard                                              --
    def save(self, path: str, version: int) -> None:
        """Rank 0 writes the gathered fp32 weights; DP rank 0 of every TP/CP shard its optimizer; all ranks RNG."""
        from safetensors.torch import save_file

        out = Path(path)
        weights = self._gather_fp32()
        if weights is not None:
            if self.shape.tie_embeddings:
                weights.pop("lm_head.weight")  # the embedding, as HF's own tied checkpoints store it
            save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
            par = self.spec.par
            meta = {"version": version, "backend": "megatron", "tp": par.tp, "cp": par.cp, "sp": par.sp}
            (out / "learner.json").write_text(json.dumps(meta))
        if self.dp_rank == 0:
            torch.save(
                {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                out / f"optimizer_tp{self.tp_rank}_cp{self.cp_rank}.pt",
            )
        torch.save(
            {"torch": torch.get_rng_state(), "python": random.getstate()},
            out / f"rng_rank{dist.get_rank()}.pt",
        )

    def load(self, path: str) -> int:
        """Restore everything `save` wrote (same tp and cp); returns the saved version."""
        from safetensors.torch import load_file

        src = Path(path)
        par = self.spec.par
        optim = src / f"optimizer_tp{self.tp_rank}_cp{self.cp_rank}.pt"
        for f in (src / "learner.json", src / "model.safetensors", optim):
            if not f.is_file():
                raise FileNotFoundError(
                    f"{f} not found: {src} is not a megatron learner checkpoint for tp={par.tp}"
                )
        meta = json.loads((src / "learner.json").read_text())
        if meta.get("backend") != "megatron" or (meta.get("tp"), meta.get("cp")) != (par.tp, par.cp):
            raise ValueError(
                f"{src}: checkpoint of backend={meta.get('backend')} tp={meta.get('tp')} cp={meta.get('cp')}; "
                f"this learner is megatron tp={par.tp} cp={par.cp} (the optimizer shards must match)"
            )
        self._load_weights(load_file(str(src / "model.safetensors")))
        opt = torch.load(optim, weights_only=True)
        load_adamw_state(self.optimizer, opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])
        rng = src / f"rng_rank{dist.get_rank()}.pt"
        if rng.is_file():
            saved = torch.load(rng, weights_only=False)
            torch.set_rng_state(saved["torch"])
            random.setstate(saved["python"])
        return int(meta["version"])
