"""A tiny verifiers taskset: arithmetic questions, reward 1 when the reply's last number is the answer.

Written with verifiers' v1 API only (it knows nothing of agent-rl): `vf.TaskData` rows, a `vf.Task` with a
`@vf.reward`, a `vf.Taskset` whose `load()` yields them. Any verifiers harness plays it; agent-rl's
`type: verifiers` env (examples/verifiers_arith/env.yaml) trains a model on it through the recording gateway.
"""

import random
import re

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str = ""


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply or "")
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    seed: int = 0
    easy_fraction: float = 0.5
    """Share of one-digit sums; the rest are products of a two-digit and a one-digit number."""


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for i in range(self.config.num_tasks):
            if rng.random() < self.config.easy_fraction:
                a, b = rng.randint(0, 9), rng.randint(0, 9)
                text, value = f"{a} + {b}", a + b
            else:
                a, b = rng.randint(10, 99), rng.randint(2, 9)
                text, value = f"{a} * {b}", a * b
            data = ArithData(id=f"a{i}", prompt=f"What is {text}? Answer with the number.", answer=str(value))
            yield ArithTask(data, self.config.task)


__all__ = ["ArithTaskset"]
