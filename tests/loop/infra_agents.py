"""Agents for tests/loop/test_infra_failures.py (imported by data/infra_agent.yaml)."""

from __future__ import annotations

ATTEMPTS: dict[
    str, int
] = {}  # session id -> episodes started with it (a retry reuses the member's session id)


async def crash_member_1(task, client, sandbox) -> float:
    """The episode of group member 1 (session `...-1`) raises before its first call, as a harness that crashes
    on start does (one that raises after a reply its token budget cut is the model's doing: finish `length`).
    The others make one chat call and score by the length of their reply."""
    sid = str(client.base_url).rstrip("/").split("/sessions/")[1].split("/")[0]
    ATTEMPTS[sid] = ATTEMPTS.get(sid, 0) + 1
    if sid.endswith("-1"):
        raise RuntimeError("the harness crashed (segfault in its tool runner)")
    r = await client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": task.problem}], max_tokens=4
    )
    return len(r.choices[0].message.content or "") / 16


def nan_reward(text: str, task) -> float:
    """A reward function whose verifier produced garbage (data/nan_reward.yaml)."""
    return float("nan")
