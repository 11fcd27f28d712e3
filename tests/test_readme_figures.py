"""Every measured figure the README and the docs show is the figure in its results file.

Figures reach the README and the site three ways, each checked here:
- generated blocks (`<!-- BEGIN generated: NAME -->`, scripts/docs/generate.py from benchmarks/results/*.json):
  the committed text must equal what the results files give now;
- results files included whole into a page (`[results: benchmarks/results/NAME.md](...)`, by the site's hook);
- a table with a column whose header starts with "source" (none today; the format stays for a figure that must be
  quoted by hand): each backticked item in that column reads `FILE: KEY = VALUE` and the file must hold VALUE at KEY.
Anywhere else on the front page and on the benchmark and study pages, a measured figure typed by hand fails
`test_no_figure_is_typed_by_hand`. The staleness verdict's words are recomputed from the study's per-seed runs.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
GENERATED_BLOCK = re.compile(r"<!-- BEGIN generated: (\w+) -->\n(.*?)<!-- END generated: \1 -->", re.S)
ITEM = re.compile(
    r"^(?:(?P<file>[\w./-]+\.json):\s*)?(?P<key>.+?)\s+=\s+(?P<value>-?[\d,]*\.?\d+)(?P<pct>%)?$"
)
STEP = re.compile(r'\.?([A-Za-z_][\w-]*)|\[(-?\d+)\]|\["([^"]+)"\]')


def hand_written_pages() -> list[Path]:
    """README.md and the docs pages people write (not the generated references, not docs/_incoming/)."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if "_incoming" not in p.parts and p.parent.name != "reference"]


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


def figures(text: str, name: str = "README.md") -> list[tuple[str, str, str, str, str]]:
    """(page:line, file, key, value as quoted, the row's other cells) for every sourced figure of a page."""
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
                assert m, f"{name}:{line}: source item {item!r} is not `FILE: KEY = VALUE`"
                file = m["file"] or file
                assert file, f"{name}:{line}: {item!r} names no results file"
                out.append((f"{name}:{line}", file, m["key"], m["value"] + (m["pct"] or ""), others))
    return out


SOURCED = [f for p in hand_written_pages() for f in figures(p.read_text(), str(p.relative_to(ROOT)))]


@pytest.mark.parametrize("where,file,key,quoted,row", SOURCED, ids=[f[0] for f in SOURCED])
def test_a_quoted_figure_is_the_one_in_its_results_file(where, file, key, quoted, row) -> None:
    assert (RESULTS / file).is_file(), f"{where}: benchmarks/results/{file} does not exist"
    actual = lookup(results(file), key)
    number = quoted.rstrip("%").replace(",", "")
    want = float(number)
    got = float(actual) * (100 if quoted.endswith("%") else 1)  # type: ignore[arg-type]
    decimals = len(number.split(".")[1]) if "." in number else 0
    assert abs(got - want) <= 0.5 * 10**-decimals + 1e-9, (
        f"{where}: {file} {key} is {actual}, the page says {quoted}"
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
    with pytest.raises(AssertionError, match="the page says 1.10"):  # the file has 1.035
        test_a_quoted_figure_is_the_one_in_its_results_file(*fig[:3], "1.10", "1.10")
    with pytest.raises(AssertionError, match="the row does not quote 64"):
        test_a_quoted_figure_is_the_one_in_its_results_file(*traj)


def test_generated_docs_equal_what_the_results_files_give_now() -> None:
    from scripts.docs import generate

    assert generate.stale() == [], "run .venv/bin/python -m scripts.docs.generate"


def _measured_section() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## What it has been measured to do")
    return text[start : text.index("\n## ", start + 1)].rstrip().splitlines()


def _headline_rows() -> list[list[str]]:
    block = dict(GENERATED_BLOCK.findall((ROOT / "README.md").read_text()))["headline"]
    ((_, header, rows),) = tables(block)
    assert header == ["job", "figure", "compared with", "machine and load", "page"]
    return [cells for _, cells in rows]


def test_the_front_page_measured_block_is_one_short_table_linking_each_row_to_its_page() -> None:
    section = _measured_section()
    assert len(section) <= 15, f"README.md: the measured block is {len(section)} lines (at most 15)"
    assert sum(line.startswith("|---") for line in section) == 1, "one table"
    rows = _headline_rows()
    assert len(rows) >= 5
    for cells in rows:
        assert all(cells), f"README.md: an empty cell in the headline row {cells[0]!r}"
        assert re.fullmatch(r"\[more\]\(docs/[\w/.#-]+\)", cells[4]), cells[4]
        assert (ROOT / cells[4][len("[more](") : -1].split("#")[0]).is_file(), cells[4]


def test_a_figure_from_a_loaded_machine_says_so_in_its_row() -> None:
    """The main job's row carries the load its results file recorded, and says when it exceeded the cores."""
    job = results("main_job.json")
    row = next(c for c in _headline_rows() if "make run" in c[0])
    start = float(job["load_average_at_start"].split()[0])
    cores = int(job["machine"].split(", ")[1].split()[0])
    assert f"load {start:.1f}" in row[3] and f"{job['minutes_total']:.1f} min" in row[1]
    assert ("not an idle-machine time" in row[3]) == (start > cores)


def test_the_async_row_is_the_median_of_the_per_seed_ratios_from_the_runs() -> None:
    """Recomputed from the runs' curves: per seed, sync's time to its own final accuracy over async k=2's; the
    row states the median of those ratios (not the ratio of the median times)."""
    data = results("async_vs_sync.json")
    base = data["summary"]["sync_baseline"]
    target = {r["seed"]: r["final_accuracy"] for r in data["cells"] if r["name"] == base}

    def when(r: dict) -> float:
        return next(t for t, a in r["curve"] if a >= target[r["seed"]] - 1e-9)

    sync = {r["seed"]: when(r) for r in data["cells"] if r["name"] == base}
    fast = {r["seed"]: when(r) for r in data["cells"] if r["name"] == "async k=2"}
    ratios = [sync[s] / fast[s] for s in sorted(sync)]
    row = next(c for c in _headline_rows() if c[0].startswith("async vs sync"))
    assert f"**{statistics.median(ratios):.2f}× sooner**" in row[1]
    ratio_of_medians = statistics.median(sync.values()) / statistics.median(fast.values())
    if f"{ratio_of_medians:.2f}" != f"{statistics.median(ratios):.2f}":
        assert f"{ratio_of_medians:.2f}×" not in row[1]


def test_the_gpu_row_names_the_opob_modes_and_the_anchor_cells_it_compares_with() -> None:
    row = next(c for c in _headline_rows() if "GPU" in c[0])
    assert "proxy OPOB + recompute" in row[1] and "exact OPOB (the default)" in row[1]
    assert "not the anchor at its best" in row[2] and "micro-batches" in row[2]


# A measured figure typed by hand: a number with two or more decimals (0.75, 1.56) or a ratio (1.3×). Versions
# and design values go in code spans; a sentence that states a goal or a target may name one.
TYPED = re.compile(r"(?<![\w.-])(\d+\.\d+\s?×|\d+\.\d{2,})(?!\w|\.\d)")


def typed_figures(text: str) -> list[str]:
    text = GENERATED_BLOCK.sub("", text)
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)|<https?://[^>]*>", "]", text)
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n\n|\n\|", text):
        if re.search(r"\b(goal|target)s?\b", sentence, re.I):
            continue
        out += [m[0] for m in TYPED.finditer(sentence)]
    return out


LINTED = [
    ROOT / "README.md",
    *sorted((DOCS / "benchmarks").glob("*.md")),
    *sorted((DOCS / "studies").glob("*.md")),
]


@pytest.mark.parametrize("page", LINTED, ids=[str(p.relative_to(ROOT)) for p in LINTED])
def test_no_figure_is_typed_by_hand(page: Path) -> None:
    found = typed_figures(page.read_text())
    assert not found, (
        f"{page.relative_to(ROOT)}: figures typed by hand: {found}; include the results file, or write them "
        "from it with a generated block (scripts/docs/figures.py)"
    )


def test_the_lint_sees_a_typed_figure_and_spares_code_and_goals() -> None:
    assert typed_figures("async k=2 reaches it 1.56× sooner, accuracy 0.75.") == ["1.56×", "0.75"]
    assert typed_figures("run `trl==1.16`; the goal was 1.6× on whole-process time.") == []
    assert typed_figures("<!-- BEGIN generated: x -->\n0.75\n<!-- END generated: x -->\n") == []


def _claims(text: str) -> dict[tuple[int, str, str], str]:
    """(k, who: VCPO or one of its parts alone, the lr it ran at) -> the verdict word the README's staleness
    lines give."""
    out = {}
    for k, body in re.findall(r"^- k=(\d+): (.*)$", text, re.M):
        for who, lr, word in re.findall(
            r"(VCPO|ESS lr alone|OPOB alone) at (\S+)(?: \(the baseline's lr\))? vs .+? at \S+: \*\*([a-z ]+)\*\*",
            body,
        ):
            out[int(k), who, lr] = word
    return out


def _lr_text(lr: float) -> str:
    return f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


def expected_words() -> dict[tuple[int, str, str], str]:
    """The verdicts recomputed from level_b_fair.json's per-seed finals, without its summary: SE of a mean =
    std / sqrt(n); of a difference of two independent cells, sqrt(se_a² + se_b²); ahead/behind at |d| >= 2 SE."""
    report = results("stress/level_b_fair.json")
    d = report["design"]
    seeds, same = d["heldout_seeds"], d["same_as_at_k0"]

    def cell(method: str, lr: float, k: int) -> list[float]:
        m = same.get(method, method) if k == 0 else method
        return [c["final_accuracy"] for c in report["cells"]
                if (c["method"], c["lr"], c["k"]) == (m, lr, k) and c["seed"] in seeds]  # fmt: skip

    def word(a: list[float], b: list[float]) -> str:
        if len(a) < 2 or len(b) < 2:
            return "missing"
        diff = statistics.mean(a) - statistics.mean(b)
        se = math.hypot(statistics.stdev(a) / math.sqrt(len(a)), statistics.stdev(b) / math.sqrt(len(b)))
        return "not separated" if se == 0 or abs(diff) / se < 2 else ("ahead" if diff > 0 else "behind")

    chosen = {m: v["chosen_lr"] for m, v in report["selection"].items() if v["chosen_lr"] is not None}
    out = {}
    for k in d["lags"]:
        scored = {m: cell(m, lr, k) for m, lr in chosen.items()}
        best = max((m for m in scored if scored[m]), key=lambda m: statistics.mean(scored[m]))
        for lr in {d["recipe_lr"], chosen[best]}:
            out[k, "VCPO", _lr_text(lr)] = word(cell("vcpo", lr, k), scored[best])
        # each of VCPO's parts alone at the recipe's lr
        for part, who in (("ess_lr", "ESS lr alone"), ("opob", "OPOB alone")):
            out[k, who, _lr_text(d["recipe_lr"])] = word(cell(part, d["recipe_lr"], k), scored[best])
    return out


STUDY = DOCS / "studies" / "staleness.md"


def test_the_staleness_verdict_words_are_what_the_per_seed_runs_say() -> None:
    claims = _claims(dict(GENERATED_BLOCK.findall(STUDY.read_text()))["staleness_verdict"])
    assert claims == expected_words()
    outside = GENERATED_BLOCK.sub("", (ROOT / "README.md").read_text())
    assert not re.search(r"\b(ahead|behind)\b", outside), (
        "README.md: a verdict ('ahead'/'behind') outside the generated block: state it from the file"
    )


def test_the_verdict_check_catches_a_word_changed_by_hand() -> None:
    block = dict(GENERATED_BLOCK.findall(STUDY.read_text()))["staleness_verdict"]
    edited = block.replace("**not separated**", "**behind**", 1)
    assert edited != block and _claims(edited) != expected_words()


def test_make_bench_runs_every_benchmark_the_docs_list() -> None:
    text = (DOCS / "benchmarks" / "index.md").read_text()
    listed = set(re.findall(r"^\| `(benchmarks/\w+\.py)`", text, re.M))  # the benchmark table's commands
    makefile = (ROOT / "Makefile").read_text()

    def recipe(name: str) -> str:  # a target's lines, and those of the targets it runs with $(MAKE)
        body = makefile[makefile.index(f"\n{name}:") :].split("\n\n")[0]
        return body + "".join(recipe(t) for t in re.findall(r"\$\(MAKE\) ([\w-]+)", body))

    run = set(re.findall(r"\$\(PY\) (benchmarks/\w+\.py)", recipe("bench")))
    assert len(listed) >= 10 and listed <= run, f"make bench does not run {sorted(listed - run)}"
