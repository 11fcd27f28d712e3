"""Task images built offline: the base from this machine's Python, each task's image on top, cached.

The base (`agent-rl-harbor-base:latest`) is sandboxes/image.py's rootfs (this interpreter's install at its
own path) plus pytest and a shell with coreutils. A task image is its Dockerfile's buildable steps
(dockerfile.py) run in a container of the base and committed; its tag is a hash of the Dockerfile, the
build context and the base, so an unchanged task is built once per Docker engine.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from functools import cache
from typing import Any

from envs.harbor.dockerfile import Recipe, parse
from envs.harbor.task import HarborTask, HarborTaskError
from envs.types import InfraFailure
from sandboxes.api import SandboxError
from sandboxes.image import build_image, image_python
from sandboxes.task_containers import ContainerPool, ContainerSpec

BASE_IMAGE = "agent-rl-harbor-base:latest"
BASE_PACKAGES = ("pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments")
"""In the base besides the standard library: what a test.sh that runs pytest needs (pytest 9 imports pygments and its
own `py` shim; tests/sandboxes/test_image.py checks this list against the installed pytest's requirements)."""
BASE_TOOLS = (
    "bash", "sh", "timeout", "cat", "ls", "mkdir", "cp", "mv", "rm", "chmod", "sed", "grep", "head", "tail",
    "env", "find", "diff", "touch", "wc", "sort", "tee", "dirname", "basename", "sleep", "xargs", "cut", "tr",
    "uniq", "patch", "pwd", "id",
)  # fmt: skip
_PIP_NAMES = frozenset({"pytest", "pluggy", "iniconfig", "packaging", "pygments"})


@cache
def _python() -> str:
    """The interpreter's path inside the base (asked of this interpreter once: it starts a Python to answer, which
    every episode's start paid before)."""
    return image_python(sys.executable)


def ensure_base(
    pool: ContainerPool, *, tag: str = BASE_IMAGE, rebuild: bool = False, extra_packages: tuple[str, ...] = ()
) -> str:
    """The base image's tag, built (a few seconds) when the engine does not have it. `extra_packages`:
    importable packages of this interpreter to add (what a suite's tasks need beyond pytest)."""
    if rebuild or not _has_image(pool.client, tag):
        tools = [t for t in BASE_TOOLS if shutil.which(t)]
        build_image(tag, docker_host=pool.docker_host, packages=BASE_PACKAGES + extra_packages, tools=tools)
    return tag


def _has_image(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except Exception:
        return False


def recipe(task: HarborTask, base: str = BASE_IMAGE) -> Recipe | None:
    """The task's buildable Dockerfile steps (None for a prebuilt `docker_image`); HarborTaskError if unbuildable."""
    if task.dockerfile is None:
        return None
    return parse(task.dockerfile, base, pip_available=_PIP_NAMES)


def image_tag(task: HarborTask, base: str = BASE_IMAGE) -> str:
    h = hashlib.sha256(base.encode())
    context = task.path / "environment"
    for f in sorted(p for p in context.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(context)).encode() + b"\0" + f.read_bytes() + b"\0")
    return f"agent-rl-harbor-task:{h.hexdigest()[:16]}"


def task_image(task: HarborTask, pool: ContainerPool, *, base: str = BASE_IMAGE) -> tuple[str, str]:
    """(image tag, workdir) for the task, building it when the engine lacks it.

    A build that fails is a HarborTaskError naming the Dockerfile's line (validation and the oracle report
    it); the caller at run time turns it into an InfraFailure("container_start").
    """
    steps = recipe(task, base)
    if steps is None:
        image = task.config.environment.docker_image or ""
        if not _has_image(pool.client, image):
            raise HarborTaskError(
                f"{task.path / 'task.toml'}: [environment] docker_image {image!r} is not in the local Docker engine "
                "and there is no registry here; `docker load` it, or give environment/Dockerfile"
            )
        return image, task.workdir or "/"
    workdir = task.workdir or steps.workdir
    tag = image_tag(task, base)
    if _has_image(pool.client, tag):
        return tag, workdir
    python = _python()
    builder = pool._create(ContainerSpec(image=base, python=python, workdir="/"))
    try:
        _run_steps(task, steps, builder, task.config.environment.build_timeout_sec)
        changes = [f"WORKDIR {steps.workdir}"] + [f"ENV {k}={v}" for k, v in steps.env.items()]
        repo, _, version = tag.partition(":")
        builder.commit(repo, version, changes)
    finally:
        builder.close()
    return tag, workdir


def build_images(
    tasks: list[HarborTask], pool: ContainerPool, *, workers: int = 4, base: str = BASE_IMAGE
) -> list[str]:
    """Every task's image that an episode starts from, built ahead in `workers` threads (a build mostly waits on
    the engine), so that a run's episodes only start containers; a copy-only task needs none (the base serves it).
    Returns the tags in the tasks' order; a task that cannot build raises its HarborTaskError (validation's message)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(t: HarborTask) -> str:
        return base if copy_only(recipe(t, base)) else task_image(t, pool, base=base)[0]

    with ThreadPoolExecutor(max(1, workers)) as ex:
        return list(ex.map(one, tasks))


def _run_steps(task: HarborTask, recipe: Recipe, c: Any, timeout_s: float) -> None:
    assert task.dockerfile is not None
    context, wd, env = task.dockerfile.parent, "/", {}
    for step in recipe.steps:
        where = f"{task.dockerfile}:{step.line}"
        if step.kind == "WORKDIR":
            wd = step.args[0] if step.args[0].startswith("/") else f"{wd.rstrip('/')}/{step.args[0]}"
            c.exec(f"mkdir -p '{wd}'", timeout_s=30, user="0")
        elif step.kind == "ENV":
            env[step.args[0]] = step.args[1]
        elif step.kind == "COPY":
            *sources, dest = step.args
            dest = dest if dest.startswith("/") else f"{wd.rstrip('/')}/{dest}"
            for src in sources:
                for path in sorted(context.glob(src)) or [context / src]:
                    if path.is_dir():
                        c.put_dir(path, dest)
                    elif dest.endswith("/") or len(sources) > 1:
                        c.put_files(dest, {path.name: path.read_bytes()}, mode=path.stat().st_mode & 0o777)
                    else:
                        parent, _, name = dest.rpartition("/")
                        c.put_files(
                            parent or "/", {name: path.read_bytes()}, mode=path.stat().st_mode & 0o777
                        )
        elif step.kind == "RUN":
            res = c.exec(step.args[0], timeout_s=timeout_s, workdir=wd, env=env, user="0")
            if res.timed_out:
                raise HarborTaskError(f"{where}: RUN did not finish within build_timeout_sec={timeout_s:g}")
            if res.exit_code != 0:
                last = (res.stderr.strip() or res.stdout.strip() or "no output").splitlines()[-1]
                raise HarborTaskError(f"{where}: RUN failed (exit {res.exit_code}): {last}")


def copy_only(steps: Recipe | None) -> bool:
    """True for a Dockerfile whose steps only set WORKDIR/ENV and COPY files (the generated suites' kind): its
    image is the base plus those files, so an episode's container is a (warm) base container with the files put in,
    and no image is built or committed for it."""
    return steps is not None and all(s.kind in ("WORKDIR", "ENV", "COPY") for s in steps.steps)


def start_container(
    task: HarborTask, pool: ContainerPool, *, allow_network: bool = False, base: str = BASE_IMAGE
):
    """A fresh container for one episode of `task`; InfraFailure('container_start') when it cannot start.

    A copy-only Dockerfile (`copy_only`) starts from the base (the same spec for every such task, so the pool's warm
    containers serve them all) and gets its WORKDIR and files as the build would have made them; any other is
    built once (`task_image`) and started from its image."""
    try:
        steps = recipe(task, base)
        env = dict(task.config.environment.env)
        if copy_only(steps):
            assert steps is not None
            image, workdir = base, task.workdir or steps.workdir
            env = {**steps.env, **env}
        else:
            image, workdir = task_image(task, pool, base=base)
        spec = ContainerSpec(
            image=image,
            python=_python(),
            cpus=task.resources.cpus,
            memory_mb=task.resources.memory_mb,
            network=task.resources.network and allow_network,
            workdir=workdir,
            env=tuple(sorted(env.items())),
        )
        c = pool.start(spec)
        if image == base and copy_only(steps):
            try:
                _run_steps(task, steps, c, task.config.environment.build_timeout_sec)  # type: ignore[arg-type]
            except BaseException:
                pool.release(c)
                raise
        return c
    except (SandboxError, HarborTaskError) as e:
        raise InfraFailure("container_start", f"task {task.name}: {e}") from e
