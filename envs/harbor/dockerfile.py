"""The part of a task's Dockerfile that can be built offline, on agent-rl's base image.

There is no registry here (nor, usually, on a training cluster's sandbox hosts): a task's `FROM ubuntu:24.04`
cannot be pulled. Its image is built instead on the base that `agent-rl harbor base-image` makes from the
machine's own Python (Python, pytest, bash and coreutils; sandboxes/image.py): `FROM` is mapped to that base
with a one-line warning, and an instruction that needs what the base lacks (a package manager, a download)
is refused at validation with the file and line. What is built: WORKDIR, ENV, COPY/ADD of files from the
build context, RUN of shell commands the base can run. CMD, ENTRYPOINT, LABEL, EXPOSE, ARG, SHELL,
HEALTHCHECK, STOPSIGNAL and VOLUME do not change what an episode sees and are ignored.

Hand-written because the alternatives need what is not here: BuildKit's frontend parser is Go, and
`docker build` itself would try to pull the FROM image.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from envs.harbor.task import HarborTaskError

_IGNORED = {
    "CMD",
    "ENTRYPOINT",
    "LABEL",
    "EXPOSE",
    "ARG",
    "SHELL",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "VOLUME",
    "MAINTAINER",
    "ONBUILD",
}
# Commands that need a package registry or the network, which offline builds do not have.
_NEEDS_NETWORK = re.compile(
    r"(?:^|[;&|\s(])(apt-get|apt|apk|yum|dnf|microdnf|zypper|curl|wget|git\s+clone|uv|conda|npm|"
    r"pip3?\s+install|python3?\s+-m\s+pip\s+install)(?=\s|$)"
)


@dataclass(frozen=True)
class Step:
    line: int
    kind: str  # RUN, COPY, WORKDIR, ENV, USER
    args: tuple[str, ...]


@dataclass
class Recipe:
    """The buildable instructions of one Dockerfile, in order, and what was mapped or dropped."""

    base: str
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> str:
        wd = "/"
        for s in self.steps:
            if s.kind == "WORKDIR":
                wd = s.args[0] if s.args[0].startswith("/") else f"{wd.rstrip('/')}/{s.args[0]}"
        return wd

    @property
    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.steps:
            if s.kind == "ENV":
                out[s.args[0]] = s.args[1]
        return out


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with backslash continuations joined and comments dropped."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _exec_form(arg: str) -> list[str] | None:
    if arg.startswith("["):
        try:
            value = json.loads(arg)
        except json.JSONDecodeError:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return None


def parse(path: Path, base: str, *, pip_available: frozenset[str] = frozenset()) -> Recipe:
    """Read `path`; HarborTaskError (file:line) for what cannot be built offline on `base`.

    `pip_available`: packages the base already has; a `pip install` of only those is skipped with a warning.
    """
    text = path.read_text()
    recipe = Recipe(base=base)
    seen_from = False
    for line, instr in _logical_lines(text):
        word, _, rest = instr.strip().partition(" ")
        kind, rest = word.upper(), rest.strip()
        where = f"{path}:{line}"
        if kind == "FROM":
            if seen_from:
                raise HarborTaskError(
                    f"{where}: FROM: multi-stage builds are not supported offline; use one stage"
                )
            seen_from = True
            image = rest.split()[0] if rest else ""
            if image != base:
                recipe.warnings.append(
                    f"{where}: FROM {image} is built on agent-rl's offline base image {base} "
                    "(Python, pytest, bash, coreutils; no package manager)"
                )
            continue
        if not seen_from:
            raise HarborTaskError(f"{where}: {kind} before FROM; a Dockerfile starts with FROM")
        if kind in _IGNORED:
            continue
        if kind == "RUN":
            form = _exec_form(rest)
            command = shlex.join(form) if form is not None else rest
            m = _NEEDS_NETWORK.search(command)
            if m:
                tool = m.group(1)
                if "pip" in tool and pip_available:
                    wanted = [a for a in command[m.end() :].split() if not a.startswith("-")]
                    names = {re.split(r"[<>=!~\[]", w)[0].lower().replace("_", "-") for w in wanted}
                    if names and names <= pip_available:
                        recipe.warnings.append(
                            f"{where}: RUN pip install {' '.join(sorted(names))}: already in the base image, skipped"
                        )
                        continue
                raise HarborTaskError(
                    f"{where}: RUN {tool}: needs a package registry or the network, which offline builds lack; "
                    "put what the task needs into the base image (agent-rl harbor base-image --package NAME) "
                    "or into the build context with COPY"
                )
            recipe.steps.append(Step(line, "RUN", (command,)))
        elif kind in ("COPY", "ADD"):
            form = _exec_form(rest)
            parts = form if form is not None else shlex.split(rest)
            parts = [p for p in parts if not p.startswith("--")]
            if len(parts) < 2:
                raise HarborTaskError(f"{where}: {kind}: needs a source and a destination")
            for src in parts[:-1]:
                if re.match(r"^[a-z]+://", src):
                    raise HarborTaskError(
                        f"{where}: {kind} {src}: a download; offline builds copy local files only"
                    )
                if not (path.parent / src).exists() and not any(path.parent.glob(src)):
                    raise HarborTaskError(f"{where}: {kind} {src}: not in the build context {path.parent}")
            recipe.steps.append(Step(line, "COPY", tuple(parts)))
        elif kind == "WORKDIR":
            if not rest:
                raise HarborTaskError(f"{where}: WORKDIR: needs a path")
            recipe.steps.append(Step(line, "WORKDIR", (rest,)))
        elif kind == "ENV":
            pairs = _env_pairs(rest, where)
            recipe.steps.extend(Step(line, "ENV", kv) for kv in pairs)
        elif kind == "USER":
            recipe.steps.append(Step(line, "USER", (rest,)))
        else:
            raise HarborTaskError(f"{where}: {kind}: not a Dockerfile instruction agent-rl can build")
    if not seen_from:
        raise HarborTaskError(f"{path}: no FROM line")
    return recipe


def _env_pairs(rest: str, where: str) -> list[tuple[str, str]]:
    parts = shlex.split(rest)
    if parts and "=" not in parts[0]:  # legacy `ENV KEY value with spaces`
        key, _, value = rest.partition(" ")
        return [(key, value.strip())]
    pairs = []
    for p in parts:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise HarborTaskError(f"{where}: ENV {p}: expected KEY=value")
        pairs.append((key, value))
    return pairs
