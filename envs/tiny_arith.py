"""tiny_arith: the task the CPU recipe learns, and the scripted teacher that writes its warm-start traces.

Problems are multi-digit products ("What is 482 * 37 - 129?") that a few-million-
parameter model cannot do in its head but can solve by copying the expression into a
one-line `print(...)`, mixed with one-digit sums it can learn to answer directly. The
teacher writes short, fixed-format SimpleTIR traces (at most about 60 tokens with a
digit-per-token tokenizer):

    What is 482 * 37 - 129?               <- prompt (plain text, no chat template)
    ```python                             <- model
    print(482 * 37 - 129)
    ```
    ```output                             <- environment (the sandbox's stdout)
    17705
    ```
    \\boxed{17705}                         <- model, then EOS

With probability 1 - tool_rate it skips the tool on a hard problem and writes a guess
(right leading digits, random tail), so the warm-start model uses the tool only part
of the time: the room RL has to improve. The first response token (a fence or
"\\boxed") is the whole decision.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from envs.types import Task

_OPS = (
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c),
)
# Fixed shapes (3-digit * 2-digit +/- 3-digit, five-digit answer): every digit the model copies,
# into print(...) and from the tool output into \boxed{}, sits at the same token distance from
# its source, a copy a few-million-parameter model learns in a few hundred SFT steps.
ANSWER_DIGITS = 5


def make_problem(rng: random.Random, easy_fraction: float) -> tuple[str, int]:
    """(expression, value): a one-digit sum with probability easy_fraction, else a five-digit product."""
    if rng.random() < easy_fraction:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"{a} + {b}", a + b
    while True:
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)
        template, value = rng.choice(_OPS)
        if len(str(value(a, b, c))) == ANSWER_DIGITS:
            return template.format(a=a, b=b, c=c), value(a, b, c)


def make_tasks(n: int, seed: int, easy_fraction: float = 0.25) -> tuple[Task, ...]:
    """n seeded tasks; different seeds give (practically) disjoint hard problems."""
    rng = random.Random(f"tiny_arith/{seed}")
    out = []
    for i in range(n):
        expr, value = make_problem(rng, easy_fraction)
        out.append(
            Task(
                id=f"tiny_arith-{seed}-{i}",
                problem=f"What is {expr}?",
                answer=str(value),
                source="tiny_arith",
            )
        )
    return tuple(out)


def is_easy(task: Task) -> bool:
    return "*" not in task.problem


def expression(task: Task) -> str:
    return task.problem.removeprefix("What is ").removesuffix("?")


@dataclass(frozen=True)
class Segment:
    """A piece of a trace: text the model writes, or raw tool output the environment wraps in its template."""

    kind: Literal["model", "observation"]
    text: str


@dataclass(frozen=True)
class Trace:
    task: Task
    prompt: str
    segments: tuple[Segment, ...]
    used_tool: bool

    def render(self, observation_template: str = "```output\n{output}\n```\n") -> str:
        """The whole episode as text (tokenizer corpus, reading); training uses envs.tiny_arith.encode_trace."""
        parts = [self.prompt]
        for s in self.segments:
            parts.append(s.text if s.kind == "model" else observation_template.replace("{output}", s.text))
        return "".join(parts)

    def sft_row(self, train_first_token: bool = True) -> dict[str, Any]:
        """The trace as an `agent-rl sft` row: model pieces trained, tool output as context only.
        train_first_token=False makes the opening fence context too (a drill: the row teaches what follows
        the decision to use the tool, not the decision)."""
        fence = "```"  # the tool branch's first token
        pieces: list[dict[str, Any]] = []
        for s in self.segments:
            if s.kind == "observation":
                pieces.append({"text": "```output\n" + s.text + "\n```\n", "train": False})
            elif not pieces and not train_first_token and s.text.startswith(fence):
                pieces += [{"text": fence, "train": False}, {"text": s.text[len(fence) :], "train": True}]
            else:
                pieces.append({"text": s.text, "train": True})
        return {"prompt": self.prompt, "response": pieces}


def guess(value: int, rng: random.Random) -> int:
    """A plausible wrong answer: the leading two digits kept, the rest random."""
    s = str(abs(value))
    if len(s) <= 2:
        return value + rng.choice((-1, 1))
    out = int(s[:2] + "".join(rng.choice("0123456789") for _ in s[2:]))
    if out == abs(value):
        out += 1
    return -out if value < 0 else out


def teacher_trace(task: Task, rng: random.Random, tool_rate: float) -> Trace:
    """A correct SimpleTIR trace, or (hard problems, probability 1 - tool_rate) a tool-free guess."""
    prompt = task.problem + "\n"
    if is_easy(task):
        return Trace(task, prompt, (Segment("model", f"\\boxed{{{task.answer}}}"),), used_tool=False)
    if rng.random() >= tool_rate:
        wrong = guess(int(task.answer), rng)
        return Trace(task, prompt, (Segment("model", f"\\boxed{{{wrong}}}"),), used_tool=False)
    code = f"```python\nprint({expression(task)})\n```\n"
    segments = (
        Segment("model", code),
        Segment("observation", task.answer),
        Segment("model", f"\\boxed{{{task.answer}}}"),
    )
    return Trace(task, prompt, segments, used_tool=True)


def teacher_traces(n: int, seed: int = 0, tool_rate: float = 0.3, easy_fraction: float = 0.25) -> list[Trace]:
    """n teacher traces over tasks drawn with `seed` (use a seed the eval split does not use)."""
    rng = random.Random(f"teacher/{seed}")
    return [teacher_trace(t, rng, tool_rate) for t in make_tasks(n, seed, easy_fraction)]


def corpus(n: int = 2000, seed: int = 12345) -> list[str]:
    """Texts to train the tiny tokenizer on: rendered traces with and without the tool."""
    return [t.render() for t in teacher_traces(n, seed, tool_rate=0.5)]


def encode_trace(trace: Trace, tokenizer: Any, env: Any) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) exactly as the env builds the episode: the env's prompt ids, each model segment
    tokenized on its own (EOS after the last), each observation through the env's formatter; mask 1 on model
    tokens. `env`: an Env of the spec the model will be trained in, made for `tokenizer`
    (`envs.make(envs.load("envs/tiny_arith.yaml"), tokenizer)`)."""
    ids = env.reset(trace.task)
    mask = [0] * len(ids)
    for i, s in enumerate(trace.segments):
        if s.kind == "model":
            seg = tokenizer.encode(s.text, add_special_tokens=False)
            if i == len(trace.segments) - 1:
                seg = seg + [tokenizer.eos_token_id]
            mask += [1] * len(seg)
        else:
            seg = env.encode_observation(s.text)
            mask += [0] * len(seg)
        ids += seg
    return ids, mask
