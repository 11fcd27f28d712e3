"""Loaders for the data sets in the data root (parquet/jsonl), fixing the defects their SOURCE.txt files name.

Where data lives: `data.root` in the environment YAML (relative to that file), else
$AGENT_RL_DATA, else ../shared/data beside the checkout, else the cache `agent-rl data pull` fills
(~/.cache/agent-rl/data). Nothing here reaches a hub; each split's report is logged once (INFO).
Every loader returns the tasks plus a `DatasetReport` saying what was fixed or dropped:
- form feeds where JSON un-escaping ate the "\\f" of "\\frac" (AIME 2025, DAPO) are restored;
  other form feeds in DAPO are PDF "fi" ligatures and are repaired;
- tabs that ate the "\\t" of a LaTeX command ("\\triangle", "\\text", "\\times") are restored;
- other control characters are replaced by a space and counted;
- zero-padded integer answers (AIME 2024: "023") are unpadded;
- duplicated problems (DAPO) keep their first copy; problems whose copies disagree on the answer are dropped.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envs.rewards import gsm8k_answer
from envs.spec import DATA_ENV_VAR, DataSource, EnvSpec
from envs.types import EnvError, Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetReport:
    """What a loader changed; logged once per split."""

    source: str
    rows: int = 0
    tasks: int = 0
    frac_formfeeds_fixed: int = 0
    ligature_formfeeds_fixed: int = 0
    latex_tabs_fixed: int = 0
    control_chars_replaced: int = 0
    padded_answers_fixed: int = 0
    duplicates_dropped: int = 0
    conflicting_dropped: int = 0

    def __add__(self, other: DatasetReport) -> DatasetReport:
        counts = {k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__ if k != "source"}
        return DatasetReport(source=self.source, **counts)

    def summary(self) -> str:
        changed = [f"{k}={v}" for k, v in vars(self).items() if k not in ("source", "rows", "tasks") and v]
        return f"{self.source}: {self.rows} rows -> {self.tasks} tasks" + (
            f" ({', '.join(changed)})" if changed else ""
        )


_TAB_COMMAND = re.compile(r"\t(?=(?:riangle|ext\{|extbf\{|imes|heta|frac\{|an\b|ilde\{))")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")


def fix_text(text: str) -> tuple[str, DatasetReport]:
    """Undo the JSON-unescape and PDF-ligature damage in one problem text."""
    n_frac = text.count("\x0crac")
    text = text.replace("\x0crac", "\\frac")
    n_lig = 0

    def ligature(m: re.Match[str]) -> str:
        nonlocal n_lig
        n_lig += 1
        before, after = m.string[max(0, m.start() - 2) : m.start()], m.string[m.end() : m.end() + 1]
        if before.endswith("fi") or after == "f":
            return ""  # "fi\x0cve", "\x0cfirst": the ligature was kept as text too
        return (
            "fi" if after.isalpha() and after.islower() else " "
        )  # "\x0cnd" -> "find"; a stray one -> space

    text = re.sub("\x0c", ligature, text)
    text, n_tab = _TAB_COMMAND.subn("\\\\t", text)
    text, n_ctl = _CONTROL.subn(" ", text)
    return text, DatasetReport(
        "",
        frac_formfeeds_fixed=n_frac,
        ligature_formfeeds_fixed=n_lig,
        latex_tabs_fixed=n_tab,
        control_chars_replaced=n_ctl,
    )


def fix_answer(answer: Any) -> tuple[str, bool]:
    """Answers as strings; a zero-padded integer ("023") is unpadded. Returns (answer, was_padded)."""
    s = str(answer).strip()
    if re.fullmatch(r"0\d+", s):
        return s.lstrip("0") or "0", True
    return s, False


def field(row: Any, dotted: str) -> Any:
    """row["a"][0]["b"] for "a.0.b"; errors name the path."""
    cur = row
    for part in dotted.split("."):
        try:
            cur = cur[int(part)] if isinstance(cur, list | tuple) else cur[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise EnvError(f"field {dotted!r}: no {part!r} in {str(cur)[:120]!r}") from None
    return cur


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise EnvError(
            f"data file not found: {path} (download the built-in sets with `agent-rl data pull`, "
            f"or set data.root in the env YAML or ${DATA_ENV_VAR})"
        )
    if path.suffix == ".jsonl":
        with path.open() as f:
            return [json.loads(line) for line in f if line.strip()]
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _make_tasks(
    prefix: str, rows: list[dict[str, Any]], problem: str, answer: str, ident: str | None
) -> list[Task]:
    return [
        Task(
            id=f"{prefix}-{field(r, ident) if ident else i}",
            problem=str(field(r, problem)),
            answer=str(field(r, answer)),
            source=prefix,
        )
        for i, r in enumerate(rows)
    ]


def _builtin(name: str, part: str, root: Path) -> list[Task]:
    """Raw tasks of a built-in data set (before fixes)."""
    if name == "aime2024":
        rows = read_rows(root / "aime2024/simpletir_aime.parquet")
        return _make_tasks("aime2024", rows, "prompt.0.content", "reward_model.ground_truth", None)
    if name == "aime2025":
        rows = read_rows(root / "aime2025/simpletir_aime25.parquet")
        return _make_tasks("aime2025", rows, "prompt.0.content", "reward_model.ground_truth", None)
    if name == "math500":
        rows = read_rows(root / "math500/simplerl_math500_test.jsonl")
        return _make_tasks("math500", rows, "problem", "answer", "unique_id")
    if name == "simplelr_math_35":
        rows = read_rows(root / "simplelr_math_lvl3to5_train/simpletir_simplelr_math_35_train.parquet")
        return _make_tasks("simplelr_math_35", rows, "prompt.0.content", "reward_model.ground_truth", None)
    if name == "dapo_math_17k":
        rows = read_rows(root / "dapo_math_17k/svs_dapo_math_17k.parquet")
        return _make_tasks("dapo", rows, "prompt.0.content", "reward_model.ground_truth", "extra_info.index")
    if name == "gsm8k":
        rows = read_rows(root / f"gsm8k/{part}.jsonl")
        return [
            Task(f"gsm8k-{part}-{i}", r["question"], gsm8k_answer(r["answer"]), source="gsm8k")
            for i, r in enumerate(rows)
        ]
    if name == "countdown":
        rows = read_rows(root / f"countdown/uft_{part}.parquet")
        out = []
        for i, r in enumerate(rows):
            truth = r["reward_model"]["ground_truth"]
            nums = tuple(int(n) for n in truth["numbers"])
            out.append(
                Task(
                    f"countdown-{part}-{i}",
                    f"Using the numbers {list(nums)}, create an equation that equals {truth['target']}.",
                    str(truth["target"]),
                    numbers=nums,
                    source="countdown",
                )
            )
        return out
    raise EnvError(f"unknown built-in data set {name!r}")


def _dedupe(tasks: list[Task]) -> tuple[list[Task], int, int]:
    """Keep the first copy of each problem; drop every copy of a problem whose copies disagree."""
    answers: dict[str, set[str]] = defaultdict(set)
    for t in tasks:
        answers[t.problem].add(t.answer)
    seen: set[str] = set()
    out, dup, conflict = [], 0, 0
    for t in tasks:
        if len(answers[t.problem]) > 1:
            conflict += 1
        elif t.problem in seen:
            dup += 1
        else:
            seen.add(t.problem)
            out.append(t)
    return out, dup, conflict


def env_split(spec: EnvSpec, split: str) -> tuple[tuple[Task, ...], DatasetReport]:
    """An env's split by name (its `data.splits`), with what the loader fixed or dropped."""
    sources = spec.data.splits
    if split not in sources:
        raise EnvError(f"env {spec.name!r} has no split {split!r}; it has {sorted(sources)}")
    return load_split(sources[split], spec.data_root())


@functools.lru_cache(maxsize=64)
def load_split(source: DataSource, root: Path) -> tuple[tuple[Task, ...], DatasetReport]:
    """Tasks of one split (cached per source and root: envs are made per episode and must be cheap)."""
    if source.generator == "tiny_arith":
        from envs import tiny_arith

        tasks = tiny_arith.make_tasks(source.size, source.seed, source.easy_fraction)
        report = DatasetReport("tiny_arith", rows=len(tasks))
    elif source.generator == "tiny_chain":
        from envs import tiny_chain

        tasks = tiny_chain.make_tasks(source.size, source.seed, source.easy_fraction, source.chain_fraction)
        report = DatasetReport("tiny_chain", rows=len(tasks))
    elif source.generator == "tiny_multistep":
        from envs import tiny_multistep

        tasks = tiny_multistep.make_tasks(source.size, source.seed)
        report = DatasetReport("tiny_multistep", rows=len(tasks))
    else:
        if source.dataset is not None:
            raw = _builtin(source.dataset, source.part, root)
            name = source.dataset
        else:
            assert source.path is not None
            rows = read_rows(root / source.path)
            name = Path(source.path).stem
            raw = _make_tasks(name, rows, source.problem_field, source.answer_field, source.id_field)
        report = DatasetReport(name, rows=len(raw))
        tasks = []
        for t in raw:
            problem, r = fix_text(t.problem)
            answer, padded = fix_answer(t.answer)
            report = report + replace(r, padded_answers_fixed=int(padded))
            tasks.append(replace(t, problem=problem, answer=answer))
        if source.dataset == "dapo_math_17k":
            tasks, dup, conflict = _dedupe(tasks)
            report = replace(report, duplicates_dropped=dup, conflicting_dropped=conflict)
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise EnvError(
            f"{report.source}: task id {dup!r} occurs more than once; ids must be unique (check id_field)"
        )
    if source.limit is not None:
        tasks = tasks[: source.limit]
    report = replace(report, tasks=len(tasks))
    log.info("data %s", report.summary())  # once per split and process: load_split is cached
    return tuple(tasks), report
