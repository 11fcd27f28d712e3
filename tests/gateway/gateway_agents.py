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
