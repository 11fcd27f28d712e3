"""A checkpoint written onto a disk that fills up mid-write: one-line error, previous checkpoint intact and loadable.

The disk is a real size-capped tmpfs (needs root to mount; skipped, saying why, otherwise).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from agent_rl import checkpoint
from agent_rl.config import Recipe
from agent_rl.errors import UserError


def _du(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


@pytest.fixture
def small_disk() -> Path:
    """The mount point, made outside pytest's tmp_path tree: another pytest session on the machine rotates old
    numbered tmp dirs away and would move a mounted tmpfs with them, so that the umount below misses it."""
    mnt = Path(tempfile.mkdtemp(prefix="agent-rl-small-disk-"))
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)
    mnt.rmdir()


@pytest.mark.parametrize(
    "fails_in, threshold",
    [("safetensors", "default"), ("torch.save", "default"), ("torch.save", "below_the_partial_write")],
)
def test_a_checkpoint_write_that_fails_leaves_the_previous_checkpoint_loadable(
    tiny_model_dir: Path,
    tmp_path: Path,
    small_disk: Path,
    monkeypatch: pytest.MonkeyPatch,
    fails_in: str,
    threshold: str,
) -> None:
    """fails_in: the write the full disk stops (safetensors names ENOSPC; torch.save's "unexpected pos ..."
    carries no errno). below_the_partial_write: a free-space threshold smaller than what the failed write had
    taken, as with any model whose checkpoint is larger than the threshold (SmolLM2's is ~1.5 GB): the disk must
    be judged full before the partial checkpoint is removed, or torch.save's error becomes a traceback."""
    from transformers import AutoTokenizer

    from agent_rl.learners import build

    recipe = Recipe.model_validate(
        {
            "name": "disk-full",
            "model": {"path": str(tiny_model_dir)},
            "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 1, "batch_prompts": 1},
        }
    )
    learner = build(recipe.learner_spec)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    try:
        # One AdamW step (in-process rank) gives the optimizer state its real size, twice the weights.
        rank = learner.pool.rank
        for p in rank.model.parameters():
            p.grad = torch.zeros_like(p)
        rank.optimizer.step()
        # How big one checkpoint is, measured by writing one on the ordinary disk.
        probe = checkpoint.save(
            tmp_path / "probe",
            learner,
            checkpoint.LoopState(1, {}, {}),
            model_dir=tiny_model_dir,
            keep=2,
            tokenizer=tokenizer,
        )
        size = _du(probe)
        if os.geteuid() != 0:
            pytest.skip("mounting the small tmpfs needs root")
        # Room for one checkpoint, then half the next one's weights (the learner writes them first, with
        # safetensors), or its weights and half its optimizer state (written next, with torch.save).
        weights, optimizer = (_du(probe / "learner" / f) for f in ("model.safetensors", "optimizer.pt"))
        cap = size + (weights // 2 if fails_in == "safetensors" else weights + optimizer // 2)
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={cap}", "tmpfs", str(small_disk)],
            capture_output=True,
            text=True,
        )
        if mount.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
        if threshold == "below_the_partial_write":
            monkeypatch.setattr(checkpoint, "_FULL_BYTES", 4096)  # one page: a full tmpfs has less than that
        run_dir = small_disk / "run"
        first = checkpoint.save(
            run_dir,
            learner,
            checkpoint.LoopState(1, {"cursor": 7}, {}),
            model_dir=tiny_model_dir,
            keep=2,
            tokenizer=tokenizer,
        )
        with pytest.raises(
            UserError, match=r"checkpoint step 2: no space left in .* the previous checkpoint is intact"
        ):
            checkpoint.save(
                run_dir,
                learner,
                checkpoint.LoopState(2, {"cursor": 9}, {}),
                model_dir=tiny_model_dir,
                keep=2,
                tokenizer=tokenizer,
            )
        root = run_dir / "checkpoints"
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # no partial temp dir left
        assert checkpoint.latest(run_dir) == first
        state = checkpoint.load(checkpoint.latest(run_dir), learner)
        assert state.step == 1 and state.prompts == {"cursor": 7}
        from safetensors.torch import load_file

        on_disk = load_file(first / "hf" / "model.safetensors")
        restored = learner.hf_state_dict()
        assert on_disk.keys() == restored.keys()
        assert all(torch.equal(restored[k], on_disk[k]) for k in on_disk)
    finally:
        learner.close()
