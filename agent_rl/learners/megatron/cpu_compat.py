"""CPU compatibility layer for megatron-core: what lets the tests and the CPU benchmark run TP/SP on gloo.

megatron-core 0.16 assumes CUDA in a few places that matter for a CPU run of tensor and
sequence parallelism over gloo. This module holds every work-around in one place:

- `torch.cuda.current_device` answers "cpu", so megatron's global memory buffer (used by
  the sequence-parallel all-gather) and the TP linears allocate on the CPU;
- the RNG tracker is the "inference" tracker, which forks the CPU generator instead of
  CUDA generators (no dropout runs here: all dropouts are 0), and activation recompute
  saves and restores no CUDA generator state;
- `SequenceParallelRMSNorm` replaces Transformer Engine's RMSNorm, the only megatron norm
  that accepts `sequence_parallel` (torch's asserts). Like TE's, it tags its weight with
  `sequence_parallel`, so the learner all-reduces that weight's gradient over TP.

`enable_cpu_megatron` is applied on machines without CUDA, and in the processes of CPU ranks of a
multi-rank group on a machine with GPUs. A CPU rank that may share its process with CUDA work (a one-rank group
built in the caller's process on a machine with GPUs) gets what it needs without the process-wide
`current_device` patch: `use_cpu_rng` (megatron's tracker is megatron's own process state) and
`keep_rotary_on_cpu` (megatron moves the rotary table to the current CUDA device on first use; seen on an H200,
2026-11-27: "found at least two devices, cuda:0 and cpu" in the packed RoPE). On GPUs the learner uses
Transformer Engine's layer spec; only a GPU without Transformer Engine falls back to the
local spec with `SequenceParallelRMSNorm` (plain torch, nothing CPU-specific in it).
"""

from __future__ import annotations

import torch


def enable_cpu_megatron() -> None:
    """Patch the CUDA-only calls megatron-core makes on the TP/SP paths. Idempotent; call after init_process_group.
    Process-wide: on a machine with GPUs, only in a CPU rank's own process (`init_model_parallel` says when)."""
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    use_cpu_rng()


def use_cpu_rng() -> None:
    """megatron's RNG tracker on the CPU generator, for a rank that computes on the CPU (megatron-core's own
    process state, not torch's: a CUDA rank never shares a process with a Megatron CPU rank)."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom.initialize_rng_tracker(inference_rng_tracker=True)
    # Activation recompute saves and restores the RNG states around each recomputed chunk: the CPU generator's
    # with torch's own calls, the CUDA generator's through these two, which there is none of here.
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: None
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None


def keep_rotary_on_cpu(model: torch.nn.Module) -> None:
    """Keep a CPU model's rotary table on the CPU on a machine with GPUs: megatron's `RotaryEmbedding.get_emb`
    moves `inv_freq` to `torch.cuda.current_device()` whenever it is on the CPU, so this model's get_emb runs the
    class's own with `current_device` answering "cpu" for that call (megatron caches the result per length)."""
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is None or not torch.cuda.is_available():
        return
    get_emb = type(rope).get_emb

    def on_cpu(*args, **kwargs):
        current = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        try:
            return get_emb(rope, *args, **kwargs)
        finally:
            torch.cuda.current_device = current  # type: ignore[assignment]

    rope.get_emb = on_cpu


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch RMSNorm with megatron's constructor, whose weight is marked for the SP gradient all-reduce.

    Under sequence parallelism each TP rank normalises its own slice of the sequence, so its
    weight gradient is a partial sum over that slice; marking the weight `sequence_parallel`
    (as TENorm does) makes `grad_reduce.allreduce_sequence_parallel_grads` sum it over TP.

    `out_dtype` (None: the input's dtype) is what the output is rounded to; the learner sets it to fp32 on the
    decoder's final norm under model.lm_head_fp32 (rank.py), so the head gets that norm's output unrounded.
    """

    out_dtype: torch.dtype | None = None

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused) -> None:
        if config.normalization != "RMSNorm":
            raise ValueError(
                f"SequenceParallelRMSNorm needs normalization=RMSNorm, got {config.normalization!r}"
            )
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from agent_rl.learners.megatron.rms_norm import rms_norm

        return rms_norm(x, self.weight, self.eps, self.out_dtype)
