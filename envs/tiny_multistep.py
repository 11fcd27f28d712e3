"""tiny_multistep: every problem needs 2-3 tool calls in a row, and the warm start may stop at each one.

The staleness study's harder task (issue 38). tiny_arith is learned in ~10 RL steps and saturates at ~0.76,
because its whole skill is one decision (the first token: call the tool or guess). Here a problem is a sum of
2 or 3 products, "What is 48 * 37 + 21 * 41 + 30 * 52?", which the teacher solves one term per turn, carrying
the running sum it read from the previous tool output (tiny_chain's trace shape):

    ```python
    print(48 * 37)                  -> 1776
    ```
    ```python
    print(1776 + 21 * 41)           -> 2637
    ```
    ...
    \\boxed{4197}

and at every turn boundary (before the first call and after each output) the teacher goes on with the tool with
probability `continue_rate`, else stops and boxes a wrong guess. A warm start trained on those traces solves a
problem only if it takes every one of n decisions the right way AND copies every running sum (four or five
digits) and every term without a slip, so it starts low (about continue_rate^n times its copy accuracy), and RL
has several decisions and several copies to improve, each credited only through the final 0/1 reward: a
longer climb than one first-token decision. The reward is tiny_arith's exact integer match; nothing rewards
the number of turns, and a model may put the whole sum in one print if RL finds that. Operands are two-digit
(products a few-million-parameter model cannot do in its head) to keep episodes, and so the RL step, short.
"""

from __future__ import annotations

import random

from envs.tiny_arith import Segment, Trace, guess
from envs.types import Task

TERMS = (2, 3)  # products per problem: 2 or 3 tool calls


def _term(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a} * {b}", a * b


def make_tasks(n: int, seed: int) -> tuple[Task, ...]:
    """n seeded tasks, each a sum of 2 or 3 products (equally likely); different seeds give disjoint problems."""
    rng = random.Random(f"tiny_multistep/{seed}")
    out = []
    for i in range(n):
        terms = [_term(rng) for _ in range(rng.choice(TERMS))]
        out.append(
            Task(
                id=f"tiny_multistep-{seed}-{i}",
                problem=f"What is {' + '.join(t for t, _ in terms)}?",
                answer=str(sum(v for _, v in terms)),
                source="tiny_multistep",
            )
        )
    return tuple(out)


def terms_of(task: Task) -> list[str]:
    """The products of a problem, in order ("482 * 37", ...)."""
    return task.problem.removeprefix("What is ").removesuffix("?").split(" + ")


def teacher_trace(task: Task, rng: random.Random, continue_rate: float) -> Trace:
    """One term per turn; before each call the teacher goes on with probability continue_rate, else it stops and
    boxes a guess (wrong by construction). used_tool is True only for a complete, correct trace."""
    prompt = task.problem + "\n"
    segments: list[Segment] = []
    running: int | None = None
    for term in terms_of(task):
        if rng.random() >= continue_rate:
            segments.append(Segment("model", f"\\boxed{{{guess(int(task.answer), rng)}}}"))
            return Trace(task, prompt, tuple(segments), used_tool=False)
        a, b = (int(x) for x in term.split(" * "))
        code = term if running is None else f"{running} + {term}"
        running = a * b + (running or 0)
        segments += [
            Segment("model", f"```python\nprint({code})\n```\n"),
            Segment("observation", str(running)),
        ]
    segments.append(Segment("model", f"\\boxed{{{task.answer}}}"))
    return Trace(task, prompt, tuple(segments), used_tool=True)


def teacher_traces(n: int, seed: int = 0, continue_rate: float = 0.5) -> list[Trace]:
    """n teacher traces over tasks drawn with `seed` (use a seed the eval split does not use)."""
    rng = random.Random(f"teacher-multistep/{seed}")
    return [teacher_trace(t, rng, continue_rate) for t in make_tasks(n, seed)]


def corpus(n: int = 2000, seed: int = 12345) -> list[str]:
    """Tokenizer training texts: complete traces and traces that stop early."""
    return [t.render() for t in teacher_traces(n, seed, continue_rate=0.7)]
