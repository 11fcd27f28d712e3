"""The verifier's reward: copy tests/ to /tests, run test.sh under its time limit, read /logs/verifier.

Harbor's contract: test.sh writes /logs/verifier/reward.txt (one number) or reward.json (an object of
named numbers; the one named "reward" is the episode's reward, or the only one there is); reward.json wins
when both exist. A verifier that times out, writes no reward, or writes one that is not a finite number is
an infrastructure failure (InfraFailure: the episode is retried, never scored 0): the task is broken or the
container died, and neither says anything about the policy.
"""

from __future__ import annotations

import json
import math

from envs.harbor.task import HarborTask
from envs.types import InfraFailure
from sandboxes.api import SandboxError
from sandboxes.task_containers import TaskContainer

LOGS = "/logs/verifier"


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InfraFailure("bad_reward", f"{where}: reward {value!r} is not a number")
    if not math.isfinite(value):
        raise InfraFailure("bad_reward", f"{where}: reward {value} is not finite")
    return float(value)


def parse_reward(task: str, reward_json: bytes | None, reward_txt: bytes | None) -> float:
    """The reward from the verifier's files (reward.json first); InfraFailure when there is none or it is bad."""
    if reward_json is not None:
        where = f"task {task}: {LOGS}/reward.json"
        try:
            value = json.loads(reward_json.decode(errors="replace"))
        except json.JSONDecodeError as e:
            raise InfraFailure("bad_reward", f"{where}: not JSON ({e})") from None
        if isinstance(value, dict):
            if "reward" in value:
                return _number(value["reward"], where)
            if len(value) == 1:
                return _number(next(iter(value.values())), where)
            raise InfraFailure(
                "bad_reward", f"{where}: several rewards {sorted(value)} and none named 'reward'"
            )
        return _number(value, where)
    if reward_txt is not None:
        where = f"task {task}: {LOGS}/reward.txt"
        text = reward_txt.decode(errors="replace").strip()
        try:
            return _number(float(text), where)
        except ValueError:
            raise InfraFailure("bad_reward", f"{where}: {text[:60]!r} is not a number") from None
    raise InfraFailure(
        "no_reward", f"task {task}: tests/test.sh wrote neither {LOGS}/reward.txt nor reward.json"
    )


def run_verifier(task: HarborTask, container: TaskContainer) -> float:
    """Run the task's tests in the episode's container and return its reward."""
    try:
        container.exec(f"rm -rf /tests {LOGS} && mkdir -p {LOGS}", timeout_s=30, user="0")
        container.put_dir(task.tests_dir, "/tests")
        res = container.exec(
            f"bash /tests/test.sh > {LOGS}/test-stdout.txt 2>&1",
            timeout_s=task.verifier_timeout_s,
            env=task.config.verifier.env,
            user=str(task.config.verifier.user) if task.config.verifier.user is not None else None,
        )
        if res.timed_out:
            raise InfraFailure(
                "verifier_timeout",
                f"task {task.name}: tests/test.sh ran past timeout_sec={task.verifier_timeout_s:g}",
            )
        logs = container.read_files(LOGS)
        return parse_reward(task.name, logs.get("reward.json"), logs.get("reward.txt"))
    except SandboxError as e:
        raise InfraFailure(
            "sandbox_killed", f"task {task.name}: the container failed during the verifier: {e}"
        ) from e
