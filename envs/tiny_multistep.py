"""tiny_multistep: every problem needs 2-3 tool calls in a row, and the warm start may stop at each one.

The staleness study's harder task (issue 38). tiny_arith is learned in ~10 RL steps and saturates at ~0.76,
because its whole skill is one decision (the first token: call the tool or guess). Here a problem applies one
affine step n = 2 or 3 times, "Start at 47 and apply x * 7 + 13, 3 times.", which the teacher solves one
application per turn, carrying the value it read from the previous tool output:

    ```python
    print(47 * 7 + 13)              -> 342
    ```
    ```python
    print(342 * 7 + 13)             -> 2407
    ```
    ```python
    print(2407 * 7 + 13)            -> 16862
    ```
    \\boxed{16862}

At every turn boundary where a call is still due (before the first, after each output but the n-th) the teacher
goes on with the tool with probability `continue_rate`, else stops and boxes a wrong guess. A warm start trained
on those traces solves a problem only if it takes all n go-on decisions, stops after the n-th output (it has to
count against the n in the prompt) and copies every value without a slip, so it starts low (about
continue_rate^n), and RL has several decisions to learn and copies to sharpen, each credited only through the
final 0/1 reward: a longer climb than one first-token decision. The reward is tiny_arith's exact integer match;
nothing rewards the number of turns.

Why this shape: every copy is unambiguous for a small model, the value from the output just above and the step's
two constants, which appear once in the prompt. A first version (sums of 2-3 distinct products, one per call)
asked the model to find the i-th product in the prompt; after SFT the 2.1M-parameter model picked the wrong one
and its warm start scored 0.00, where RL has nothing to learn from.
"""

from __future__ import annotations

import random

from envs.tiny_arith import Segment, Trace, guess
from envs.types import Task

TIMES = (2, 3)  # applications per problem: 2 or 3 tool calls


def step_of(a: int, b: int) -> str:
    return f"x * {a} + {b}"


def make_tasks(n: int, seed: int) -> tuple[Task, ...]:
    """n seeded tasks: start 10-99, x * a + b with a in 2-9 and b in 10-99, applied 2 or 3 times (equally
    likely); answers have 3-5 digits. Different seeds give (practically) disjoint problems."""
    rng = random.Random(f"tiny_multistep/{seed}")
    out = []
    for i in range(n):
        x, a, b, times = rng.randint(10, 99), rng.randint(2, 9), rng.randint(10, 99), rng.choice(TIMES)
        value = x
        for _ in range(times):
            value = value * a + b
        out.append(
            Task(
                id=f"tiny_multistep-{seed}-{i}",
                problem=f"Start at {x} and apply {step_of(a, b)}, {times} times.",
                answer=str(value),
                source="tiny_multistep",
            )
        )
    return tuple(out)


def parse(task: Task) -> tuple[int, int, int, int]:
    """(start, a, b, times) of a problem."""
    words = task.problem.removeprefix("Start at ").replace(",", "").split()
    # "47 and apply x * 7 + 13 3 times."
    return int(words[0]), int(words[5]), int(words[7]), int(words[8])


def teacher_trace(task: Task, rng: random.Random, continue_rate: float) -> Trace:
    """One application per turn; before each call the teacher goes on with probability continue_rate, else it
    stops and boxes a guess (wrong by construction). used_tool is True only for a complete, correct trace."""
    x, a, b, times = parse(task)
    prompt = task.problem + "\n"
    segments: list[Segment] = []
    for _ in range(times):
        if rng.random() >= continue_rate:
            segments.append(Segment("model", f"\\boxed{{{guess(int(task.answer), rng)}}}"))
            return Trace(task, prompt, tuple(segments), used_tool=False)
        segments += [
            Segment("model", f"```python\nprint({x} * {a} + {b})\n```\n"),
            Segment("observation", str(x * a + b)),
        ]
        x = x * a + b
    segments.append(Segment("model", f"\\boxed{{{task.answer}}}"))
    return Trace(task, prompt, tuple(segments), used_tool=True)


def teacher_traces(n: int, seed: int = 0, continue_rate: float = 0.5) -> list[Trace]:
    """n teacher traces over tasks drawn with `seed` (use a seed the eval split does not use)."""
    rng = random.Random(f"teacher-multistep/{seed}")
    return [teacher_trace(t, rng, continue_rate) for t in make_tasks(n, seed)]


def corpus(n: int = 2000, seed: int = 12345) -> list[str]:
    """Tokenizer training texts: complete traces and traces that stop early."""
    return [t.render() for t in teacher_traces(n, seed, continue_rate=0.7)]
