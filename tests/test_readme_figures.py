"""Every figure a README table attributes to a results file is the figure in that file.

The format (README.md, "Benchmarks"): any markdown table of README.md with a column whose header starts
with "source" is checked. Each backticked item in that column reads `FILE: KEY = VALUE`; FILE (a JSON file
under benchmarks/results/) may be left out after a cell's first item, KEY is a path into the file (names
joined by dots, `[2]` list indices, `["a key"]` for keys with other characters), VALUE is the figure as the
row quotes it (`1,645`, `0.53`, `29%`: a trailing % is the file's fraction x 100). The file must hold VALUE
at KEY to the quoted precision, and the row must quote VALUE outside its source column.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ITEM = re.compile(
    r"^(?:(?P<file>[\w./-]+\.json):\s*)?(?P<key>.+?)\s+=\s+(?P<value>-?[\d,]*\.?\d+)(?P<pct>%)?$"
)
STEP = re.compile(r'\.?([A-Za-z_][\w-]*)|\[(-?\d+)\]|\["([^"]+)"\]')


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(text: str) -> list[tuple[int, list[str], list[tuple[int, list[str]]]]]:
    """(line of the header, header cells, [(line, cells)]) for every markdown table."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if (
            lines[i].startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip())
        ):
            header, rows, j = _cells(lines[i]), [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append((j + 1, _cells(lines[j])))
                j += 1
            out.append((i + 1, header, rows))
            i = j
        else:
            i += 1
    return out


def lookup(data: object, key: str) -> object:
    pos = 0
    for m in STEP.finditer(key):
        if m.start() != pos:
            break
        name, index, quoted = m.groups()
        data = data[int(index)] if index is not None else data[name if name is not None else quoted]  # type: ignore[index]
        pos = m.end()
    if pos != len(key):
        raise KeyError(f"cannot parse the key {key!r} at {key[pos:]!r}")
    return data


@cache
def results(name: str) -> object:
    return json.loads((RESULTS / name).read_text())


def figures(text: str) -> list[tuple[str, str, str, str, str]]:
    """(README line, file, key, value as quoted, the row's other cells) for every sourced figure."""
    out = []
    for _, header, rows in tables(text):
        col = next((i for i, h in enumerate(header) if h.lower().startswith("source")), None)
        if col is None:
            continue
        for line, cells in rows:
            if col >= len(cells):
                continue
            others, file = " ".join(c for i, c in enumerate(cells) if i != col), None
            for item in re.findall(r"`([^`]+)`", cells[col]):
                m = ITEM.match(item.strip())
                assert m, f"README.md:{line}: source item {item!r} is not `FILE: KEY = VALUE`"
                file = m["file"] or file
                assert file, f"README.md:{line}: {item!r} names no results file"
                out.append((f"README.md:{line}", file, m["key"], m["value"] + (m["pct"] or ""), others))
    return out


README_FIGURES = figures((ROOT / "README.md").read_text())


def test_the_readme_quotes_sourced_figures() -> None:
    assert len(README_FIGURES) >= 30, "the README's benchmark table lost its source column"


@pytest.mark.parametrize("where,file,key,quoted,row", README_FIGURES, ids=[f[0] for f in README_FIGURES])
def test_a_quoted_figure_is_the_one_in_its_results_file(where, file, key, quoted, row) -> None:
    assert (RESULTS / file).is_file(), f"{where}: benchmarks/results/{file} does not exist"
    actual = lookup(results(file), key)
    number = quoted.rstrip("%").replace(",", "")
    want = float(number)
    got = float(actual) * (100 if quoted.endswith("%") else 1)  # type: ignore[arg-type]
    decimals = len(number.split(".")[1]) if "." in number else 0
    assert abs(got - want) <= 0.5 * 10**-decimals + 1e-9, (
        f"{where}: {file} {key} is {actual}, the README says {quoted}"
    )
    assert re.search(rf"(?<![\d.,]){re.escape(quoted)}(?![\d])", row), (
        f"{where}: the row does not quote {quoted}"
    )


def test_the_format_catches_a_wrong_figure() -> None:
    text = (
        "| what | result | source |\n|---|---|---|\n"
        '| x | 1.04× | `vcpo_overhead.json: ratio_median_vs_grpo.vcpo_proxy = 1.04`; `["batch"].trajectories = 64` |\n'
    )
    (fig, traj) = figures(text)
    assert fig[1:4] == ("vcpo_overhead.json", "ratio_median_vs_grpo.vcpo_proxy", "1.04") and traj[1] == fig[1]
    with pytest.raises(AssertionError, match="the README says 1.03"):
        test_a_quoted_figure_is_the_one_in_its_results_file(*fig[:3], "1.03", "1.03")
    with pytest.raises(AssertionError, match="the row does not quote 64"):
        test_a_quoted_figure_is_the_one_in_its_results_file(*traj)


def test_make_bench_runs_every_benchmark_the_readme_lists() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Benchmarks") :].split("\n## ", 2)[1]
    listed = set(re.findall(r"^\| `(benchmarks/\w+\.py)`", section, re.M))  # the benchmark table's commands
    makefile = (ROOT / "Makefile").read_text()

    def recipe(name: str) -> str:  # a target's lines, and those of the targets it runs with $(MAKE)
        body = makefile[makefile.index(f"\n{name}:") :].split("\n\n")[0]
        return body + "".join(recipe(t) for t in re.findall(r"\$\(MAKE\) ([\w-]+)", body))

    run = set(re.findall(r"\$\(PY\) (benchmarks/\w+\.py)", recipe("bench")))
    assert len(listed) >= 10 and listed <= run, f"make bench does not run {sorted(listed - run)}"
