"""The TRL cell of benchmarks/slow_tools.py: TRL's GRPOTrainer on the swe_tiny Harbor suite, one container per
rollout, in TRL's own venv (`bash scripts/setup_trl.sh`).

    .venv-trl/bin/python benchmarks/trl_swe.py train --model DIR --env ENV.yaml --out DIR --steps N --seed S ...
    .venv-trl/bin/python benchmarks/trl_swe.py score --model DIR --env ENV.yaml --out FILE --limit N CK_DIR ...

What TRL 1.16 offers for this (trl/trainer/grpo_trainer.py, `GRPOTrainer.__init__(environment_factory=...)` and
`_generate_and_score_completions`): a zero-argument factory; one instance per rollout (pooled, reused across
batches); each rollout's `reset(**row)` before generation; the instance's public methods are its rollout's tools
(`_tool_call_loop` calls them, an async method is awaited on the trainer's event loop); reward functions get the
instances as `environments=`, so a reward can read what the tool calls did; a reward of None marks the rollout
unscorable (left out of its group's baseline, advantage 0). trl.experimental.harbor (HarborEnv, HarborBashEnv,
HarborSpec) is TRL's own Harbor binding on that hook, but it drives the `harbor` package (Python >= 3.12; this
machine has 3.11), so the env here is the same shape over envs/harbor's containers instead:

- `SweTinyEnv.reset(task_id)`: the rollout's task (the container starts at its first command, as ours);
- `SweTinyEnv.bash(command)` (async): the command in the rollout's container, through envs/harbor's pool and
  threads (`loop_pool`: the same ContainerPool, warm containers, parallel-commands bound and time limits as the
  built-in agent), the output shown as the built-in agent shows it (exit status, time-out note, cut in the middle
  past the observation budget);
- `verdicts(environments)` (the reward): every rollout's tests/test.sh in its own container (run_verifier), all at
  once; an infrastructure failure is None (TRL's unscorable), not 0.

What TRL does with it that ours does not: `_tool_call_loop` runs the batch's rollouts' tool calls one rollout at a
time (`run_coroutine_threadsafe(...).result()` per rollout), generation is transformers `generate` on padded
batches turn by turn, and nothing overlaps training. The budgets are the env's (max_turns - 1 tool rounds,
max_tokens_per_turn per call, max_response_tokens in all), the prompts and their order agent-rl's PromptSource(seed)
(benchmarks/trl_run.py), the system prompt the built-in agent's with "call the bash tool" for "write a fenced block".

`train` writes OUT/steps.jsonl (per optimizer step, by trl_run.py's `step_timer`, as the vs_trl runs: seconds, TRL's
phases; and here the episodes' tool seconds and their start-to-verdict seconds), OUT/checkpoints/step_N/hf (model
and tokenizer, every --every steps and the last) and OUT/run.json; its GRPOConfig is trl_run.py's `grpo_settings`. `score` writes {checkpoint: held-out solve rate} for each checkpoint: TRL's own eval
(`GRPOTrainer.evaluate`, one sample per task at the training temperature) on the env's first --limit held-out tasks,
the mean verdict with an infrastructure failure counted 0 (as agent-rl's evaluator counts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SYSTEM = (
    "You are working in a Linux container with a shell. To run a command, call the bash tool. "
    "Its output is shown to you. Edit files with shell commands. "
    "When the task is done, reply without a tool call."
)
"""envs/harbor/env.py's SYSTEM, with the tool call in place of the fenced block."""


class _Suite:
    """What every SweTinyEnv of this process shares: the env spec, its tasks and tokenizer, and the episodes'
    records (tool seconds, start-to-verdict seconds, verdicts) since the last `take`."""

    spec: Any = None
    tasks: dict[str, Any] = {}
    tokenizer: Any = None
    episodes: list[dict] = []
    infra: list[str] = []

    @classmethod
    def load(cls, env_yaml: Path, tokenizer: Any) -> None:
        import envs
        from envs.harbor.task import load_tasks

        cls.spec = envs.load(env_yaml)
        cls.tasks = {t.name: t for t in load_tasks(cls.spec.harbor.resolved_tasks(cls.spec.source_path))}
        cls.tokenizer = tokenizer

    @classmethod
    def take(cls) -> tuple[list[dict], list[str]]:
        out, infra = cls.episodes, cls.infra
        cls.episodes, cls.infra = [], []
        return out, infra


class SweTinyEnv:
    """One rollout of a swe_tiny task in its own container (TRL's `environment_factory` protocol)."""

    def __init__(self) -> None:
        self._task: Any = None
        self._container: Any = None
        self._lp: Any = None
        self._tool_s = 0.0
        self._start = 0.0

    def reset(self, task_id: str | None = None, **_: Any) -> None:
        if task_id is None:
            raise ValueError("SweTinyEnv.reset needs the row's task_id")
        if (
            self._container is not None
        ):  # the last batch's rollout ended without a verdict (it always has one)
            raise RuntimeError(f"SweTinyEnv.reset: the container of task {self._task.name} was not released")
        self._task = _Suite.tasks[task_id]
        self._tool_s, self._start = 0.0, time.monotonic()
        return None  # the instruction is the row's prompt

    async def bash(self, command: str) -> str:
        """Run a shell command in the task's container and return its output.

        Args:
            command: the shell command to run
        """
        from envs.types import InfraFailure
        from sandboxes.api import SandboxError

        h = _Suite.spec.harbor
        lp = await self._pool()
        if self._container is None:
            from envs.harbor.image import start_container

            self._container = await lp.call(
                start_container, self._task, lp.pool, allow_network=h.allow_network
            )
        left = (self._task.agent_timeout_s or h.command_timeout_s) - self._tool_s
        limit = max(1.0, min(h.command_timeout_s, left))
        t0 = time.perf_counter()
        try:
            res = await lp.work(self._container.exec, command, timeout_s=limit)
        except SandboxError as e:
            raise InfraFailure("sandbox_killed", f"task {self._task.name}: {e}") from e
        self._tool_s += time.perf_counter() - t0
        shown = res.stdout + res.stderr
        if res.timed_out:
            shown += f"\n(the command ran past {limit:g} s and was stopped)"
        elif res.exit_code:
            shown += f"\n(exit status {res.exit_code})"
        return observation(shown.strip() or _Suite.spec.tool.observation.empty)

    async def verdict(self) -> float | None:
        """tests/test.sh's reward in this rollout's container (started if no command ran); None when the
        container or the verifier failed (an infrastructure failure, not a score). The container goes after."""
        from envs.harbor.verify import run_verifier
        from envs.types import InfraFailure

        lp = await self._pool()
        t0 = time.perf_counter()
        try:
            if self._container is None:
                from envs.harbor.image import start_container

                h = _Suite.spec.harbor
                self._container = await lp.call(
                    start_container, self._task, lp.pool, allow_network=h.allow_network
                )
            reward: float | None = await lp.work(run_verifier, self._task, self._container)
        except InfraFailure as e:  # TRL has no retry: the rollout is unscorable (None), said on stderr
            print(f"infra_failed: {e}", file=sys.stderr, flush=True)
            _Suite.infra.append(e.cause)
            reward = None
        finally:
            if self._container is not None:
                c, self._container = self._container, None
                await lp.release(c)
        self._tool_s += time.perf_counter() - t0
        _Suite.episodes.append(
            {"tool_s": self._tool_s, "episode_s": time.monotonic() - self._start, "reward": reward}
        )
        return reward

    async def _pool(self) -> Any:
        """envs/harbor's container pool and threads of the running event loop (TRL's daemon loop)."""
        from envs.harbor.env import loop_pool

        if self._lp is None:
            self._lp = loop_pool(_Suite.spec)
        return self._lp


def observation(shown: str) -> str:
    """The command's output as the built-in agent shows it: cut in the middle past the observation's token budget
    (envs/tir.py ObservationFormatter, without the fenced template: the chat template wraps a tool message)."""
    from envs.codec import codec
    from envs.tir import ObservationFormatter

    fmt = ObservationFormatter(_Suite.tokenizer, "{output}", _Suite.spec.tool.observation.max_tokens)
    return codec(_Suite.tokenizer).decode(fmt.encode(shown))


async def verdicts(environments: list[SweTinyEnv], **_: Any) -> list[float | None]:
    """The reward: every rollout's verifier at once (each in its own container)."""
    return list(await asyncio.gather(*(e.verdict() for e in environments)))


def bash_tool() -> Any:
    """The `bash` tool as TRL renders it into the prompt (a bound method of an env; its schema is the docstring)."""
    return SweTinyEnv().bash


def rows(tasks: list[Any]) -> list[dict]:
    """The dataset rows: the system prompt and the task's instruction, and the task id `reset` takes."""
    return [
        {
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t.problem}],
            "task_id": t.id,
        }
        for t in tasks
    ]


# -- the warm start's data (run in agent-rl's venv by slow_tools.py) ---------------------------------------------------

FINAL = "The bug is fixed."


def sft_row(tok: Any, instruction: str, command: str, passed: str) -> dict:
    """One `agent-rl sft` row in TRL's format: the bash tool call and the final message trained, the tool's
    output (the chat template's tool turn) context only. The same trace as examples/swe_tiny.py trace_row."""
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}]}  # fmt: skip
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    tools = [bash_tool()]

    def render(msgs: list[dict], gen: bool) -> str:
        return tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)

    prompt = render(base, True)
    with_call = render([*base, call], False)
    with_tool = render([*base, call, {"role": "tool", "name": "bash", "content": passed}], True)
    eos = tok.eos_token
    if not (with_call.startswith(prompt) and with_tool.startswith(with_call)):
        raise ValueError(
            "the tokenizer's chat template is not prefix-stable: TRL's multi-turn loop needs one"
        )
    call_text = with_call[len(prompt) :]
    # the call and its end-of-turn are trained, the newline after it is context
    cut = call_text.index(eos) + len(eos)
    return {
        "prompt": prompt,
        "response": [
            {"text": call_text[:cut], "train": True},
            {"text": call_text[cut:] + with_tool[len(with_call) :], "train": False},
            {"text": FINAL, "train": True},
        ],
    }


def format_texts() -> list[str]:
    """The format's fixed text, for the tokenizer's corpus (as examples/swe_tiny.py's corpus has its SYSTEM)."""
    return [
        SYSTEM,
        FINAL,
        "tools: bash",
        '<tool_call>\n{"name": "bash", "arguments": {"command": ',
        "<tool_response>\n",
    ]


# -- train -------------------------------------------------------------------------------------------------------------


def _common(args: argparse.Namespace) -> tuple[Any, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    # TRL's parser for ChatML + Hermes tool calls (the warm start's template): set by hand, as TRL's docs say
    tok.response_template = qwen3_template
    _Suite.load(args.env, tok)
    return torch, tok


def config_kwargs(args: argparse.Namespace, samples: int) -> dict:
    """GRPOConfig's settings as benchmarks/trl_run.py's (`grpo_settings`), for this suite's env."""
    from benchmarks.trl_run import grpo_settings

    return grpo_settings(_Suite.spec, args.seed, samples, args.micro_batches)


def close_pool(trainer: Any) -> None:
    """Remove every container of the trainer's event loop (envs/harbor's pool lives there)."""
    from envs.loop_resources import close_shared_sandboxes

    loop = getattr(trainer, "async_loop", None)
    if loop is not None:
        asyncio.run_coroutine_threadsafe(close_shared_sandboxes(), loop).result()


def train(args: argparse.Namespace) -> int:
    t_start = time.time()
    torch, tok = _common(args)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.trl_run import LOSSES, PHASES, PhaseClock, prompts_in_agent_rl_order, step_timer

    group = _Suite.spec.group_size
    samples = args.prompts * group
    if samples % args.micro_batches:
        raise SystemExit(f"--micro-batches {args.micro_batches} must divide the {samples} samples of a step")
    tasks = prompts_in_agent_rl_order(_Suite.spec, tok, args.seed, args.steps * args.prompts)
    config = GRPOConfig(
        output_dir=str(args.out / "trl"),
        max_steps=args.steps,
        learning_rate=args.lr,
        **config_kwargs(args, samples),
        **LOSSES[args.loss],
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    args.out.mkdir(parents=True, exist_ok=True)
    clock = PhaseClock()

    def episodes() -> dict:
        """The step's episodes (tool and start-to-verdict seconds) and infrastructure failures."""
        eps, infra = _Suite.take()
        return {"episodes": eps, "infra_failed": infra}

    timer = step_timer(args.out, args.steps, args.every, clock, lambda: trainer.model, tok, episodes)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=verdicts,
        args=config,
        train_dataset=Dataset.from_list(rows(tasks)),
        processing_class=tok,
        environment_factory=SweTinyEnv,
        callbacks=[timer],
    )
    for name, phase in PHASES.items():
        clock.wrap(trainer, name, phase)
    t_train = time.time()
    try:
        trainer.train()
    finally:
        close_pool(trainer)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    info = {
        "loss": args.loss,
        "threads": args.threads,
        "micro_batches": args.micro_batches,
        "startup_seconds": t_train - t_start,
        "reward_per_step": [h["reward"] for h in logs],
        "tools_call_frequency": [h.get("tools/call_frequency") for h in logs],
    }
    (args.out / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    return 0


# -- score -------------------------------------------------------------------------------------------------------------


def score(args: argparse.Namespace) -> int:
    """Each checkpoint's held-out solve rate by TRL's own eval loop (see the module docstring)."""
    torch, tok = _common(args)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    import envs

    held = list(envs.make(_Suite.spec, tok).tasks("test"))[: args.limit]
    data = Dataset.from_list(rows(held))
    group = _Suite.spec.group_size
    out: dict[str, float] = {}
    for ck in args.checkpoints:
        model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32)
        batch = group * max(1, min(len(held), 32) // group)
        config = GRPOConfig(
            output_dir=str(args.out.parent / "trl_eval"),
            max_steps=1,
            learning_rate=0.0,
            num_generations_eval=1,
            per_device_eval_batch_size=min(len(held), 32),
            **(
                config_kwargs(args, batch)
                | {"per_device_train_batch_size": batch, "gradient_accumulation_steps": 1}
            ),
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=verdicts,
            args=config,
            train_dataset=data,
            eval_dataset=data,
            processing_class=tok,
            environment_factory=SweTinyEnv,
        )
        _Suite.take()
        try:
            trainer.evaluate()
        finally:
            close_pool(trainer)
        episodes, _ = _Suite.take()
        if len(episodes) != len(held):
            raise SystemExit(f"score {ck}: {len(episodes)} verdicts for {len(held)} held-out tasks")
        out[str(ck)] = sum(e["reward"] or 0.0 for e in episodes) / len(held)
        print(f"scored {ck}: {out[str(ck)]:.3f}", flush=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("train", "score"):
        s = sub.add_parser(name)
        s.add_argument("--model", type=Path, required=True, help="the warm start (TRL's format)")
        s.add_argument(
            "--env", type=Path, required=True, help="the swe_tiny env YAML (slow_tools.py writes it)"
        )
        s.add_argument("--out", type=Path, required=True)
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--threads", type=int, default=1, help="torch threads")
        s.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps per step")
    t = sub.choices["train"]
    t.add_argument("--steps", type=int, default=16)
    t.add_argument("--every", type=int, default=4, help="save a checkpoint every N steps (and at the end)")
    t.add_argument("--lr", type=float, default=3e-4, help="recipes/swe_tiny.yaml's")
    t.add_argument("--prompts", type=int, default=8, help="prompts per step (x the env's group_size samples)")
    t.add_argument("--loss", default="shipped", help="benchmarks/trl_run.py LOSSES")
    s = sub.choices["score"]
    s.add_argument(
        "--limit", type=int, default=100, help="held-out tasks (the env's first N, as agent-rl eval)"
    )
    s.add_argument("checkpoints", type=Path, nargs="+", help="HF model directories")
    args = p.parse_args(argv)
    return train(args) if args.cmd == "train" else score(args)


if __name__ == "__main__":
    sys.exit(main())
