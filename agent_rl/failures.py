"""Infrastructure failures at the rollout boundary: what failed (a cause), whether to try again, how long to wait.

An episode's infrastructure can fail in ways that say nothing about the policy: a container that does not
start, a sandbox killed mid-episode, a verifier that runs past its limit or writes no reward, a harness
that crashes, an engine that fails after its retries. None of them may become reward 0 (a "fake zero"
biases the group's baseline): `rollout.episodes.EpisodeRunner` retries the episode from the start up to
`rollout.infra_retries` times with backoff and, if it still fails, marks it `FinishReason.INFRA_FAILED` with
its `InfraCause`; the buffer then leaves it out of its group (`types.Group.of`).

Envs raise `envs.types.InfraFailure(cause, message)` where they know the cause (a Harbor task's container,
its verifier); everything else is mapped here, once, so every env type gets the same rule.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from agent_rl.config import RolloutConfig
from agent_rl.errors import UserError
from agent_rl.types import INFRA_CAUSES, InfraCause, Trajectory
from envs.types import InfraFailure
from sandboxes.api import SandboxError

# sandbox and container messages that say the sandbox never came up (sandboxes/: worker.py "did not start",
# dockerexec.py "cannot start a container", pool.py "cannot start sandbox workers", local.py "cannot run")
_START_FAILED = re.compile(
    r"did not start|cannot start|failed to start|cannot run|not found|no such image", re.I
)


class EpisodeFailure(RuntimeError):
    """An episode's infrastructure failed: `cause` says what; `retry` False when trying again cannot help."""

    def __init__(self, cause: InfraCause, message: str, *, retry: bool = True) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause, self.message, self.retry = cause, message, retry


def classify(error: BaseException, where: str) -> EpisodeFailure:
    """The infrastructure failure that `error`, raised by `where` (an env's step, reset or agent), stands for."""
    if isinstance(error, EpisodeFailure):
        return error
    if isinstance(error, InfraFailure):
        cause = error.cause if error.cause in INFRA_CAUSES else "other"
        return EpisodeFailure(cause, f"{where}: {error.message}")  # type: ignore[arg-type]
    if isinstance(error, SandboxError):
        first = str(error).splitlines()[0] if str(error) else repr(error)
        cause = "container_start" if _START_FAILED.search(first) else "sandbox_killed"
        return EpisodeFailure(cause, f"{where}: {first}")
    if "rewards must be finite" in str(error):  # envs/env.py, envs/agent.py: a NaN or infinite reward
        return EpisodeFailure("bad_reward", f"{where}: {error}")
    return EpisodeFailure("other", f"{where}: {error!r}")


def check_reward(reward: object, where: str) -> float:
    """The reward an env reported at the end of an episode, or the failure it stands for: none at all is a
    verifier that wrote nothing, anything but a finite number a verifier that wrote garbage (never 0)."""
    if reward is None:
        raise EpisodeFailure("no_reward", f"{where}: the episode ended and its verifier gave no reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or reward != reward:
        raise EpisodeFailure(
            "bad_reward", f"{where}: the verifier gave reward {reward!r}; need a finite number"
        )
    if reward in (float("inf"), float("-inf")):
        raise EpisodeFailure(
            "bad_reward", f"{where}: the verifier gave reward {reward!r}; need a finite number"
        )
    return float(reward)


def backoff_s(cfg: RolloutConfig, attempt: int) -> float:
    """Wait before retry `attempt` (1 = the first retry): infra_backoff_s doubling, at most infra_backoff_max_s."""
    return min(cfg.infra_backoff_s * 2 ** (attempt - 1), cfg.infra_backoff_max_s)


class InfraFailureRate(UserError):
    """A step's batch is mostly infrastructure failures: the run stops instead of training on what is left."""


def batch_failure_share(kept: int, failed: Sequence[Trajectory], max_fraction: float) -> float:
    """The share of a batch's episodes that failed in the infrastructure: `failed` (left out of the batch's groups,
    and the members of groups dropped because all failed) over them plus the `kept` ones. Raises
    InfraFailureRate, one line naming the causes, when it is over `max_fraction`."""
    total = kept + len(failed)
    share = len(failed) / total if total else 0.0
    if share > max_fraction:
        causes = Counter(t.infra_cause or "other" for t in failed)
        named = ", ".join(f"{c} {n}" for c, n in causes.most_common())
        raise InfraFailureRate(
            f"{len(failed)} of the {total} episodes of a batch failed in the infrastructure ({named}), "
            f"{share:.0%} > buffer.max_infra_failed_fraction={max_fraction:g}: not training on it. The log's "
            "'infra_failed' warnings say what failed; fix it (docs/reliability.md) or raise the fraction"
        )
    return share
