"""Harbor tasks read and validated without a Docker engine: every bad input is one line naming the task's file
and line; the reward contract; the generated suite. (The container side: tests/sandboxes/test_harbor_containers.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envs.harbor import dockerfile
from envs.harbor.generate import FAMILIES, generate, write_task
from envs.harbor.image import BASE_IMAGE, recipe
from envs.harbor.task import HarborTaskError, heldout, load_task, load_tasks, size_mb
from envs.harbor.verify import parse_reward
from envs.types import InfraFailure

SHIPPED = Path(__file__).resolve().parents[2] / "envs" / "harbor_tasks" / "swe_tiny"


@pytest.fixture
def task(tmp_path: Path) -> Path:
    return write_task(tmp_path, 0)


def test_every_shipped_task_is_valid_and_builds_on_the_base_without_warnings():
    tasks = load_tasks(SHIPPED)
    assert len(tasks) >= 9
    for t in tasks:
        r = recipe(t)
        assert r is not None and r.warnings == [] and r.workdir == "/app"
        assert t.solution is not None and not t.resources.network


def test_the_shipped_suite_is_what_the_generator_writes(tmp_path: Path):
    generate(tmp_path, len(list(SHIPPED.iterdir())))
    for d in SHIPPED.iterdir():
        for f in d.rglob("*"):
            if f.is_file():
                assert (tmp_path / d.name / f.relative_to(d)).read_bytes() == f.read_bytes(), f


def test_the_generator_covers_the_three_bug_families_and_is_deterministic(tmp_path: Path):
    dirs = generate(tmp_path / "a", 6, seed=3)
    again = generate(tmp_path / "b", 6, seed=3)
    families = [load_task(d).config.metadata["family"] for d in dirs]
    assert sorted(set(families)) == sorted(FAMILIES)
    for d, e in zip(dirs, again, strict=True):
        assert sorted(p.read_text() for p in d.rglob("*.py")) == sorted(
            p.read_text() for p in e.rglob("*.py")
        )


def test_a_task_without_test_sh_is_refused_naming_the_file(task: Path):
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError, match=r"tests/test\.sh: missing"):
        load_task(task)


@pytest.mark.parametrize(
    ("edit", "where", "says"),
    [
        (
            lambda s: s.replace("timeout_sec = 60.0", "timout_sec = 60.0"),
            12,
            r"\[verifier\] timout_sec: unknown field",
        ),
        (
            lambda s: s.replace("timeout_sec = 60.0", "timeout_sec = -5"),
            12,
            r"\[verifier\] timeout_sec: must be a finite",
        ),
        (lambda s: s.replace("memory_mb = 512", 'memory_mb = "lots"'), 20, r"\[environment\] memory_mb"),
        (lambda s: s.replace("cpus = 1", "cpus = 0"), 19, r"\[environment\] cpus: must be > 0"),
        (lambda s: s + "gpus = 2\n", 22, r"\[environment\] gpus: the task asks for 2 GPU"),
    ],
)
def test_a_bad_task_toml_field_is_one_line_with_its_line_number(task: Path, edit, where: int, says: str):
    toml = task / "task.toml"
    toml.write_text(edit(toml.read_text()))
    with pytest.raises(HarborTaskError, match=says) as e:
        load_task(task)
    assert str(e.value).startswith(f"{toml}:{where}: ") and "\n" not in str(e.value)


def test_malformed_toml_is_refused_with_its_position(task: Path):
    (task / "task.toml").write_text("[verifier\ntimeout_sec = 1\n")
    with pytest.raises(HarborTaskError, match=r"task\.toml: not valid TOML: .*line 1"):
        load_task(task)


def test_a_directory_of_tasks_reports_every_invalid_one(tmp_path: Path):
    a, b, _ = (write_task(tmp_path, i) for i in range(3))
    (a / "instruction.md").write_text("  \n")
    (b / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError) as e:
        load_tasks(tmp_path)
    lines = str(e.value).splitlines()
    assert (
        len(lines) == 2 and "instruction.md: missing or empty" in lines[0] and "test.sh: missing" in lines[1]
    )


def test_legacy_memory_strings_and_no_network_are_read(task: Path):
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("memory_mb = 512", 'memory = "2G"'))
    t = load_task(task)
    assert t.resources.memory_mb == 2048 and t.resources.network is False
    assert size_mb("512M") == 512 and size_mb("1.5GiB") == 1536


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            "RUN apt-get update && apt-get install -y git",
            r"Dockerfile:4: RUN apt-get: needs a package registry",
        ),
        ("RUN curl -sSL https://example.com/x | sh", r"Dockerfile:4: RUN curl"),
        ("COPY missing.txt /app/", r"Dockerfile:4: COPY missing\.txt: not in the build context"),
        ("ADD https://example.com/a.tgz /app/", r"Dockerfile:4: ADD https://example.com/a\.tgz: a download"),
        ("FROBNICATE x", r"Dockerfile:4: FROBNICATE: not a Dockerfile instruction"),
        ("FROM ubuntu:24.04", r"Dockerfile:4: FROM: multi-stage builds are not supported"),
    ],
)
def test_a_dockerfile_step_the_offline_base_cannot_build_is_refused_at_its_line(
    task: Path, line: str, says: str
):
    df = task / "environment" / "Dockerfile"
    df.write_text(df.read_text() + line + "\n")
    with pytest.raises(HarborTaskError, match=says):
        recipe(load_task(task))


def test_a_public_from_is_mapped_to_the_base_with_one_warning_and_pip_of_what_the_base_has_is_skipped(
    task: Path,
):
    df = task / "environment" / "Dockerfile"
    df.write_text(
        "# a task written for Harbor\nFROM python:3.12-slim\nWORKDIR /app\nENV A=1 B=two\n"
        'RUN pip install pytest \\\n    pluggy\nCOPY app/ /app/\nCMD ["bash"]\n'
    )
    r = recipe(load_task(task))
    assert r.base == BASE_IMAGE and len(r.warnings) == 2
    assert r.warnings[0].startswith(f"{df}:2: FROM python:3.12-slim is built on")
    assert "already in the base image, skipped" in r.warnings[1]
    assert r.env == {"A": "1", "B": "two"} and r.workdir == "/app"
    assert [s.kind for s in r.steps] == ["WORKDIR", "ENV", "ENV", "COPY"]


def test_pip_of_a_package_the_base_lacks_is_refused(task: Path):
    df = task / "environment" / "Dockerfile"
    df.write_text(df.read_text() + "RUN pip install numpy==2.0\n")
    with pytest.raises(HarborTaskError, match="RUN pip install: needs a package registry"):
        recipe(load_task(task))


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "want"),
    [
        (None, b"1\n", 1.0),
        (None, b" 0.25 ", 0.25),
        (b'{"reward": 0.5, "style": 1}', b"0", 0.5),  # reward.json wins over reward.txt
        (b'{"tests_passed": 0.75}', None, 0.75),  # the only reward
        (b"1", None, 1.0),
    ],
)
def test_the_reward_is_read_as_harbor_writes_it(reward_json, reward_txt, want):
    assert parse_reward("t", reward_json, reward_txt) == want


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "cause", "says"),
    [
        (None, None, "no_reward", "wrote neither"),
        (None, b"passed", "bad_reward", r"reward\.txt: 'passed' is not a number"),
        (None, b"nan", "bad_reward", "not finite"),
        (b"{oops", None, "bad_reward", "not JSON"),
        (b'{"a": 1, "b": 0}', None, "bad_reward", "none named 'reward'"),
        (b'{"reward": "yes"}', None, "bad_reward", "is not a number"),
        (b'{"reward": true}', None, "bad_reward", "is not a number"),
    ],
)
def test_a_missing_or_bad_reward_is_an_infrastructure_failure_never_a_zero(
    reward_json, reward_txt, cause, says
):
    with pytest.raises(InfraFailure, match=says) as e:
        parse_reward("swe-1", reward_json, reward_txt)
    assert e.value.cause == cause and "task swe-1" in str(e.value)


def test_the_heldout_split_is_stable_and_near_its_fraction():
    names = [f"agent-rl/swe-tiny-0-{i:04d}" for i in range(2000)]
    share = sum(heldout(n, 0.2) for n in names) / len(names)
    assert 0.17 < share < 0.23  # binomial sd of the share at n=2000 is 0.009: a 3.3-sd band
    assert [heldout(n, 0.2) for n in names[:50]] == [heldout(n, 0.2) for n in names[:50]]


def test_dockerfile_continuations_and_comments(tmp_path: Path):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM x\n# c\nRUN echo a \\\n  # inside\n  && echo b\nWORKDIR sub\n")
    r = dockerfile.parse(df, "x")
    assert r.steps[0].line == 3 and "echo a" in r.steps[0].args[0] and "echo b" in r.steps[0].args[0]
    assert r.workdir == "/sub" and r.warnings == []
    shutil.rmtree(tmp_path)


def test_commands_and_verifiers_wait_for_one_of_parallel_commands_slots_while_other_docker_calls_do_not():
    """32 episodes' pytest runs at once on 2 cores ran past the verifier's 60 s: `work` (a command, a verifier) takes
    a slot of harbor.parallel_commands; `call` (a container's start or removal) does not wait for one."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from envs.harbor.env import _LoopPool

    entered, go = threading.Semaphore(0), threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()

    def command() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        entered.release()
        go.wait()
        with lock:
            running[0] -= 1

    async def main() -> None:
        lp = _LoopPool(pool=None, threads=ThreadPoolExecutor(8), commands=asyncio.Semaphore(2))
        work = [asyncio.ensure_future(lp.work(command)) for _ in range(5)]
        try:
            for _ in range(2):
                await asyncio.to_thread(entered.acquire)
            assert lp.commands.locked()  # the other three wait for a slot, not in a thread
            await lp.call(lambda: None)  # a start or a removal goes through while every slot is held
        finally:
            go.set()
            await asyncio.gather(*work)
            lp.threads.shutdown()

    asyncio.run(main())
    assert most[0] == 2


def test_a_stopped_swe_tiny_run_says_what_the_same_command_does_next(tmp_path: Path):
    from examples.swe_tiny import resume_note

    assert resume_note(tmp_path / "rl").startswith("no RL checkpoint yet")
    for step in (5, 10):
        (tmp_path / "rl" / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    (tmp_path / "rl" / "checkpoints" / "latest").symlink_to("step_000010")
    assert (
        resume_note(tmp_path / "rl")
        == "RL step 10 is checkpointed: the same command again resumes RL from it"
    )
