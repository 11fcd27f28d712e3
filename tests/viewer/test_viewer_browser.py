"""`agent-rl view` on a short real run, checked in headless Chromium (Debian's `chromium`, driven by playwright).

The run is the real loop (tiny random model, tiny_arith env, local sandbox, embedded engine, torch
learner, k=2); every weight push waits until a turn is in flight (tests/push_mid_turn.py), so some
turns are continued under the next version. Screenshots go to artifacts/viewer/ (kept by CI).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from push_mid_turn import push_mid_turn

from agent_rl.config import load_recipe
from agent_rl.trainer import train
from agent_rl.viewer import main as view_main
from agent_rl.viewer.log import read_index, read_step

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "viewer"
STEPS = 5


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(
            "no chromium here: scripts/install_system_deps.sh installs Debian's `chromium` (run as root)"
        )
    return path


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        push_mid_turn(mp)  # every push lands mid-turn: some turns carry two versions
        return _train(tiny_model_dir, tmp_path_factory)


def _train(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("view_run") / "run"
    recipe = load_recipe(
        ROOT / "recipes" / "tiny_tir_smoke.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"logging.run_dir={out}",
            f"train.steps={STEPS}",
            "checkpoint.every=0",
            "logging.trajectories=all",
            "buffer.mask_void=true",  # the random model's void turns: whole trajectories masked (greyed)
        ],
    )
    return train(recipe)


@pytest.fixture(scope="module")
def page(run_dir: Path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' (playwright)")
    chromium = _chromium()
    assert view_main([str(run_dir)]) == 0
    html = run_dir / "view.html"
    assert html.is_file()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        pg.on(
            "console",
            lambda m: (
                errors.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None
            ),
        )
        pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        pg.on(
            "request",
            lambda r: (
                errors.append(f"network request: {r.url}")
                if not r.url.startswith(("file:", "data:"))
                else None
            ),
        )
        pg.goto(html.as_uri())
        pg.wait_for_selector(".traj")
        pg.errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _select_step(pg, step: int) -> None:
    pg.click(f'#steps tbody tr[data-step="{step}"]')
    pg.wait_for_selector(f'#steps tbody tr.selected[data-step="{step}"]')


def test_page_loads_without_console_errors_or_network(page) -> None:
    assert page.errors == []  # type: ignore[attr-defined]
    assert page.title() == "agent-rl trajectories"


def test_page_lists_every_recorded_step_and_each_steps_trajectories(page, run_dir: Path) -> None:
    index = read_index(run_dir)
    assert [s.step for s in index] == list(range(STEPS))
    assert page.locator("#steps tbody tr").count() == STEPS
    for s in (index[0], index[-1]):
        _select_step(page, s.step)
        assert (
            page.locator(".traj").count() == s.trajectories == s.batch_trajectories
        )  # logging.trajectories=all
        assert page.locator(".group").count() == s.groups
    assert page.errors == []  # type: ignore[attr-defined]


def test_a_turn_continued_across_a_weight_update_shows_both_versions(page, run_dir: Path) -> None:
    partial = [
        (s.step, t)
        for s in read_index(run_dir)
        for t in read_step(run_dir, s.step).trajectories
        if len(t.versions) > 1
    ]
    assert partial, "no recorded trajectory was continued across a weight update in this run"
    step, traj = partial[0]
    _select_step(page, step)
    card = page.locator(f'.traj[data-uid="{traj.uid}"]')
    shown = sorted(
        {int(v) for v in card.locator(".tok[data-v]").evaluate_all("els => els.map(e => e.dataset.v)")}
    )
    assert shown == traj.versions and len(shown) >= 2
    assert card.locator(".badge.partial").count() == 1
    # each token where a new version takes over is marked
    assert card.locator(".tok.vchange").count() >= len(shown) - 1
    head = card.locator(".traj-head").inner_text()
    assert "→".join(map(str, shown)) in head


def test_switching_colour_mode_recolours_the_tokens(page, run_dir: Path) -> None:
    _select_step(page, STEPS - 1)
    page.select_option("#colour", "lag")
    toks = page.locator(".tok[data-v]:not(.masked)")
    lag = toks.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "viewer_lag.png"), full_page=False)
    page.select_option("#colour", "weight")
    weight = toks.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    page.screenshot(path=str(ARTIFACTS / "viewer_weight.png"), full_page=False)
    assert page.evaluate("document.body.dataset.colour") == "weight"
    assert len(lag) == len(weight) > 0 and lag != weight
    # lag mode colours every trained token by how many versions old it is; in weight mode a token's colour
    # follows log(π/μ) (transparent near 1), so the two renderings differ token by token
    assert all(c != "rgba(0, 0, 0, 0)" for c in lag)
    assert (ARTIFACTS / "viewer_lag.png").stat().st_size > 10_000
    # mismatch mode: tokens of older versions are marked "not measured" (grey); tokens of the learner's
    # own version are coloured by |log π − log μ|, which the embedded engine keeps near 0 in fp32 (transparent)
    page.select_option("#colour", "mismatch")
    lags = toks.evaluate_all("els => els.map(e => e.dataset.lag)")
    mism = toks.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    assert "0" in lags and any(x != "0" for x in lags), "the last step mixes fresh and stale tokens (k=2)"
    assert all((c == "rgb(238, 240, 243)") == (lag != "0") for c, lag in zip(mism, lags, strict=True))
    assert "not measured" in page.locator("#legend").inner_text()
    page.select_option("#colour", "lag")


def test_tool_output_and_masked_tokens_are_greyed(page, run_dir: Path) -> None:
    steps = [
        s.step for s in read_index(run_dir) if any(t.masked for t in read_step(run_dir, s.step).trajectories)
    ]
    assert steps, "no masked trajectory in this run"
    _select_step(page, steps[0])
    masked = page.locator(".tok.masked")
    assert masked.count() > 0
    colours = set(masked.evaluate_all("els => els.map(e => getComputedStyle(e).color)"))
    assert colours == {"rgb(154, 160, 171)"}
    backgrounds = set(masked.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)"))
    assert backgrounds == {"rgba(0, 0, 0, 0)"}


def test_filters_show_only_matching_trajectories(page, run_dir: Path) -> None:
    step = STEPS - 1
    _select_step(page, step)
    trajs = read_step(run_dir, step).trajectories
    page.select_option("#filter", "truncated")
    truncated = sum(t.finish_reason in ("length", "max_turns") for t in trajs)
    assert page.locator(".traj").count() == truncated
    assert page.locator(".traj .badge.truncated").count() == truncated
    page.select_option("#filter", "top")
    weights = {t.uid: t.seq_log_weight for t in trajs if t.seq_log_weight is not None and not t.masked}
    shown = page.locator(".traj").evaluate_all("els => els.map(e => e.dataset.uid)")
    assert len(shown) == min(5, len(weights))  # a masked trajectory has no weight to rank
    assert sorted((weights[u] for u in shown), reverse=True) == sorted(weights.values(), reverse=True)[:5]
    page.select_option("#filter", "all")
    assert page.locator(".traj").count() == len(trajs)
