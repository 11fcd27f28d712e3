"""tiny_chain: tiny_arith with a long tail of episode lengths, for measuring asynchrony.

Most problems are tiny_arith's: a one-digit sum answered directly (1 turn) or a five-digit
product solved with one `print(...)` (2 turns). A minority are chains of n = 2..6 products,
"What is 482 * 37 + 215 * 41 + 308 * 52?", which the teacher solves one term per turn, carrying
the running sum it read from the previous tool output:

    ```python
    print(482 * 37)                 -> 17834
    ```
    ```python
    print(17834 + 215 * 41)         -> 26649
    ```
    ...
    \\boxed{42665}

so an episode has n + 1 turns and about 30 n sampled tokens, with n drawn from a heavy tail
(`CHAIN_LENGTHS`). This is the shape that makes synchronous RL wait: a step's batch finishes
only when its longest chain does, while the engine decodes a batch of one or two. The reward
is the same 0/1 exact match as tiny_arith (nothing rewards length), and a model may solve a
chain in fewer turns if it can.
"""

from __future__ import annotations

import random

from envs.tiny_arith import Segment, Trace, guess, make_problem
from envs.types import Task

# Chain length n (number of products) for the chain share of problems: a long tail.
CHAIN_LENGTHS = (2, 2, 2, 2, 3, 3, 3, 4, 4, 5, 6)


def _term(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return f"{a} * {b}", a * b


def make_tasks(
    n: int, seed: int, easy_fraction: float = 0.25, chain_fraction: float = 0.2
) -> tuple[Task, ...]:
    """n seeded tasks: chains with probability chain_fraction, else tiny_arith problems."""
    rng = random.Random(f"tiny_chain/{seed}")
    out = []
    for i in range(n):
        if rng.random() < chain_fraction:
            terms = [_term(rng) for _ in range(rng.choice(CHAIN_LENGTHS))]
            expr, value = " + ".join(t for t, _ in terms), sum(v for _, v in terms)
        else:
            expr, value = make_problem(rng, easy_fraction / max(1e-9, 1 - chain_fraction))
        out.append(
            Task(
                id=f"tiny_chain-{seed}-{i}",
                problem=f"What is {expr}?",
                answer=str(value),
                source="tiny_chain",
            )
        )
    return tuple(out)


def chain_terms(task: Task) -> list[str] | None:
    """The products of a chain problem, or None for a tiny_arith problem."""
    expr = task.problem.removeprefix("What is ").removesuffix("?")
    parts = expr.split(" + ")
    if len(parts) < 2 or not all("*" in p for p in parts):
        return None
    return parts


def teacher_trace(task: Task, rng: random.Random, tool_rate: float) -> Trace:
    """One term per turn for chains (or, with probability 1 - tool_rate, a tool-free guess); tiny_arith's
    teacher for the rest."""
    from envs.tiny_arith import teacher_trace as single

    terms = chain_terms(task)
    if terms is None:
        return single(task, rng, tool_rate)
    prompt = task.problem + "\n"
    if rng.random() >= tool_rate:
        return Trace(task, prompt, (Segment("model", f"\\boxed{{{guess(int(task.answer), rng)}}}"),), False)
    segments, running = [], None
    for term in terms:
        a, b = (int(x) for x in term.split(" * "))
        code = term if running is None else f"{running} + {term}"
        running = a * b + (running or 0)
        segments += [
            Segment("model", f"```python\nprint({code})\n```\n"),
            Segment("observation", str(running)),
        ]
    segments.append(Segment("model", f"\\boxed{{{task.answer}}}"))
    return Trace(task, prompt, tuple(segments), used_tool=True)


def teacher_traces(
    n: int, seed: int = 0, tool_rate: float = 0.3, easy_fraction: float = 0.25, chain_fraction: float = 0.2
) -> list[Trace]:
    rng = random.Random(f"teacher-chain/{seed}")
    return [teacher_trace(t, rng, tool_rate) for t in make_tasks(n, seed, easy_fraction, chain_fraction)]


def corpus(n: int = 2000, seed: int = 12345) -> list[str]:
    """Tokenizer training texts: rendered traces with and without the tool, chains included."""
    return [t.render() for t in teacher_traces(n, seed, tool_rate=0.5, chain_fraction=0.3)]
