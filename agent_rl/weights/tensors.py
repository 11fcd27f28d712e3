"""Moving weights into a running engine: read a safetensors directory, copy tensors in place, hand off via /dev/shm.

In-process updates copy the given tensors straight into the existing parameters (no reallocation,
so anything holding a parameter reference stays valid). Across processes on one machine the
sender writes a safetensors file under /dev/shm (RAM-backed tmpfs, never the disk) and the server
loads it with the same code path as a checkpoint directory; safetensors maps the file, so the
only copy is the in-place one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

SHM_ROOT = Path("/dev/shm")


class WeightsRejected(ValueError):
    """A weight update or adapter that does not fit the model (unknown names, wrong shapes, NaN or inf) or cannot
    be read (a corrupt file): the sender's mistake (the embedded engine raises it as its BadRequest, which its
    server answers with a 400)."""


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of every *.safetensors file in `path` (a file path is accepted too). FileNotFoundError when
    there is none; WeightsRejected naming the file when one is not a readable safetensors file."""
    from safetensors.torch import load_file

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{p}: no *.safetensors files to load weights from")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            out.update(load_file(str(f)))
        except Exception as e:  # safetensors' own error type (SafetensorError), or an OSError of the read
            raise WeightsRejected(
                f"{f}: not a readable safetensors file ({str(e).splitlines()[0]})"
            ) from None
    return out


@torch.no_grad()
def copy_weights_(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Copy `tensors` (Hugging Face names) into `model`'s parameters in place; return how many were copied.

    Checks every name and shape before copying anything, so a bad update leaves the model untouched.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    unknown = [n for n in tensors if n not in params]
    if unknown:
        raise WeightsRejected(
            f"weight update names unknown parameters {unknown[:5]} (expected names like {next(iter(params))!r})"
        )
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(params[name].shape):
            raise WeightsRejected(
                f"weight update {name}: shape {tuple(t.shape)} != parameter shape {tuple(params[name].shape)}"
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise WeightsRejected(f"weight update {name}: contains NaN or inf")
    for name, t in tensors.items():
        params[name].copy_(t)
    return len(tensors)


def write_shm_checkpoint(tensors: Mapping[str, torch.Tensor]) -> Path:
    """Write tensors as one safetensors file in a fresh /dev/shm directory (falls back to the temp dir)."""
    from safetensors.torch import save_file

    out = shm_dir()
    # safetensors refuses shared storage (tied embeddings) and non-contiguous views: give it plain copies.
    save_file(
        {n: t.detach().to("cpu").contiguous().clone() for n, t in tensors.items()},
        str(out / "model.safetensors"),
    )
    return out


def shm_dir() -> Path:
    """A fresh directory in /dev/shm (RAM; the temp dir where there is none); during a run, in the run's own
    directory there ($AGENT_RL_SHM_DIR, agent_rl/auth.py), the only one its engine servers load from."""
    from agent_rl.auth import SHM_ENV

    root = os.environ.get(SHM_ENV) or (SHM_ROOT if SHM_ROOT.is_dir() else None)
    return Path(tempfile.mkdtemp(prefix="agent_rl_weights_", dir=root))


def remove_checkpoint(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
