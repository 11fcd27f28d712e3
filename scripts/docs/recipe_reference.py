"""The recipe reference page, written from the pydantic models of agent_rl/config.py.

Every field of `Recipe` and of each section under it gets a row: its dotted key, type, default and
description. Descriptions are the field docstrings (`use_attribute_docstrings` on config.Strict) or
`Field(description=...)`. A field without one stops the generator (`missing_descriptions`, also a test), so a field
added later cannot reach the page undocumented. scripts/docs/generate.py writes the page.
"""

from __future__ import annotations

import ast
import enum
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

NONE_TYPE = type(None)


@dataclass(frozen=True)
class Row:
    key: str  # dotted, e.g. learner.lora.rank; a dict of sections reads placement.nodes.<name>.cpus
    type: str
    default: str
    description: str | None
    section: str  # the dotted key of the model the field belongs to ('' for the recipe itself)


def _models_in(tp: object) -> list[tuple[str, type[BaseModel]]]:
    """The pydantic models a field holds directly ('' suffix) or as dict values ('.<name>' suffix)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [("", tp)]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in _models_in(a)]
    if origin is dict and len(args) == 2:
        return [(".<name>" + suffix, m) for suffix, m in _models_in(args[1])]
    return []


def type_name(tp: object) -> str:
    """A reader's spelling of an annotation: `int | null`, `"torch" | "megatron"`, `list[int]`, ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is NONE_TYPE:
        return "null"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else str(a).lower() for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list[{type_name(args[0])}]"
        return f"[{', '.join(type_name(a) for a in args)}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    if isinstance(tp, type):
        return {"str": "str", "int": "int", "float": "float", "bool": "bool"}.get(tp.__name__, tp.__name__)
    return str(tp)


def _value(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, BaseModel):
        return "(section)"
    return str(v)


def default_of(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _value(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    return _value(field.default)


@cache
def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of a model's own class body (for models that do not turn on pydantic's
    `use_attribute_docstrings`, e.g. envs/spec.py's)."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
        except (OSError, TypeError):
            continue
        for stmt, nxt in zip(body, body[1:], strict=False):
            doc = nxt.value if isinstance(nxt, ast.Expr) else None
            named = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            if named and isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                out[stmt.target.id] = inspect.cleandoc(doc.value)  # type: ignore[union-attr]
    return out


def rows(model: type[BaseModel] | None = None, prefix: str = "") -> Iterator[Row]:
    """Every field, depth first: a section's own row, then the fields inside it."""
    if model is None:
        from agent_rl.config import Recipe

        model = Recipe
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        yield Row(
            key,
            type_name(field.annotation),
            default_of(field),
            field.description or attribute_docstrings(model).get(name),
            prefix.rstrip("."),
        )
        for suffix, sub in _models_in(field.annotation):
            yield from rows(sub, f"{key}{suffix}.")


def missing_descriptions(model: type[BaseModel] | None = None) -> list[str]:
    """Dotted keys of the fields that have no description (config.py: add a docstring under each)."""
    return [r.key for r in rows(model) if not (r.description or "").strip()]


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped, `<` and `>` outside code spans as entities (`runs/<name>`)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def markdown(model: type[BaseModel] | None = None) -> str:
    """The recipe reference page (`model`: the schema's root, the Recipe by default)."""
    missing = missing_descriptions(model)
    if missing:
        raise SystemExit(
            f"agent_rl/config.py: {len(missing)} recipe field(s) without a description: {', '.join(missing)}; "
            "write a docstring under each field (the recipe reference is generated from them)"
        )
    lines = [
        "# Recipe schema",
        "",
        "Generated from the pydantic models in `agent_rl/config.py` by `python -m scripts.docs.generate` (a test",
        "fails when this page is stale): every field, its type, its default and its description. Unknown keys are errors,",
        "values are validated once when the recipe loads and frozen after. `agent-rl validate RECIPE` checks a",
        "file; `--set dotted.key=value` on `agent-rl train` and `agent-rl eval` overrides one field. The",
        "environment files a recipe names (`envs.train`, `envs.eval`) have a schema of their own:",
        "[Environment schema](env.md).",
        "",
    ]
    sections: dict[str, list[Row]] = {}
    for r in rows(model):
        sections.setdefault(r.section, []).append(r)
    for section, members in sections.items():
        lines += [f"## `{section}`" if section else "## The recipe's top level", ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        for r in members:
            lines.append(f"| `{r.key}` | {r.type} | {_cell(r.default)} | {_cell(r.description or '')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def env_markdown() -> str:
    """The environment YAML schema (envs/spec.py), the same way; fields without a docstring show none."""
    from envs.spec import EnvSpec

    lines = [
        "# Environment schema",
        "",
        "Generated from the pydantic models in `envs/spec.py` by `python -m scripts.docs.generate`. An environment",
        "file declares its data, prompt, protocol, budgets, sandbox and reward; [Environments](../guides/environments.md)",
        "explains them. `agent-rl validate ENV.yaml` checks a file.",
        "",
    ]
    sections: dict[str, list[Row]] = {}
    for r in rows(EnvSpec):
        sections.setdefault(r.section, []).append(r)
    for section, members in sections.items():
        lines += [f"## `{section}`" if section else "## The environment's top level", ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        lines += [
            f"| `{r.key}` | {r.type} | {_cell(r.default)} | {_cell(r.description or '')} |" for r in members
        ]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
