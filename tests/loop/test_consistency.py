"""`agent-rl consistency`: the mismatch split by source on a real tiny model, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl import consistency
from agent_rl.engines.api import Generation


def _recipe_file(tmp_path: Path, model_dir: Path, **model) -> Path:
    extra = "".join(f"  {k}: {v}\n" for k, v in model.items())
    p = tmp_path / "r.yaml"
    p.write_text(
        f"name: c\nmodel:\n  path: {model_dir}\n{extra}envs:\n  train: tiny_arith.yaml\n"
        "train:\n  steps: 1\n  batch_prompts: 1\n"
    )
    return p


def _config(d: Path, **cfg) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    base = {"model_type": "qwen2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4}  # fmt: skip
    (d / "config.json").write_text(json.dumps(base | cfg))
    return d


def test_a_checkpoint_of_another_model_is_a_one_line_error(tmp_path, capsys):
    ours = _config(tmp_path / "ours")
    other = _config(tmp_path / "other" / "hf", vocab_size=49152, hidden_size=576)
    code = consistency.main([str(_recipe_file(tmp_path, ours)), "--checkpoint", str(tmp_path / "other")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--checkpoint {tmp_path / 'other'}: a checkpoint of another model" in err
    assert "vocab_size 49152, the recipe's 512" in err and str(other) not in err.split("(")[0]


def test_a_missing_model_or_a_bad_threshold_is_a_one_line_error(tmp_path, capsys):
    code = consistency.main([str(_recipe_file(tmp_path, tmp_path / "nowhere"))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "agent-rl tiny-model --out" in err
    code = consistency.main(
        [str(_recipe_file(tmp_path, _config(tmp_path / "m"))), "--threshold", "heads=0.1"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "unknown source 'heads'" in err and len(err.splitlines()) == 1


class FakeEngineWithoutLogprobs:
    """A fake engine at the protocol boundary (EngineClient.generate): tokens, no log-probs."""

    async def generate(self, prompt, params, *, request_id):
        return Generation(token_ids=[5, 6, 7], logprobs=[], versions=[0, 0, 0], finish_reason="length")

    async def close(self):
        pass


def test_an_engine_that_returns_no_logprobs_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    tok = build_tiny(tmp_path / "tok", sample_corpus(), vocab_size=512)
    monkeypatch.setattr(consistency, "_engine", lambda recipe, d: (FakeEngineWithoutLogprobs(), "fake"))
    (tok / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    capsys.readouterr()  # what building the tokenizer printed
    code = consistency.main([str(_recipe_file(tmp_path, tok))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "engine fake: request consistency-0: 3 token ids but 0 logprobs" in err
    assert err.endswith("the engine must return the sampled tokens' log-probs")


@pytest.mark.slow
def test_bf16_mismatch_is_split_by_source_and_a_threshold_fails_the_command(tmp_path, capsys):
    """A tiny Qwen2 in bf16 on both sides: the dtype and lm-head rows are nonzero, packing and the engine's
    prefill against decode are within fp32-level noise of 0 on CPU, and a threshold below the total exits 1."""
    from agent_rl.tools.tiny import main as tiny

    model = tmp_path / "m"
    assert tiny(["--out", str(model)]) == 0
    recipe = _recipe_file(tmp_path, model, dtype="bfloat16")
    out = tmp_path / "rows.json"
    argv = [
        str(recipe),
        "--set",
        "learner.dtype=bfloat16",
        "--prompts",
        "2",
        "--tokens",
        "16",
        "--json",
        str(out),
    ]
    assert consistency.main([*argv, "--threshold", "10"]) == 0
    rows = {r["source"]: r for r in json.loads(out.read_text())}
    assert rows["total"]["rms"] > 0 and rows["total"]["tokens"] == 2 * 2 * 16
    assert rows["dtype"]["rms"] > 0 and rows["lm head"]["rms"] > 0
    assert rows["routing"]["note"] == "n/a"  # a dense model
    assert consistency.main([*argv, "--threshold", f"total={rows['total']['rms'] / 2}"]) == 1
    assert "over the threshold: total" in capsys.readouterr().err
