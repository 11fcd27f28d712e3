"""bf16 training the way megatron does it: bf16 parameters and compute, fp32 main weights and gradients.

What megatron-core does (`--bf16`): the model is built with bf16 parameters (`params_dtype`,
`Float16Module`), so the whole forward and backward run in bf16 with no autocast; its DDP gives
every parameter an fp32 `main_grad` and, in a hook after each backward, does
`main_grad.add_(param.grad); param.grad = None`; `Float16OptimizerWithFloat16Params` (or the
distributed optimizer) keeps an fp32 copy of every bf16 parameter, steps the copies from the
fp32 gradients and copies them back into the bf16 parameters.

Why not those classes themselves: in megatron-core 0.16 both hard-code CUDA (the optimizer
accepts only `torch.cuda.*Tensor` parameters and keeps its found-inf / overflow buffers on
'cuda'; DDP allocates its grad buffers on `torch.cuda.current_device()` and syncs CUDA streams),
and both are shaped for megatron's training loop, while `vcpo.Step` drives the update through
`.grad` of the module it is given (a backward per trajectory, its norm, two running sums,
clipping, one `optimizer.step()`). This module is the same scheme for that contract:

- `MainParams` is an `nn.Module` whose parameters are the fp32 main copies, one per bf16
  parameter, carrying megatron's TP / SP attributes; vcpo.Step and AdamW see it, never the
  bf16 model, so gradient accumulation, norms, clipping and the optimizer run in fp32;
- a post-accumulate-grad hook on every bf16 parameter moves its gradient into the main
  copy's `.grad` in fp32 and frees the bf16 one (megatron DDP's hook);
- after every optimizer step the main weights are copied, rounded, into the bf16 parameters.
  Weights handed to the engines and checkpoints come from the fp32 main copies.

Activation recompute needs nothing from this: the forward is bf16 from end to end, so a layer
re-run by megatron's CheckpointFunction in backward computes in the same precision as the first
time (autocast, which is not carried into that re-run, made fp32 weights meet bf16 activations).
"""

from __future__ import annotations

import torch
from torch import nn

TP_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride", "sequence_parallel", "shared")
"""megatron's per-parameter attributes that the gradient reductions (grads.py) read."""


class MainParams(nn.Module):
    """fp32 main copies of a low-precision model's parameters; see the module docstring."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._model = (model,)  # a tuple: not a submodule, its parameters are not ours
        self._pairs: list[tuple[nn.Parameter, nn.Parameter]] = []
        self._names: dict[str, nn.Parameter] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            main = nn.Parameter(p.detach().to(torch.float32, copy=True))
            self.register_parameter(name.replace(".", "/"), main)
            p.main_param = main  # type: ignore[attr-defined]  # megatron's name for the link
            p.register_post_accumulate_grad_hook(_move_grad_to_main)
            self._pairs.append((p, main))
            self._names[name] = main
        self._copy_attributes(to_main=True)

    def named(self) -> dict[str, nn.Parameter]:
        """The main copies under the model's parameter names."""
        return dict(self._names)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round the main weights into the model's parameters (and give them the main copies' TP attributes)."""
        for p, main in self._pairs:
            p.copy_(main)
        self._copy_attributes(to_main=False)

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy the main weights into the model after every step of `optimizer` (which holds the main copies)."""
        optimizer.register_step_post_hook(lambda *_: self.copy_to_model())

    def _copy_attributes(self, *, to_main: bool) -> None:
        for p, main in self._pairs:
            src, dst = (p, main) if to_main else (main, p)
            for attr in TP_ATTRIBUTES:
                if hasattr(src, attr):
                    setattr(dst, attr, getattr(src, attr))


def _move_grad_to_main(p: torch.Tensor) -> None:
    """After autograd accumulated p.grad: add it to the fp32 main gradient, free the low-precision one."""
    main = p.main_param  # type: ignore[attr-defined]
    if main.grad is None:
        main.grad = p.grad.to(torch.float32)
    else:
        main.grad.add_(p.grad)
    p.grad = None
