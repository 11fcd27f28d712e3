"""Environment YAML: every shipped file loads; bad input names file:line:field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import envs
from envs.yamlio import ConfigError

ENV_DIR = Path(__file__).resolve().parents[2] / "envs"

SHIPPED = sorted(ENV_DIR.glob("*.yaml"))


def test_every_shipped_env_yaml_loads():
    names = {p.stem for p in SHIPPED}
    assert {"simpletir_dapo", "simpletir_math", "gsm8k_tool", "countdown_tool", "tiny_arith"} <= names
    for p in SHIPPED:
        spec = envs.load(p)
        assert spec.name == p.stem
        if spec.type == "harbor":  # tasks from a Harbor suite, split by heldout_fraction
            assert spec.harbor is not None and spec.harbor.resolved_tasks(spec.source_path).is_dir()
        else:
            assert "test" in spec.data.splits


GOOD = """\
name: t
data:
  splits:
    test: {generator: tiny_arith, size: 4}
turns:
  max_turns: 2
"""


def _load_bad(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        envs.load(path)
    return str(e.value)


def test_minimal_env_yaml_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD)
    assert envs.load(path).turns.max_turns == 2


def test_unknown_key_names_file_line_and_field(tmp_path):
    msg = _load_bad(tmp_path, GOOD.replace("  max_turns: 2", "  max_turns: 2\n  max_turn: 3"))
    assert re.search(r"bad\.yaml:7: turns\.max_turn: unknown key", msg), msg


def test_wrong_type_names_file_line_and_field(tmp_path):
    msg = _load_bad(tmp_path, GOOD.replace("max_turns: 2", "max_turns: lots"))
    assert re.search(r"bad\.yaml:6: turns\.max_turns: .*integer", msg), msg


def test_missing_data_section_is_reported(tmp_path):
    msg = _load_bad(tmp_path, "name: t\n")
    assert re.search(r"bad\.yaml:1: data: Field required", msg), msg


def test_unknown_dataset_name_is_reported_with_line(tmp_path):
    msg = _load_bad(tmp_path, GOOD.replace("{generator: tiny_arith, size: 4}", "{dataset: aime2099}"))
    assert re.search(r"bad\.yaml:4: data\.splits\.test\.dataset: .*aime2024", msg), msg


def test_missing_data_file_is_reported_with_line(tmp_path):
    text = GOOD.replace("{generator: tiny_arith, size: 4}", "{path: nowhere/rows.jsonl}")
    msg = _load_bad(tmp_path, text.replace("data:\n", f"data:\n  root: {tmp_path}\n"))
    assert re.search(r"bad\.yaml:5: data\.splits\.test\.path: .*file not found", msg), msg


def test_stop_string_matching_the_opening_fence_is_rejected(tmp_path):
    msg = _load_bad(tmp_path, GOOD + 'tool:\n  stop: ["```"]\n')
    assert re.search(r"bad\.yaml:8: tool\.stop: .*opening fence", msg), msg


def test_callable_reward_must_import(tmp_path):
    msg = _load_bad(tmp_path, GOOD + "reward:\n  type: callable\n  import_path: 'no.such.module:fn'\n")
    assert re.search(r"bad\.yaml:7: reward: .*cannot import 'no\.such\.module:fn'", msg), msg


def test_template_without_problem_placeholder_is_rejected(tmp_path):
    msg = _load_bad(tmp_path, GOOD + "prompt:\n  template: 'Solve it.'\n")
    assert re.search(r"bad\.yaml:8: prompt\.template: .*\{problem\}", msg), msg


def test_data_root_precedence_yaml_then_env_var_then_shared(tmp_path, monkeypatch):
    from envs.spec import default_data_root

    monkeypatch.delenv("AGENT_RL_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # the project's snapshot, where the checkout has one beside it
    beside = ENV_DIR.parents[1] / "shared" / "data"
    assert default_data_root() == (beside if beside.is_dir() else tmp_path / "cache" / "agent-rl" / "data")
    monkeypatch.setenv("AGENT_RL_DATA", str(tmp_path / "elsewhere"))
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD)
    assert envs.load(path).data_root() == tmp_path / "elsewhere"
    path.write_text(GOOD.replace("data:\n", "data:\n  root: mydata\n"))
    assert envs.load(path).data_root() == tmp_path / "mydata"
