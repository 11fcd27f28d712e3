"""`agent-rl train` with algorithm.teacher: the teacher scores what the rollouts sample, the learner distils.

The teacher here is the student's own starting weights, so at step 0 (every token sampled by version 0,
the learner still at version 0) the per-token reverse KL is only the gap between two fp32 forwards of the
same weights (the learner's transformers forward, the teacher engine's prefill).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from agent_rl.config import load_recipe
from agent_rl.trainer import train
from agent_rl.viewer.log import read_step

ROOT = Path(__file__).resolve().parents[2]
# tests/engines/test_engine_correctness.py bounds the embedded engine's fp32 log-probs against transformers' by
# 1e-4 per token; a mean of such gaps is within the same bound (a teacher with other weights: O(1))
SAME_WEIGHTS_KL = 1e-4


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train_distilling(tiny_model_dir: Path, run_dir: Path, topology: str) -> Path:
    sets = [
        f"model.path={tiny_model_dir}",
        f"logging.run_dir={run_dir}",
        "logging.trajectories=all",
        "train.steps=3",
        f"algorithm.teacher.engine={tiny_model_dir}",
        "algorithm.teacher.task_weight=0",
    ]
    if topology == "processes":  # the teacher is an `agent-rl serve` process on the engine cores
        sets += ["placement.topology=processes", "engines.weight_sync=disk", "train.steps=2"]
    return train(load_recipe(ROOT / "recipes" / "tiny_tir_smoke.yaml", sets))


@pytest.fixture(scope="module")
def inprocess_run(tiny_model_dir, tmp_path_factory) -> Path:
    """One in-process distilling run, shared by the run's checks and the viewer's."""
    return _train_distilling(tiny_model_dir, tmp_path_factory.mktemp("distill") / "run", "inprocess")


@pytest.mark.parametrize("topology", ["inprocess", "processes"])
def test_train_distils_with_the_teacher_scoring_every_sampled_token(
    tiny_model_dir, tmp_path, topology, request
):
    if topology == "inprocess":
        run_dir = request.getfixturevalue("inprocess_run")
    else:
        run_dir = _train_distilling(tiny_model_dir, tmp_path / "run", topology)
    steps = 3 if topology == "inprocess" else 2
    records = _records(run_dir)
    assert [r["step"] for r in records] == list(range(steps))
    for r in records:
        for key in (
            "distill/reverse_kl",
            "distill/teacher_logprob",
            "distill/disagree_frac",
            "teacher/wait_seconds",
        ):
            assert math.isfinite(r[key]), (key, r[key])
        assert r["learner/skipped"] == 0.0
    assert sum(r["teacher/scored_tokens"] for r in records) > 0
    first = records[0]
    assert first["learner/staleness_max"] == 0 and abs(first["distill/reverse_kl"]) <= SAME_WEIGHTS_KL
    # the trajectory log carries the teacher's score of every sampled token, next to the behaviour log-prob
    for t in read_step(run_dir, 0).trajectories:
        for s in t.segments:
            if s.sampled:
                assert len(s.teacher_logprobs) == len(s.behavior_logprobs) == len(s.token_ids)
            else:
                assert s.teacher_logprobs == []


def test_the_viewer_colours_tokens_by_the_teachers_log_prob(inprocess_run):
    """`agent-rl view` of a distilling run, in chromium: the "teacher log-prob" colour switch paints each sampled
    token by its recorded log π_T (red as the teacher finds it unlikely), and the hover shows log π_T."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' (playwright)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip(
            "no chromium here: scripts/install_system_deps.sh installs Debian's `chromium` (run as root)"
        )
    from agent_rl.viewer import main as view_main

    assert view_main([str(inprocess_run)]) == 0
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto((inprocess_run / "view.html").as_uri())
            page.wait_for_selector(".traj")
            page.select_option("#colour", "teacher")
            toks = page.locator(".tok[data-t]:not(.masked)")
            got = toks.evaluate_all(
                "els => els.map(e => [Number(e.dataset.t), getComputedStyle(e).backgroundColor])"
            )
            page.locator(".tok[data-t]:not(.masked):visible").filter(has_text=re.compile(r"\S")).first.hover()
            hover = page.locator("#tip").inner_text()
        finally:
            browser.close()
    assert got, "no token carries a teacher log-prob"
    assert "teacher log π_T" in hover
    for lt, colour in got:
        # viewer.js teacherColour: alpha = 0.8 * clip((-1 - log π_T) / (ln 100 - 1), 0, 1); below 0.02 transparent
        alpha = 0.8 * min(max(-1 - lt, 0) / (math.log(100) - 1), 1)
        if alpha < 0.02:
            assert colour == "rgba(0, 0, 0, 0)", (lt, colour)
        else:
            assert colour.startswith("rgba(214, 48, 49, "), (lt, colour)
            # the browser keeps the alpha the page set (3 decimals) to within one 8-bit step
            assert abs(float(colour.rsplit(",", 1)[1].rstrip(")")) - alpha) <= 1 / 255 + 5e-4, (lt, colour)
    # the random tiny model spreads its mass over the vocabulary: most sampled tokens are unlikely to the teacher
    assert any(c != "rgba(0, 0, 0, 0)" for _, c in got)
