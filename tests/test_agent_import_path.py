"""An agent env's `import_path` resolves against the env file's project as well as sys.path, so the
`agent-rl` command (the console script: the working directory is not on its sys.path) validates and
trains the example agent from the repository root and from any other directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.spec import load_callable, project_of

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("agent-rl")


def _agent_rl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENT_RL_DEBUG")}
    return subprocess.run([str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not CLI.exists(), reason="the agent-rl console script is not installed beside python")
def test_validate_and_train_resolve_the_example_agent_from_the_repo_root_and_from_another_directory(
    tmp_path, tool_model
):
    for cwd, recipe in (
        (ROOT, "recipes/agent_arith.yaml"),
        (tmp_path, str(ROOT / "recipes" / "agent_arith.yaml")),
    ):
        res = _agent_rl("validate", "--skip-model", recipe, cwd=cwd)
        assert res.returncode == 0 and res.stdout.strip() == f"{recipe}: ok (recipe)", (cwd, res.stderr)
    smoke = ROOT / "recipes" / "agent_arith_smoke.yaml"
    sets = ["--set", f"model.path={tool_model}", "--set", "train.steps=1", "--set", "checkpoint.every=0"]
    res = _agent_rl("train", "recipes/agent_arith_smoke.yaml", *sets, "--dry-run", cwd=ROOT)
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "run"
    res = _agent_rl("train", str(smoke), *sets, "--set", f"logging.run_dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1  # the agent ran and one step trained


def test_a_module_found_nowhere_still_names_the_path_and_where_it_looked(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    env_file = tmp_path / "envs" / "e.yaml"
    assert project_of(env_file) == tmp_path
    with pytest.raises(
        ValueError, match=rf"cannot import 'no_such_pkg.agent:run': .*looked on sys.path and in {tmp_path}"
    ):
        load_callable("no_such_pkg.agent:run", near=env_file)
    assert str(tmp_path) not in sys.path  # a failed import leaves sys.path as it was
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "__init__.py").write_text(
        "async def run(task, client, sandbox):\n    return None\n"
    )
    try:
        assert load_callable("my_agents:run", near=env_file).__module__ == "my_agents"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_agents", None)
