"""Harbor tasks in real containers (a private dockerd, tests/sandboxes/conftest.py): the oracle over every shipped
task, infrastructure failures typed (no reward, verifier timeout, unbuildable image), limits, and no container
outliving its pool or its owner process (killed with SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envs.harbor.generate import write_task
from envs.harbor.image import ensure_base, start_container, task_image
from envs.harbor.oracle import oracle
from envs.harbor.task import HarborTaskError, load_task, load_tasks
from envs.harbor.verify import run_verifier
from envs.types import InfraFailure
from sandboxes.docker_engine import our_containers
from sandboxes.task_containers import ContainerPool

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "envs" / "harbor_tasks" / "swe_tiny"


@pytest.fixture(scope="module")
def pool(docker_host: str) -> Iterator[ContainerPool]:
    p = ContainerPool(docker_host, run=f"test-harbor-{os.getpid()}", pool="harbor", warm=1)
    ensure_base(p)
    yield p
    p.close()


@pytest.mark.slow
@pytest.mark.heavy  # 18 containers and 9 image builds: CI's heavy job
def test_every_shipped_task_scores_1_with_its_solution_and_0_without(pool: ContainerPool):
    results = [oracle(t, pool) for t in load_tasks(SHIPPED)]
    assert [r.line() for r in results if not r.ok] == []


@pytest.mark.parametrize(
    ("index", "test_sh", "verifier_timeout", "cause", "says"),
    [
        (1, "echo ran > /logs/verifier/note.txt", None, "no_reward", "wrote neither"),
        (2, "echo PASSED > /logs/verifier/reward.txt", None, "bad_reward", "'PASSED' is not a number"),
        (3, "sleep 600\necho 1 > /logs/verifier/reward.txt", "1.0", "verifier_timeout", "past timeout_sec=1"),
    ],
    ids=["no reward", "text reward", "verifier timeout"],
)
def test_a_verifier_without_a_usable_reward_is_an_infra_failure_never_a_zero(
    pool: ContainerPool,
    tmp_path: Path,
    index: int,
    test_sh: str,
    verifier_timeout: str | None,
    cause: str,
    says: str,
):
    d = write_task(tmp_path, index)
    if verifier_timeout is not None:
        toml = d / "task.toml"
        toml.write_text(toml.read_text().replace("timeout_sec = 60.0", f"timeout_sec = {verifier_timeout}"))
    (d / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test_sh}\n")
    task = load_task(d)
    c = start_container(task, pool)
    try:
        with pytest.raises(InfraFailure, match=says) as e:
            run_verifier(task, c)
        assert e.value.cause == cause
    finally:
        pool.release(c)


def test_a_dockerfile_that_cannot_build_names_its_line_and_fails_the_episode_as_infra(pool, tmp_path: Path):
    d = write_task(tmp_path, 4)
    df = d / "environment" / "Dockerfile"
    df.write_text(df.read_text() + "RUN test -f /does/not/exist\n")
    task = load_task(d)
    with pytest.raises(HarborTaskError, match=rf"{df}:4: RUN failed \(exit 1\)"):
        task_image(task, pool)
    with pytest.raises(InfraFailure) as e:
        start_container(task, pool)
    assert e.value.cause == "container_start"


def test_a_task_container_has_the_tasks_limits_and_no_network(pool: ContainerPool, tmp_path: Path):
    task = load_task(write_task(tmp_path, 5))
    c = start_container(task, pool)
    try:
        host = c._c.client.api.inspect_container(c.id)["HostConfig"]
        assert host["Memory"] == 512 << 20 and host["NanoCpus"] == 1_000_000_000
        assert host["NetworkMode"] == "none"
        res = c.exec("ls /sys/class/net", timeout_s=30)
        assert res.stdout.split() == ["lo"]
        assert c.exec("pwd", timeout_s=30).stdout.strip() == "/app"
    finally:
        pool.release(c)


def test_a_copy_only_task_starts_from_the_base_with_its_files_and_no_image_is_built(
    pool: ContainerPool, tmp_path: Path
):
    d = write_task(tmp_path, 7)  # the generated suite's Dockerfile: FROM, WORKDIR /app, COPY app/ /app/
    task = load_task(d)
    before = {i.id for i in pool.client.images.list()}
    c = start_container(task, pool)
    try:
        assert c.spec.image == ensure_base(pool)
        files = sorted(p.name for p in (d / "environment" / "app").iterdir())
        res = c.exec("pwd; ls; cat " + " ".join(files), timeout_s=60)
        lines = res.stdout.splitlines()
        assert lines[0] == "/app" and lines[1 : 1 + len(files)] == files
        assert "".join((d / "environment" / "app" / f).read_text() for f in files) in res.stdout
    finally:
        pool.release(c)
    assert {i.id for i in pool.client.images.list()} == before


def test_no_container_is_left_after_the_pool_closes(docker_host: str):
    p = ContainerPool(docker_host, run=f"test-close-{os.getpid()}", pool="harbor", warm=2)
    base = ensure_base(p)
    from sandboxes.image import image_python
    from sandboxes.task_containers import ContainerSpec

    spec = ContainerSpec(image=base, python=image_python(sys.executable))
    held = [p.start(spec) for _ in range(3)]
    assert len(our_containers(p.client, **{"agent-rl.run": p.labels.run})) >= 3
    p.close()
    assert our_containers(p.client, **{"agent-rl.run": p.labels.run}) == []
    assert all(c.closed for c in held)


def test_containers_of_an_owner_killed_with_sigkill_remove_themselves(docker_host: str, pool: ContainerPool):
    run = f"test-kill-{os.getpid()}"
    script = textwrap.dedent(
        f"""
        import sys, time
        from sandboxes.task_containers import ContainerPool, ContainerSpec
        from sandboxes.image import image_python
        from envs.harbor.image import BASE_IMAGE
        p = ContainerPool({docker_host!r}, run={run!r}, pool="harbor", warm=0)
        spec = ContainerSpec(image=BASE_IMAGE, python=image_python(sys.executable))
        held = [p.start(spec) for _ in range(2)]
        print("ready", flush=True)
        time.sleep(3600)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        if proc.stdout.readline().strip() != "ready":
            pytest.fail(f"the owner process did not start its containers: {proc.stderr.read()[-2000:]}")
        import docker

        client = docker.DockerClient(base_url=docker_host)
        assert len(our_containers(client, **{"agent-rl.run": run})) >= 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The lifelines' sockets closed with the process; each watchdog exits and the engine removes its container.
    # Generous: each removal is one watchdog poll (1 s) plus the engine's removal, on a loaded machine.
    deadline = time.monotonic() + 120
    while our_containers(client, **{"agent-rl.run": run}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert our_containers(client, **{"agent-rl.run": run}) == []


def _episode(spec, tokenizer, turns: list[str]) -> tuple[float, list]:
    """Drive one HarborEnv episode with scripted model turns (the text a model would write), as the rollout does."""
    import asyncio

    from envs.harbor.env import HarborEnv

    async def run() -> tuple[float, list]:
        env = HarborEnv(spec, tokenizer)
        env.reset(env.tasks("train")[0])
        results = []
        for text in turns:
            res = await env.step(tokenizer.encode(text, add_special_tokens=False))
            results.append(res)
            if res.done:
                return res.reward, results
        raise AssertionError("the episode did not end")

    return asyncio.run(run())


@pytest.mark.slow
@pytest.mark.heavy
def test_a_harbor_episode_fixing_the_bug_in_its_container_scores_1_and_one_doing_nothing_0(
    docker_host: str, pool: ContainerPool, tiny_model_dir: Path, tmp_path: Path
):
    from transformers import AutoTokenizer

    from envs.spec import EnvSpec

    d = write_task(tmp_path / "tasks", 0)
    spec = EnvSpec.model_validate(
        {
            "name": "h",
            "type": "harbor",
            "harbor": {"tasks": str(tmp_path / "tasks"), "heldout_fraction": 0.0, "docker_host": docker_host},
        }
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fix = (
        (d / "solution" / "solve.sh").read_text().split("\n", 1)[1]
    )  # the heredoc that writes the fixed module
    reward, steps = _episode(
        spec, tok, ["Let me look.\n```bash\nls /app\n```\n", f"```bash\n{fix}```\n", "Done."]
    )
    assert reward == 1.0
    module = next((d / "environment" / "app").glob("*.py")).name
    assert module in tok.decode(steps[0].observation_ids)  # `ls /app` ran in the task's container
    assert steps[0].info.code_ran and steps[-1].info.finish == "answer"
    reward, _ = _episode(spec, tok, ["I am not sure."])
    assert reward == 0.0
