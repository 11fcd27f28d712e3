"""algorithm.teacher in a recipe: the shorthand forms, what is refused, and the tokenizer check before step 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.config import ConfigError, load_recipe
from agent_rl.errors import UserError, user_message
from agent_rl.teacher.engines import check_tokenizer, start_teacher

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "tiny_tir_smoke.yaml"


def test_the_engine_may_be_a_model_directory_or_a_url():
    r = load_recipe(SMOKE, ["algorithm.teacher.engine=runs/teacher", "algorithm.teacher.mode=loss"])
    t = r.algorithm.teacher
    assert (
        t is not None
        and t.engine.model == "runs/teacher"
        and t.engine.type == "embedded"
        and t.mode == "loss"
    )
    r = load_recipe(SMOKE, ["algorithm.teacher.engine=http://10.0.0.5:30000"])
    assert r.algorithm.teacher is not None and r.algorithm.teacher.engine.urls == ("http://10.0.0.5:30000",)
    r = load_recipe(SMOKE, ["algorithm.teacher.engine={type: vllm, urls: [http://h:8000], tokenizer: tok}"])
    assert r.algorithm.teacher is not None and r.algorithm.teacher.engine.type == "vllm"


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["algorithm.teacher.engine={type: sglang}"], "give `model`"),
        (["algorithm.teacher.engine={model: m, urls: [http://h:1]}"], "not both"),
        (
            ["algorithm.teacher.engine=m", "algorithm.teacher.weight=0", "algorithm.teacher.task_weight=0"],
            "both 0",
        ),
        (["algorithm.teacher.engine=m", "algorithm.teacher.mode=forward"], "mode"),
        (
            [
                "algorithm.teacher.engine=m",
                "rollout.temperature=0.7",
                "learner.backend=megatron",
                "algorithm.opob_mode=exact",
            ],
            "temperature",
        ),
    ],
)
def test_a_teacher_that_cannot_work_is_refused_naming_the_setting(sets, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(SMOKE, sets)


@pytest.fixture(scope="module")
def other_tokenizer_model(tmp_path_factory):
    """A tiny model whose tokenizer was trained on another corpus: most ids mean other strings."""
    from agent_rl.tools.tiny import build_tiny

    texts = [f"def f{i}(x): return x * {i} + {i % 7}" for i in range(300)]
    return build_tiny(tmp_path_factory.mktemp("other_tok"), texts, vocab_size=400, seed=1)


def _swapped_tokenizer(src: Path, dst: Path) -> None:
    """The student's tokenizer with two vocabulary entries' ids exchanged: same size, two ids mean other tokens."""
    import shutil

    shutil.copytree(src, dst)
    data = json.loads((dst / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (dst / "tokenizer.json").write_text(json.dumps(data))


def test_a_tokenizer_mismatch_is_refused_in_one_line(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(tiny_model_dir)
    check_tokenizer(student, str(tiny_model_dir))  # the same tokenizer passes
    teacher = tmp_path / "swapped"
    _swapped_tokenizer(Path(tiny_model_dir), teacher)
    with pytest.raises(UserError) as e:
        check_tokenizer(student, str(teacher))
    msg = user_message(e.value)
    assert msg is not None and "\n" not in msg
    assert (
        str(teacher) in msg
        and f"2 of {len(student.get_vocab())} token ids differ" in msg
        and "algorithm.teacher.engine" in msg
    )


async def test_starting_a_teacher_with_another_tokenizer_fails_before_anything_runs(
    tiny_model_dir, other_tokenizer_model
):
    from transformers import AutoTokenizer

    cfg = load_recipe(SMOKE, [f"algorithm.teacher.engine={other_tokenizer_model}"]).algorithm.teacher
    assert cfg is not None
    with pytest.raises(UserError, match="is not the student's"):
        await start_teacher(cfg, AutoTokenizer.from_pretrained(tiny_model_dir), max_seq_len=128, seed=0)
