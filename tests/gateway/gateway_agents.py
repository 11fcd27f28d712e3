"""Agents for the gateway tests (imported by the env YAMLs in data/)."""

from __future__ import annotations


async def rewrite_history(task, client, sandbox) -> str | None:
    """Asks once, then replaces the conversation with a summary of it: the second prompt extends nothing."""
    first = await client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": task.problem}], max_tokens=8
    )
    said = first.choices[0].message.content or ""
    second = await client.chat.completions.create(
        model="p",
        messages=[{"role": "user", "content": f"Earlier: {said}"}, {"role": "user", "content": "Answer."}],
        max_tokens=8,
    )
    return second.choices[0].message.content


def half(text: str, task) -> float:
    return 0.5


async def give_up_after_one_reply(task, client, sandbox) -> str | None:
    """Raises after its first reply, as frameworks do on a reply cut by max_tokens (the Agents SDK's Responses
    model raises on `incomplete`)."""
    r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": task.problem}])
    raise RuntimeError(f"cannot use a reply that finished with {r.choices[0].finish_reason!r}")
