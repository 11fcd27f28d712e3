"""A checkpoint's hf/ export is a complete Hugging Face model directory: transformers loads it, its chat
template is the run's tokenizer's (model.tokenizer, not model.path's), it generates what the learner's
weights generate, sharding writes an index, and `checkpoints/latest` points at the newest step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_rl import checkpoint
from agent_rl.config import Recipe

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"


@pytest.fixture(scope="module")
def learner_and_tokenizer(tiny_model_dir, tmp_path_factory):
    """The torch learner on the tiny model, with model.tokenizer a separate dir whose chat template differs."""
    from transformers import AutoTokenizer

    from agent_rl.learners import build

    tok_dir = tmp_path_factory.mktemp("tokenizer")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(tok_dir)
    recipe = Recipe.model_validate(
        {
            "name": "export-test",
            "model": {"path": str(tiny_model_dir), "tokenizer": str(tok_dir)},
            "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 1, "batch_prompts": 1},
        }
    )
    learner = build(recipe.learner_spec)
    yield learner, AutoTokenizer.from_pretrained(tok_dir)
    learner.close()


def _greedy(model_dir: Path, tokenizer, prompt: str) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1] :].tolist()


def test_export_loads_with_transformers_carries_the_runs_chat_template_and_generates_the_same(
    learner_and_tokenizer, tiny_model_dir, tmp_path
):
    from transformers import AutoTokenizer

    learner, tokenizer = learner_and_tokenizer
    state = checkpoint.LoopState(step=1, prompts={}, buffer={})
    ckpt = checkpoint.save(tmp_path, learner, state, model_dir=tiny_model_dir, keep=2, tokenizer=tokenizer)
    hf = tmp_path / "checkpoints" / "latest" / "hf"  # what `agent-rl serve` and AutoModel are given
    assert hf.resolve() == (ckpt / "hf").resolve()
    assert (hf / "chat_template.jinja").read_text() == TEMPLATE  # model.tokenizer's, not model.path's
    exported = AutoTokenizer.from_pretrained(hf)
    assert exported.chat_template == TEMPLATE
    assert exported("3 + 4 = 7")["input_ids"] == tokenizer("3 + 4 = 7")["input_ids"]
    # No step was taken: the export's weights are the base model's, so greedy generation is identical.
    assert _greedy(hf, exported, "12 * 34") == _greedy(tiny_model_dir, tokenizer, "12 * 34")


def test_a_large_export_is_sharded_with_an_index_and_loads(learner_and_tokenizer, tiny_model_dir, tmp_path):
    learner, tokenizer = learner_and_tokenizer
    out = tmp_path / "hf"
    checkpoint.export_hf(
        learner.hf_state_dict(), out, model_dir=tiny_model_dir, tokenizer=tokenizer, max_shard_size=200_000
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {p.name for p in shards}
    assert not (out / "model.safetensors").exists()
    assert _greedy(out, tokenizer, "12 * 34") == _greedy(tiny_model_dir, tokenizer, "12 * 34")


def test_keep_never_removes_the_runs_start_checkpoint(learner_and_tokenizer, tiny_model_dir, tmp_path):
    """step_000000 (written only under monitor.on_warning: rollback) is what a rollback can always reach."""
    learner, tokenizer = learner_and_tokenizer
    for step in (0, 5, 10, 15):
        state = checkpoint.LoopState(step, {}, {})
        checkpoint.save(tmp_path, learner, state, model_dir=tiny_model_dir, keep=2, tokenizer=tokenizer)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_000000", "step_000010", "step_000015"]  # the start, then the newest 2


def test_latest_moves_to_the_newest_step_and_old_text_pointers_still_resume(
    learner_and_tokenizer, tiny_model_dir, tmp_path
):
    learner, tokenizer = learner_and_tokenizer
    for step in (1, 2):
        checkpoint.save(
            tmp_path,
            learner,
            checkpoint.LoopState(step, {}, {}),
            model_dir=tiny_model_dir,
            keep=1,
            tokenizer=tokenizer,
        )
    root = tmp_path / "checkpoints"
    assert (root / "latest").is_symlink() and checkpoint.latest(tmp_path).name == "step_000002"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002"]  # keep=1
    (root / "latest").unlink()
    (root / "latest").write_text("step_000002\n")  # a run dir written before `latest` was a symlink
    assert checkpoint.latest(tmp_path).name == "step_000002"
    shutil.rmtree(root / "step_000002")
    with pytest.raises(FileNotFoundError, match="incomplete"):
        checkpoint.latest(tmp_path)
