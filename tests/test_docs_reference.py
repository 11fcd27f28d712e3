"""The reference pages are the code's: every recipe field with a description, every CLI subcommand and flag."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from scripts.docs import cli_reference, recipe_reference

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a model, walked here on its own (not by the generator): sections, then their fields."""
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        ann = field.annotation
        union = typing.get_origin(ann) in (typing.Union, types.UnionType)
        for a in typing.get_args(ann) if union else (ann,):
            suffix = ""
            if typing.get_origin(a) is dict:
                a, suffix = typing.get_args(a)[1], ".<name>"
            if isinstance(a, type) and issubclass(a, BaseModel):
                out += _keys(a, f"{prefix}{name}{suffix}.")
    return out


def test_every_recipe_field_has_a_description() -> None:
    missing = recipe_reference.missing_descriptions()
    assert missing == [], f"agent_rl/config.py: write a docstring under each of {missing}"


def test_the_recipe_reference_lists_every_field_of_the_schema() -> None:
    from agent_rl.config import Recipe

    page = (REFERENCE / "recipe.md").read_text()
    keys = _keys(Recipe)
    assert len(keys) > 80
    absent = [k for k in keys if f"| `{k}` |" not in page]
    assert absent == [], "docs/reference/recipe.md lacks these fields: run python -m scripts.docs.generate"


def test_a_field_without_a_description_stops_the_reference() -> None:
    class Section(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        documented: int = 1
        """Has one."""
        bare: int = 2

    class Root(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        section: Section = Section()
        """A section."""

    rows = {r.key: r for r in recipe_reference.rows(Root)}
    assert rows["section.documented"].description == "Has one." and rows["section.bare"].description is None
    assert (rows["section.bare"].type, rows["section.bare"].default) == ("int", "2")
    with pytest.raises(SystemExit, match=r"1 recipe field\(s\) without a description: section.bare"):
        recipe_reference.markdown(Root)


def test_the_reference_spells_types_and_defaults_as_yaml() -> None:
    rows = {r.key: r for r in recipe_reference.rows()}
    assert rows["learner.backend"].type == '"torch" \\| "megatron"'
    assert rows["learner.betas"].default == "[0.9, 0.999]"
    assert rows["rollout.fixed_lag"].type == "int \\| null" and rows["rollout.fixed_lag"].default == "null"
    assert rows["train.steps"].default == "required"
    assert "placement.nodes.<name>.cpus" in rows


@pytest.fixture(scope="module")
def commands() -> dict:
    return cli_reference.commands()


def test_the_cli_reference_lists_every_subcommand_and_flag(commands: dict) -> None:
    page = (REFERENCE / "cli.md").read_text()
    assert len(commands) >= 15
    for name, parser in commands.items():
        assert f"## `agent-rl {name}`" in page, f"docs/reference/cli.md lacks agent-rl {name}"
        for flag in cli_reference.flags(parser) - {"-h", "--help", "--debug"}:
            assert f"`{flag}`" in page, f"docs/reference/cli.md lacks agent-rl {name} {flag}"


def test_the_cli_reference_reads_the_delegated_parsers_without_running_them(commands: dict) -> None:
    # train, serve and sandbox build their parsers inside main(); the reference must see their flags
    assert {"--resume", "--set", "--dry-run"} <= cli_reference.flags(commands["train"])
    assert "--tool-parser" in cli_reference.flags(commands["serve"])
    assert "--mcp" in cli_reference.flags(commands["sandbox serve"])
    assert "--drain-s" in cli_reference.flags(commands["engines remove"])
