"""Data loaders: the SOURCE.txt defects are fixed or dropped, and the report says what changed."""

from __future__ import annotations

import json

import pytest

from envs.datasets import fix_text, load_split
from envs.spec import DataSource
from envs.types import EnvError


def test_aime2025_form_feeds_become_frac(shared_data):
    tasks, report = load_split(DataSource(dataset="aime2025"), shared_data)
    assert len(tasks) == 30
    assert not any("\x0c" in t.problem for t in tasks)
    assert "\\frac{\\log_k" in tasks[18].problem and "$\\frac{m}{n}$" in tasks[27].problem
    assert report.frac_formfeeds_fixed == 6
    assert any("\\triangle" in t.problem for t in tasks)  # the tab that ate "\t" of "\triangle"


def test_aime2024_answers_are_unpadded(shared_data):
    tasks, report = load_split(DataSource(dataset="aime2024"), shared_data)
    assert {"23", "25", "73", "80"} <= {t.answer for t in tasks}
    assert not any(t.answer.startswith("0") for t in tasks)
    assert report.padded_answers_fixed == 7


def test_dapo_duplicates_and_conflicting_answers_are_dropped(shared_data):
    tasks, report = load_split(DataSource(dataset="dapo_math_17k"), shared_data)
    problems = [t.problem for t in tasks]
    assert len(problems) == len(set(problems))
    assert report.rows == 17917 and report.tasks == len(tasks)
    assert report.conflicting_dropped >= 22  # 11 texts with conflicting answers, every copy dropped
    assert report.rows == report.tasks + report.duplicates_dropped + report.conflicting_dropped
    assert not any("\x0c" in p for p in problems)
    assert tasks[0].answer == "34" and tasks[0].problem.startswith("In triangle $ABC$")


def test_gsm8k_and_countdown_rows_become_tasks(shared_data):
    gsm, _ = load_split(DataSource(dataset="gsm8k", part="test"), shared_data)
    assert len(gsm) == 1319 and gsm[0].answer == "18"
    cd, _ = load_split(DataSource(dataset="countdown", part="train"), shared_data)
    assert len(cd) == 10240 and cd[0].numbers == (44, 19, 35) and cd[0].answer == "98"


def test_math500_answers_keep_their_latex(shared_data):
    tasks, _ = load_split(DataSource(dataset="math500", limit=5), shared_data)
    assert len(tasks) == 5
    assert tasks[0].answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert tasks[0].id == "math500-test/precalculus/807.json"


def test_ligature_form_feeds_are_repaired():
    assert fix_text("fi\x0cve women")[0] == "five women"
    assert fix_text("the \x0cfirst shop")[0] == "the first shop"
    assert fix_text("fi\x0cnd $A$")[0] == "find $A$"  # the ligature after a kept "fi" is dropped
    assert fix_text("de\x0cne $a_n$")[0] == "define $a_n$"
    assert fix_text("$\x0crac{1}{2}$")[0] == "$\\frac{1}{2}$"


def test_a_jsonl_file_with_a_field_mapping_loads(tmp_path):
    rows = [{"q": {"text": "1+1?"}, "a": "02", "key": "k1"}, {"q": {"text": "2+2?"}, "a": "4", "key": "k2"}]
    (tmp_path / "mine.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    src = DataSource(path="mine.jsonl", problem_field="q.text", answer_field="a", id_field="key")
    tasks, report = load_split(src, tmp_path)
    assert [(t.id, t.problem, t.answer) for t in tasks] == [
        ("mine-k1", "1+1?", "2"),
        ("mine-k2", "2+2?", "4"),
    ]
    assert report.padded_answers_fixed == 1


def test_a_bad_field_mapping_names_the_field(tmp_path):
    (tmp_path / "mine.jsonl").write_text(json.dumps({"question": "x"}) + "\n")
    with pytest.raises(EnvError, match="field 'problem'"):
        load_split(DataSource(path="mine.jsonl"), tmp_path)


def test_a_missing_data_root_says_how_to_point_at_one(tmp_path):
    with pytest.raises(EnvError, match="AGENT_RL_DATA"):
        load_split(DataSource(dataset="aime2025"), tmp_path / "nowhere")


def test_duplicate_task_ids_are_refused(tmp_path):
    (tmp_path / "dup.jsonl").write_text(
        '{"problem": "a", "answer": "1", "k": 1}\n{"problem": "b", "answer": "2", "k": 1}\n'
    )
    with pytest.raises(EnvError, match="task id 'dup-1' occurs more than once"):
        load_split(DataSource(path="dup.jsonl", id_field="k"), tmp_path)


def test_every_built_in_split_has_unique_ids(shared_data):
    for name in ("aime2024", "aime2025", "math500", "simplelr_math_35", "dapo_math_17k"):
        tasks, _ = load_split(DataSource(dataset=name), shared_data)
        assert len({t.id for t in tasks}) == len(tasks), name
