"""Every learner setting either reaches what the chosen backend builds its ranks from, or is refused when the
recipe loads, naming the field: no backend ignores a setting silently (megatron used to drop
gradient_checkpointing)."""

from __future__ import annotations

import pytest

from agent_rl.config import ConfigError, LearnerConfig, load_recipe

GOOD = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "recipes" / "good.yaml"
# A value other than the backend's own default behaviour, per field (and backend where they differ).
VALUES: dict[str, object] = {
    "lr": 3e-4, "weight_decay": 0.05, "betas": [0.8, 0.9], "grad_clip": 0.5, "lr_schedule": "cosine",
    "warmup_steps": 3, "dtype": "bfloat16", "dp": 2, "tp": 2, "sp": True, "cp": 2,
    "gradient_checkpointing": True, "recompute_method": "block", "recompute_num_layers": 2,
    "recompute_modules": ["mlp"], "micro_batch_size": 2, "micro_batch_tokens": 64,
    "pack_sequences": False,  # both pack by default
    "lora": {"torch": {"rank": 4}, "megatron": {"rank": 4}}, "mismatch_threshold": 0.2, "device": "cpu",
    "logprob_chunk_tokens": 256, "compile": True, "proxy_hold_group": False, "share_prefixes": False,
}  # fmt: skip
# What a field needs to be in effect at all (alone it is refused: e.g. recompute_method without recompute).
NEEDS = {
    "sp": {"tp": 2},
    "recompute_method": {"gradient_checkpointing": "full"},
    "recompute_num_layers": {"gradient_checkpointing": "full"},
    "recompute_modules": {"gradient_checkpointing": "selective"},
    "proxy_hold_group": {"gradient_checkpointing": True},
}


def built_from(backend: str, sets: dict[str, object]) -> object:
    """What the backend's ranks are built from (no weights are loaded)."""
    args = [f"learner.backend={backend}", "train.batch_prompts=4"] + [
        f"learner.{k}={v}" for k, v in sets.items()
    ]
    recipe = load_recipe(GOOD, args)
    lc = recipe.learner_spec.learner
    facade = lc.mismatch_threshold, lc.device  # the facade's (a metric) and the pool's (where ranks compute)
    if backend == "torch":
        from agent_rl.learners.torch_learner import rank_spec

        return rank_spec(recipe.learner_spec), recipe.learner.dp, facade
    from agent_rl.learners.megatron import megatron_spec

    return megatron_spec(recipe.learner_spec), facade


def test_every_field_has_a_value_here():
    assert set(VALUES) == set(LearnerConfig.model_fields) - {"backend"}, "add the new learner field to VALUES"


@pytest.mark.parametrize("backend", ["torch", "megatron"])
@pytest.mark.parametrize("field", sorted(VALUES))
def test_a_learner_field_reaches_the_backend_or_is_refused(backend, field):
    value = VALUES[field][backend] if isinstance(VALUES[field], dict) else VALUES[field]
    cases = [{}] + ([NEEDS[field]] if field in NEEDS else [])  # alone, and with what it needs
    for rest in cases:
        try:
            changed = built_from(backend, {**rest, field: value})
        except ConfigError as e:
            assert field.split("_")[0] in str(e), str(e)  # refused, naming the setting
            continue
        assert changed != built_from(backend, rest), (
            f"learner.{field}={value!r} (with {rest}) is accepted but changes nothing the {backend} learner "
            "builds its ranks from"
        )
