"""A generated Harbor suite of small Python bug fixes that a small model can learn (`agent-rl harbor generate`).

Each task is a one-module repository in /app (the module and a test of its first case) with one planted bug from one of three families — a wrong
constant, an off-by-one, a wrong operator — and hidden pytest tests (tests/, copied in only after the
agent stops) that fail before the fix and pass after. test.sh runs pytest in the container and writes 1 or
0 to /logs/verifier/reward.txt; solution/solve.sh is one sed command that replaces the
buggy return line (a fix short enough for a tiny model to write). Deterministic in the seed: the
same (seed, index) gives the same task, so a suite can be regenerated instead of stored.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from envs.harbor.image import BASE_IMAGE

FAMILIES = ("constant", "off_by_one", "operator")


@dataclass(frozen=True)
class _Fn:
    """A function template: `good` and `bad` bodies, the tests' cases. {k} is a per-task constant."""

    family: str
    name: str
    doc: str
    args: str
    good: str
    bad: str
    cases: tuple[tuple[str, str], ...]  # (call arguments, expected result expression)


def _templates(k: int) -> list[_Fn]:
    return [
        _Fn("constant", "to_fahrenheit", "Degrees Celsius to Fahrenheit.", "c",
            "return c * 9 / 5 + 32", f"return c * 9 / 5 + {32 + k % 3 + 1}",
            (("0", "32"), ("100", "212"), ("-40", "-40"))),
        _Fn("constant", "is_adult", f"True when age is at least {k + 10}.", "age",
            f"return age >= {k + 10}", f"return age >= {k + 11}",
            ((f"{k + 10}", "True"), (f"{k + 9}", "False"), (f"{k + 30}", "True"))),
        _Fn("constant", "with_tax", f"The price with {k}% tax added.", "price",
            f"return price * (100 + {k}) / 100", f"return price * (100 + {k + 1}) / 100",
            (("100", f"{100 + k}"), ("0", "0"), ("200", f"{2 * (100 + k)}"))),
        _Fn("constant", "to_minutes", "Hours to minutes.", "h",
            "return h * 60", f"return h * {60 + k % 4 + 1}",
            (("1", "60"), ("0", "0"), (f"{k}", f"{60 * k}"))),
        _Fn("constant", "with_discount", f"The price with {k}% off.", "price",
            f"return price * (100 - {k}) / 100", f"return price * (100 - {k + 1}) / 100",
            (("100", f"{100 - k}"), ("0", "0"), ("200", f"{2 * (100 - k)}"))),
        _Fn("off_by_one", "range_sum", "Sum of the integers from a to b, both included.", "a, b",
            "return sum(range(a, b + 1))", "return sum(range(a, b))",
            ((f"1, {k}", f"{k * (k + 1) // 2}"), ("3, 3", "3"), ("0, 4", "10"))),
        _Fn("off_by_one", "first_n", "The first n items of xs.", "xs, n",
            "return xs[:n]", "return xs[: n - 1]",
            ((f"list(range({k + 5})), 3", "[0, 1, 2]"), ("[7, 8], 2", "[7, 8]"), ("[1, 2, 3], 1", "[1]"))),
        _Fn("off_by_one", "last_index", "The index of the last item of xs (xs is not empty).", "xs",
            "return len(xs) - 1", "return len(xs)",
            ((f"list(range({k + 1}))", f"{k}"), ("['a']", "0"), ("[5, 6, 7]", "2"))),
        _Fn("off_by_one", "count_up", "The list of the integers from 1 to n, both included.", "n",
            "return list(range(1, n + 1))", "return list(range(1, n))",
            (("3", "[1, 2, 3]"), ("1", "[1]"), (f"{k}", f"list(range(1, {k + 1}))"))),
        _Fn("off_by_one", "drop_last", "All items of xs but the last.", "xs",
            "return xs[:-1]", "return xs[:-2]",
            (("[1, 2, 3]", "[1, 2]"), ("[5]", "[]"), (f"list(range({k}))", f"list(range({k - 1}))"))),
        _Fn("operator", "area", "Area of a w by h rectangle.", "w, h",
            "return w * h", "return w + h",
            ((f"{k}, 3", f"{3 * k}"), ("2, 5", "10"), ("4, 4", "16"))),
        _Fn("operator", "mean", "Arithmetic mean of a non-empty list of numbers.", "xs",
            "return sum(xs) / len(xs)", "return sum(xs) * len(xs)",
            ((f"[{k}, {k + 2}]", f"{k + 1}"), ("[2, 4, 6]", "4"), ("[5]", "5"))),
        _Fn("operator", "difference", "How much larger a is than b.", "a, b",
            "return a - b", "return b - a",
            ((f"{k + 10}, {k}", "10"), ("3, 1", "2"), ("0, 5", "-5"))),
        _Fn("operator", "is_even", "True when n is even.", "n",
            "return n % 2 == 0", "return n % 2 == 1",
            ((f"{2 * k}", "True"), ("3", "False"), ("0", "True"))),
        _Fn("operator", "is_positive", "True when x is greater than zero.", "x",
            "return x > 0", "return x < 0",
            ((f"{k}", "True"), (f"-{k}", "False"), ("0", "False"))),
    ]  # fmt: skip


_MODULES = (
    "calc", "util", "helpers", "tools", "mathy", "core", "numbers", "ops", "funcs", "basics", "common", "misc",
    "shop", "prices", "units", "convert", "lists", "seqs", "stats", "geometry", "shapes", "checks", "rules",
    "logic", "values", "compute", "library", "base", "simple", "extra",
)  # fmt: skip


def _pairs(seed: int, family: str) -> list[tuple[str, str]]:
    """The family's (function, module) pairs in a seed-shuffled order: the j-th task of a family takes pair j, so
    no two tasks of a suite (up to 150 per family) share a function in the same module, and no held-out task's
    instruction is a training task's."""
    names = [t.name for t in _templates(2) if t.family == family]
    pairs = [(n, m) for n in names for m in _MODULES]
    random.Random(f"{seed}:{family}").shuffle(pairs)
    return pairs


def _files(fn: _Fn, module: str, body: str) -> str:
    return f'"""{module}: small helpers."""\n\n\ndef {fn.name}({fn.args}):\n    """{fn.doc}"""\n    {body}\n'


def fix_line(good: str) -> str:
    """The oracle's fix: one sed command putting the right return line in place. It edits /app/*.py: the module
    has the one `return` line, its test has none, so the fix names the function's body and not the file (a tiny
    model trained from scratch learns a function's right body from a few hundred examples, but rarely copies an
    unseen module name from the instruction: with the file named, 1 epoch of SFT fixed 0 of 45 held-out tasks)."""
    return f"sed -i 's|return .*|{good}|' /app/*.py"


@dataclass(frozen=True)
class TaskSpec:
    """Task number `index` of a suite, before it is written: what its instruction and its fix are."""

    name: str
    family: str
    fn: _Fn
    module: str

    @property
    def instruction(self) -> str:
        fn, module = self.fn, self.module
        return (
            f"The function `{fn.name}` in /app/{module}.py is wrong: {fn.doc[0].lower() + fn.doc[1:]}\n"
            f"Fix the bug in /app/{module}.py so that `{fn.name}` does what its docstring says.\n"
        )

    @property
    def fix(self) -> str:
        return fix_line(self.fn.good)


def task_spec(index: int, seed: int = 0) -> TaskSpec:
    rng = random.Random(f"{seed}:{index}")
    k = rng.randint(2, 40)
    family = FAMILIES[index % len(FAMILIES)]
    pairs = _pairs(seed, family)
    function, module = pairs[(index // len(FAMILIES)) % len(pairs)]
    fn = next(t for t in _templates(k) if t.name == function)
    return TaskSpec(f"swe-tiny-{seed}-{index:04d}", family, fn, module)


def write_task(out: Path, index: int, seed: int = 0) -> Path:
    """Write task number `index` of the suite for `seed` under `out`; returns its directory."""
    spec = task_spec(index, seed)
    name, family, fn, module = spec.name, spec.family, spec.fn, spec.module
    d = out / name
    (d / "environment" / "app").mkdir(parents=True, exist_ok=True)
    (d / "tests").mkdir(exist_ok=True)
    (d / "solution").mkdir(exist_ok=True)
    (d / "task.toml").write_text(
        'schema_version = "1.4"\n\n'
        f'[task]\nname = "agent-rl/{name}"\ndescription = "Fix the {family.replace("_", "-")} bug in {fn.name}"\n\n'
        f'[metadata]\nfamily = "{family}"\nfunction = "{fn.name}"\n\n'
        "[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 300.0\n\n"
        '[environment]\nbuild_timeout_sec = 120.0\ncpus = 1\nmemory_mb = 512\nnetwork_mode = "no-network"\n'
    )
    (d / "instruction.md").write_text(spec.instruction)
    (d / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY app/ /app/\n")
    (d / "environment" / "app" / f"{module}.py").write_text(_files(fn, module, fn.bad))
    cases = "\n".join(
        f"    assert {fn.name}({args}) {'is' if want in ('True', 'False') else '=='} {want}"
        for args, want in fn.cases
    )
    first = cases.splitlines()[0]
    (d / "environment" / "app" / f"test_{module}.py").write_text(  # the repository's own test: the first case
        f"from {module} import {fn.name}\n\n\ndef test_{fn.name}():\n{first}\n"
    )
    (d / "tests" / f"test_{module}.py").write_text(
        f'import sys\n\nsys.path.insert(0, "/app")\n\nfrom {module} import {fn.name}  # noqa: E402\n\n\n'
        f"def test_{fn.name}():\n{cases}\n"
    )
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\n# Run the hidden tests against /app; reward 1 when they pass, else 0.\n"
        "mkdir -p /logs/verifier\n"
        "if python3 -m pytest -q -p no:cacheprovider /tests; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{spec.fix}\n")
    return d


def generate(out: Path, n: int, seed: int = 0) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [write_task(out, i, seed) for i in range(n)]
