"""Every command the README and the docs show exists: make targets, `agent-rl` subcommands and their flags,
`python -m` modules, and the repository paths they name (recipes, envs, scripts, benchmarks, examples, tests).

Commands are read from code blocks and code spans only. Placeholders (`RECIPE`, `DIR`, `NAME.md`, ...) are
skipped; `{a,b}` expands, `*` must match at least one file, `a|b|c` (alternative subcommands) checks each.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *(p for p in sorted(DOCS.rglob("*.md")) if "_incoming" not in p.parts)]
PATH = re.compile(
    r"(?<![\w/.-])((?:recipes|envs|scripts|benchmarks|examples|tests|agent_rl|vcpo|sandboxes)/[\w./*{},-]*[\w*}])"
)
AGENT_RL = re.compile(r"(?:^|(?<=[\s/'\"(]))agent-rl((?:[ \t]+[^\s`]+)+)")
MAKE = re.compile(r"(?:^|(?<=[\s(]))make[ \t]+([a-z][\w-]*)")
PYTHON_M = re.compile(r"python(?:3)? -m ([\w.]+)")
PLACEHOLDER = re.compile(r"[A-Z]{2,}")


def code_of(text: str) -> list[str]:
    """The code blocks and code spans of a Markdown page, one string each."""
    blocks = re.findall(r"^(?:```|~~~)[^\n]*\n(.*?)^(?:```|~~~)", text, re.S | re.M)
    rest = re.sub(r"^(?:```|~~~)[^\n]*\n.*?^(?:```|~~~)", "", text, flags=re.S | re.M)
    return blocks + re.findall(r"`([^`\n]+)`", rest)


@cache
def all_code() -> list[tuple[str, str]]:
    return [
        (p.name if ROOT not in p.parents else str(p.relative_to(ROOT)), c)
        for p in PAGES
        for c in code_of(p.read_text())
    ]


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m[1].split(",") for x in _expand(path[: m.start()] + alt + path[m.end() :])]


def missing_paths() -> list[str]:
    out = []
    for page, code in all_code():
        for raw in PATH.findall(code):
            if PLACEHOLDER.search(raw) or "_incoming" in raw:
                continue
            for path in _expand(raw.rstrip(".,")):
                found = (
                    list(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
                )
                if not found:
                    out.append(f"{page}: {path}")
    return sorted(set(out))


def test_every_path_the_docs_name_exists() -> None:
    assert missing_paths() == []


@cache
def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_every_make_target_the_docs_name_exists() -> None:
    used = {(page, t) for page, code in all_code() for t in MAKE.findall(code)}
    assert used, "the docs name no make target: is the pattern broken?"
    assert sorted(f"{page}: make {t}" for page, t in used if t not in make_targets()) == []


def test_every_python_module_the_docs_run_exists() -> None:
    missing = []
    for page, code in all_code():
        for module in PYTHON_M.findall(code):
            if module.split(".")[0] in ("pip", "sglang", "vllm", "venv", "pytest"):
                continue
            if importlib.util.find_spec(module) is None:
                missing.append(f"{page}: python -m {module}")
    assert missing == []


@cache
def cli_commands() -> dict:
    from scripts.docs.cli_reference import commands, flags

    return {name: flags(parser) for name, parser in commands().items()}


def check_agent_rl(words: list[str]) -> list[str]:
    """What is wrong with one `agent-rl ...` command line (empty when its subcommand and flags exist)."""
    cmds = cli_commands()
    words = [w.strip("[](),;'\"") for w in words]
    words = [w for w in words if w]
    if not words or words[0].startswith("-") or PLACEHOLDER.fullmatch(words[0]):
        return []
    problems, bases = [], [w for w in words[0].split("|") if w]
    for base in bases:
        if base not in cmds:
            problems.append(f"no subcommand {base!r}")
            continue
        nested = [
            f"{base} {w}" for w in (words[1].split("|") if len(words) > 1 else []) if f"{base} {w}" in cmds
        ]
        parsers = nested or [base] + [c for c in cmds if c.startswith(base + " ")]
        accepted = set().union(*(cmds[p] for p in parsers))
        for w in words[1:]:
            flag = w.split("=")[0]
            if re.fullmatch(r"--?[a-z][\w-]*", flag) and flag not in accepted:
                problems.append(f"agent-rl {base}: no flag {flag}")
    return problems


def test_every_agent_rl_command_in_the_docs_exists() -> None:
    wrong, seen = [], 0
    for page, code in all_code():
        for line in code.splitlines():
            for m in AGENT_RL.finditer(line):
                words = m[1].split("#")[0].split()
                words = list(itertools.takewhile(lambda w: w not in ("&&", "|", ";", "->"), words))
                seen += 1
                wrong += [f"{page}: agent-rl{m[1].split('#')[0]}: {p}" for p in check_agent_rl(words)]
    assert seen >= 30, "too few agent-rl commands found: is the pattern broken?"
    assert wrong == []


@pytest.mark.parametrize(
    "line,problem",
    [
        ("train RECIPE --resmue RUN_DIR", "agent-rl train: no flag --resmue"),
        ("trian recipes/tiny_tir.yaml", "no subcommand 'trian'"),
        ("sandbox serve --mcp --port 8080", None),
        ("engines add|remove|list RUN_DIR", None),
        ("sandbox build-image --mcp", "agent-rl sandbox: no flag --mcp"),
    ],
)
def test_the_command_check_catches_a_wrong_subcommand_or_flag(line: str, problem: str | None) -> None:
    got = check_agent_rl(line.split())
    assert got == ([problem] if problem else [])


def test_the_path_check_catches_a_missing_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("Run `agent-rl train recipes/no_such_recipe.yaml` or `recipes/{tiny_tir,nope}.yaml`.\n")
    all_code.cache_clear()
    monkeypatch.setitem(globals(), "PAGES", [page])
    try:
        got = missing_paths()
    finally:
        all_code.cache_clear()
    assert [g.split(": ", 1)[1] for g in got] == ["recipes/no_such_recipe.yaml", "recipes/nope.yaml"]
