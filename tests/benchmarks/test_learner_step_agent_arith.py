"""benchmarks/learner_step_agent_arith.py's arithmetic and pages: a ratio is the median of the per-round ratios
against the case's baseline (with their min and max), and the committed pages are what the JSON renders to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.learner_step_agent_arith import BEFORE, MB4, NOW, markdown, ratios

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_a_ratio_is_the_median_of_the_per_round_ratios_against_the_case_baseline() -> None:
    res = {
        BEFORE: {"cpu_s": [1.0, 2.0, 1.0], "wall_s": [1.0, 1.0, 1.0]},
        NOW: {"cpu_s": [0.9, 1.0, 0.8], "wall_s": [0.5, 2.0, 1.0]},
        MB4: {"cpu_s": [1.8, 1.0, 1.6], "wall_s": [1.0, 1.0, 1.0]},  # against NOW, not BEFORE
    }
    r = ratios(res)
    now = r[f"{NOW} / {BEFORE} (cpu)"]
    assert now["rounds"] == pytest.approx([0.9, 0.5, 0.8])
    assert (now["median"], now["min"], now["max"]) == pytest.approx(
        (0.8, 0.5, 0.9)
    )  # not 0.9 / 1.0 of the medians
    assert r[f"{MB4} / {NOW} (cpu)"]["median"] == pytest.approx(2.0)
    assert r[f"{NOW} / {BEFORE} (wall)"]["median"] == pytest.approx(1.0)
    assert not any(k.startswith(f"{MB4} / {BEFORE}") for k in r)


@pytest.mark.parametrize("name", ["learner_step_agent_arith", "learner_step_agent_arith_2threads"])
def test_the_committed_page_is_what_its_json_renders(name: str) -> None:
    d = json.loads((RESULTS / f"{name}.json").read_text())
    assert (RESULTS / f"{name}.md").read_text().rstrip("\n") == markdown(d).rstrip("\n")
    assert d["ratios"] == ratios(d["cases"])  # the ratios on the page come from the rounds kept beside them
