"""`agent-rl harbor validate|oracle|generate|base-image`: check, score and make Harbor task suites.

validate DIR        every task's task.toml, files and Dockerfile (file:line errors; --build builds the images)
oracle DIR          each task with its solution (must score 1) and without (must score 0), in containers
generate OUT -n N   the generated suite of small Python bug fixes (envs/harbor/generate.py)
base-image          build the offline base image the task images are built on
The Docker engine is DOCKER_HOST's, or --docker-host.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from envs.harbor.task import HarborTaskError, load_task, load_tasks, task_dirs


def _pool(args: argparse.Namespace, warm: int = 0):
    from sandboxes.task_containers import ContainerPool

    return ContainerPool(args.docker_host, run=f"harbor-cli-{int(time.time())}", pool="harbor", warm=warm)


def _validate(args: argparse.Namespace) -> int:
    from envs.harbor.image import recipe

    tasks, errors, warnings = [], [], []
    for d in task_dirs(args.dir):
        try:
            t = load_task(d)
            r = recipe(t)
            warnings += r.warnings if r else []
            tasks.append(t)
        except HarborTaskError as e:
            errors.append(str(e))
    if args.build and not errors:
        from envs.harbor.image import ensure_base, task_image

        pool = _pool(args)
        try:
            ensure_base(pool)
            for t in tasks:
                try:
                    task_image(t, pool)
                except HarborTaskError as e:
                    errors.append(str(e))
        finally:
            pool.close()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if errors:
        raise HarborTaskError("\n".join(errors))
    print(f"{args.dir}: {len(tasks)} task(s) valid" + (", images built" if args.build else ""))
    return 0


def _oracle(args: argparse.Namespace) -> int:
    from envs.harbor.image import ensure_base
    from envs.harbor.oracle import oracle

    tasks = load_tasks(args.dir)
    pool = _pool(args, warm=1)
    failed = 0
    try:
        ensure_base(pool)
        for i, t in enumerate(tasks, 1):
            result = oracle(t, pool)
            failed += not result.ok
            print(f"[{i}/{len(tasks)}] {result.line()}", flush=True)
    finally:
        pool.close()
    print(f"{len(tasks) - failed} of {len(tasks)} task(s) score 1 with their solution and 0 without")
    return 1 if failed else 0


def _generate(args: argparse.Namespace) -> int:
    from envs.harbor.generate import generate

    dirs = generate(args.out, args.n, seed=args.seed)
    print(f"{args.out}: {len(dirs)} task(s) written")
    return 0


def _base(args: argparse.Namespace) -> int:
    from envs.harbor.image import BASE_IMAGE, ensure_base

    pool = _pool(args)
    try:
        print(ensure_base(pool, rebuild=True, extra_packages=tuple(args.package)) or BASE_IMAGE)
    finally:
        pool.close()
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="agent-rl harbor", description=__doc__.splitlines()[0])
    p.add_argument("--docker-host", default=None, help="the Docker engine (default: DOCKER_HOST)")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="check every task (file:line errors)")
    v.add_argument("dir", type=Path)
    v.add_argument(
        "--build", action="store_true", help="also build each task's image (needs a Docker engine)"
    )
    v.set_defaults(func=_validate)
    o = sub.add_parser("oracle", help="score each task with and without its solution")
    o.add_argument("dir", type=Path)
    o.set_defaults(func=_oracle)
    g = sub.add_parser("generate", help="write the generated suite of small Python bug fixes")
    g.add_argument("out", type=Path)
    g.add_argument("-n", type=int, default=300)
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=_generate)
    b = sub.add_parser("base-image", help="(re)build the offline base image")
    b.add_argument(
        "--package", action="append", default=[], help="a package of this Python to add (repeatable)"
    )
    b.set_defaults(func=_base)
    args = p.parse_args(argv)
    return args.func(args)
