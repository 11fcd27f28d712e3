"""Atomic checkpoints of everything a run needs to continue, in-flight rollouts included.

A checkpoint directory `RUN_DIR/checkpoints/step_NNNNNN/` holds:
  learner/     `Learner.save` (model, optimizer, lr schedule, RNG, version)
  hf/          the policy as a Hugging Face model dir for eval and serving: config, generation config, the
               tokenizer the run used (`save_pretrained`: chat template included), safetensors weights
               (sharded with an index above `MAX_SHARD_SIZE`); with LoRA the adapter merged in
  hf_adapter/  LoRA only: the PEFT adapter (`PeftModel.from_pretrained(base, hf_adapter)`)
  loop.pkl     next step, data-set cursor, python/torch RNG, and the buffer's state with every
               half-finished trajectory (`Trajectory.to_bytes`): resuming loses no sampled token.
`step_000000` is the run's start, written only when the monitor may roll back (`monitor.on_warning: rollback`:
the one checkpoint a rollback can always reach); `keep` never removes it.
It is written to a temporary directory and renamed into place, then the symlink `latest -> step_NNNNNN`
is replaced atomically, so a kill at any moment leaves the previous checkpoint intact, and
`RUN_DIR/checkpoints/latest/hf` is what `agent-rl serve` and `AutoModelForCausalLM.from_pretrained` take.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rl.learners.api import Learner

HF_CONFIG_FILES = (
    "config.json",
    "generation_config.json",
)  # from model.path; weights and tokenizer are written
MAX_SHARD_SIZE = "2GB"
START = "step_000000"  # the run's start (see the module docstring): never pruned
_FULL_BYTES = 64 << 20  # a write that failed with less free space than this failed for want of space


@dataclass
class LoopState:
    """The training loop's own state (the learner saves its own)."""

    step: int  # the next step to run
    prompts: dict[str, int]
    buffer: dict[str, Any]
    python_rng: Any = None
    torch_rng: Any = None
    publisher: Any = None  # the weight publisher's own state (rollout.fixed_lag: the engines' weight history)


def save(
    run_dir: Path, learner: Learner, state: LoopState, *, model_dir: Path, keep: int, tokenizer: Any = None
) -> Path:
    """Write one checkpoint atomically; keep the newest `keep`. Returns its directory.

    tokenizer: the one the run uses (model.tokenizer or model.path); default: loaded from `model_dir`."""
    import torch

    root = run_dir / "checkpoints"
    final = root / f"step_{state.step:06d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "hf").mkdir(parents=True)
        learner.save(tmp / "learner")
        export_hf(learner.hf_state_dict(), tmp / "hf", model_dir=model_dir, tokenizer=tokenizer)
        if (adapter := learner.adapter()) is not None:  # LoRA: the PEFT adapter beside the merged model
            adapter.save(tmp / "hf_adapter", base_model=str(model_dir))
        state.python_rng, state.torch_rng = random.getstate(), torch.get_rng_state()
        with open(tmp / "loop.pkl", "wb") as f:
            pickle.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
    except Exception as e:  # torch.save and safetensors report a full disk as their own errors
        # torch.save's own message hides the errno ("unexpected pos ..."): look at the disk itself, before the
        # partial checkpoint goes (removing it frees what the write took: a GiB for a 135M model)
        free = shutil.disk_usage(root).free
        shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint must not keep the disk full
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        full = full or "No space left" in str(e) or "Disk quota exceeded" in str(e)
        if full or free < _FULL_BYTES:
            from agent_rl.errors import UserError

            raise UserError(
                f"checkpoint step {state.step}: no space left in {root} ({e}); the previous checkpoint is "
                f"intact: free space (or lower checkpoint.keep) and continue with --resume {run_dir}"
            ) from e
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _point_latest(root, final.name)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and p.name != START)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def export_hf(
    state_dict: dict[str, Any],
    out: Path,
    *,
    model_dir: Path,
    tokenizer: Any = None,
    max_shard_size: int | str = MAX_SHARD_SIZE,
) -> None:
    """A loadable Hugging Face directory: `state_dict` (HF names) as safetensors, sharded with
    model.safetensors.index.json above `max_shard_size`; config and generation config from `model_dir`;
    the tokenizer through `save_pretrained` (tokenizer files and chat_template.jinja)."""
    from huggingface_hub import save_torch_state_dict

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    save_torch_state_dict(tensors, out, max_shard_size=max_shard_size)
    for name in HF_CONFIG_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.save_pretrained(out)


def latest(run_dir: Path) -> Path:
    """The newest complete checkpoint of a run; a clear error if there is none."""
    pointer = run_dir / "checkpoints" / "latest"
    if pointer.is_symlink():
        name = os.readlink(pointer)
    elif pointer.is_file():  # written before `latest` became a symlink
        name = pointer.read_text().strip()
    else:
        raise FileNotFoundError(
            f"--resume {run_dir}: no checkpoints/latest in it (was it written by `agent-rl train`?)"
        )
    path = run_dir / "checkpoints" / name
    if not (path / "loop.pkl").is_file():
        raise FileNotFoundError(f"--resume {run_dir}: {path} is incomplete (no loop.pkl)")
    return path


def load(path: Path, learner: Learner) -> LoopState:
    """Restore the learner in place and return the loop's state (RNGs already restored)."""
    import torch

    learner.load(path / "learner")
    with open(path / "loop.pkl", "rb") as f:
        state: LoopState = pickle.load(f)  # our own file, written by save() above
    random.setstate(state.python_rng)
    torch.set_rng_state(state.torch_rng)
    return state


def truncate_logs(
    run_dir: Path, step: int, names: tuple[str, ...] = ("metrics.jsonl", "batches.jsonl")
) -> None:
    """Drop log records of steps >= `step` (written after the checkpoint by a run that was then killed)."""
    import json

    for name in names:
        path = run_dir / name
        if path.is_file():
            keep = [
                ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < step
            ]
            write_atomic(path, "".join(ln + "\n" for ln in keep))


def _point_latest(root: Path, name: str) -> None:
    """`root/latest -> name`, replaced atomically (a relative link: the run dir can be moved)."""
    tmp = root / f".latest.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(name, target_is_directory=True)
    latest = root / "latest"
    if latest.is_file() and not latest.is_symlink():
        latest.unlink()  # an old text pointer
    os.replace(tmp, latest)


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole or keeps what it held: a kill mid-write leaves at most a hidden .tmp beside it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
