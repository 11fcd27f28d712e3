"""Load a YAML file into a frozen pydantic model, with errors that name file:line:field.

Lives at the bottom of the dependency graph (envs <- agent_rl) so that recipes and
environment definitions share one loader and one error format:

    recipes/x.yaml:14: learner.lr: Input should be a valid number
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

Loc = tuple[str | int, ...]


class ConfigError(ValueError):
    """A config file failed to parse or validate; `errors` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


def _line_index(node: yaml.Node, loc: Loc = (), out: dict[Loc, int] | None = None) -> dict[Loc, int]:
    """Map every key path in a composed YAML tree to its 1-based line."""
    out = {} if out is None else out
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = loc + (key_node.value,)
            out[key] = key_node.start_mark.line + 1
            _line_index(value_node, key, out)
            out[key] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, loc + (i,), out)
    return out


def _line_for(loc: Loc, lines: dict[Loc, int]) -> int:
    """Line of the deepest prefix of `loc` present in the file (a missing field points at its parent)."""
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return 1


def _dotted(loc: Loc) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "<root>"


def read_yaml(path: str | Path) -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML file into plain data plus a key-path -> line map."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror}"]) from e
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise ConfigError([f"{path}:{line}: invalid YAML: {getattr(e, 'problem', e)}"]) from e
    lines = _line_index(node) if node is not None else {}
    return data, lines


def validation_messages(
    err: ValidationError, path: str | Path, lines: dict[Loc, int], set_by: dict[Loc, str] | None = None
) -> list[str]:
    """Turn a pydantic error into `file:line: dotted.field: message` lines; a field set (or inside a section
    set) by a command-line override is named as `--set key=value` instead (`set_by`: key path -> item)."""
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see the schema in the docs)"
        across = e["type"] == "value_error" and isinstance(
            e.get("input"), dict
        )  # a section's (model) validator
        if across and (named := _named_field(msg, loc, lines, set_by or {})) is not None:
            # a rule across fields names the fields it is about: point at the one the user set, as they set it
            out.append(f"{where(named, path, lines, set_by or {})}: {msg}")
            continue
        out.append(f"{where(loc, path, lines, set_by or {})}: {_dotted(loc)}: {msg}")
    return out


def where(loc: Loc, path: str | Path, lines: dict[Loc, int], set_by: dict[Loc, str]) -> str:
    """`--set key=value` when an override set `loc` (or a section holding it), else `file:line`."""
    item = next((set_by[loc[:cut]] for cut in range(len(loc), 0, -1) if loc[:cut] in set_by), None)
    return f"--set {item}" if item is not None else f"{path}:{_line_for(loc, lines)}"


_DOTTED_NAME = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)")


def _named_field(msg: str, loc: Loc, lines: dict[Loc, int], set_by: dict[Loc, str]) -> Loc | None:
    """The field a cross-field error is about: of the dotted names its message mentions (under the section `loc`
    it was raised for, or from the root), the first one a `--set` item set, else the first one the file has."""
    named = []
    for m in _DOTTED_NAME.finditer(msg):
        parts = tuple(m.group(1).split("."))
        for full in (loc + parts, parts) if loc else (parts,):
            if full in lines or full in set_by:
                named.append(full)
                break
    return next((n for n in named if n in set_by), named[0] if named else None)


def load_model(path: str | Path, model: type[M], *, context: dict[str, Any] | None = None) -> M:
    """Read `path` and validate it as `model`; raise ConfigError with file:line:field messages."""
    data, lines = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: <root>: expected a mapping of keys, got {type(data).__name__}"])
    try:
        return model.model_validate(data, context={"path": Path(path), **(context or {})})
    except ValidationError as e:
        raise ConfigError(validation_messages(e, path, lines)) from None
