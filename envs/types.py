"""What an environment hands the rollout side: tasks, and per-step results in token ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Finish = Literal["answer", "void", "max_turns", "length"]
"""Same strings as agent_rl.types.FinishReason (envs may not import agent_rl)."""


@dataclass(frozen=True)
class Task:
    """One problem. `numbers` is set only for Countdown (the numbers to use; `answer` is the target)."""

    id: str
    problem: str
    answer: str
    numbers: tuple[int, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class StepInfo:
    finish: Finish | None = None
    masked: bool = False
    """Void turn: the trajectory gets loss mask 0 but keeps its reward in the group statistics."""
    code_ran: bool = False
    exit_code: int | None = None
    timed_out: bool = False
    tool_seconds: float = 0.0
    answer: str | None = None
    """The extracted final answer (last \\boxed{}), when the episode ended."""
    reward_timed_out: bool = False
    """The math-verify worker was killed past its time limit (reward 0)."""


@dataclass(frozen=True)
class StepResult:
    observation_ids: list[int]
    reward: float | None
    done: bool
    info: StepInfo = field(default_factory=StepInfo)


class EnvError(RuntimeError):
    """Misuse of an Env (step after done, unknown split, missing data)."""


class InfraFailure(EnvError):
    """The infrastructure failed, not the policy: the episode is retried, then left out of its group (never scored 0)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause  # one of INFRA_CAUSES
        self.message = message


INFRA_CAUSES = (
    "container_start",
    "sandbox_killed",
    "verifier_timeout",
    "no_reward",
    "bad_reward",
    "harness_crash",
    "harness_timeout",
    "engine",
    "other",
)
