"""The oracle run: each task scored with its reference solution (must be 1) and without it (must be 0).

A task whose solution does not score 1 cannot teach anything, and one that scores 1 untouched rewards
doing nothing; both are caught before a run trains on them (`agent-rl harbor oracle DIR`).
"""

from __future__ import annotations

from dataclasses import dataclass

from envs.harbor.image import start_container
from envs.harbor.task import HarborTask
from envs.harbor.verify import run_verifier
from envs.types import InfraFailure
from sandboxes.task_containers import ContainerPool


@dataclass(frozen=True)
class OracleResult:
    task: str
    with_solution: float | None
    without_solution: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.with_solution == 1.0 and self.without_solution == 0.0

    def line(self) -> str:
        if self.error:
            return f"FAIL {self.task}: {self.error}"
        verdict = "ok  " if self.ok else "FAIL"
        return (
            f"{verdict} {self.task}: with solution {self.with_solution:g}, without {self.without_solution:g}"
        )


def _score(task: HarborTask, pool: ContainerPool, solve: bool) -> float:
    c = start_container(task, pool)
    try:
        if solve:
            assert task.solution is not None
            c.put_dir(task.solution.parent, "/solution")
            res = c.exec(
                "bash /solution/solve.sh",
                timeout_s=task.agent_timeout_s or 600.0,
                env=task.config.solution.env,
            )
            if res.timed_out:
                raise InfraFailure(
                    "harness_timeout", f"solution/solve.sh ran past {task.agent_timeout_s or 600:g} s"
                )
        return run_verifier(task, c)
    finally:
        pool.release(c)


def oracle(task: HarborTask, pool: ContainerPool) -> OracleResult:
    if task.solution is None:
        return OracleResult(
            task.name, None, None, f"{task.path / 'solution' / 'solve.sh'}: missing; no oracle to run"
        )
    try:
        return OracleResult(task.name, _score(task, pool, True), _score(task, pool, False))
    except InfraFailure as e:
        return OracleResult(task.name, None, None, str(e))
