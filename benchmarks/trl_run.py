"""One TRL run of benchmarks/vs_trl.py: `GRPOTrainer(tools=[python])` on agent_arith, in TRL's own venv.

    .venv-trl/bin/python benchmarks/trl_run.py --model DIR --out DIR --steps 30 --seed 0 --loss shipped|shipped-constant-lr|closest

Run by benchmarks/vs_trl.py (one process per run, as a user runs TRL); needs `bash scripts/setup_trl.sh`.
What is the same as agent-rl's agent_arith run (recipes/agent_arith.yaml on envs/tiny_arith_agent.yaml):
- the model and tokenizer (the warm start dir: the toy model or SmolLM2-135M-Instruct; its chat template is the
  Hermes tool template, ChatML with <tool_call> blocks), fp32;
- the prompts and their order: the env's training split in the order agent-rl's PromptSource(seed) draws
  them, fed unshuffled (`shuffle_dataset=False`);
- --prompts prompts (8) x 8 samples per step (`num_generations=8`, one generation batch per optimizer step),
  temperature 1, no top-k/top-p, --lr (2e-4), no weight decay, grad clip 1.0, one update per batch;
- the budgets: at most 2 chat calls (one tool round, `max_tool_calling_iterations=1`), 48 new tokens per
  call (`generation_kwargs.max_new_tokens`), 128 completion tokens in all (`max_completion_length`);
- the tool runs in the env's sandbox (the same bubblewrap pool, limits and observation formatting that the
  agent's `sandbox.run` gets), and the final answer is scored by the env's own reward (`AgentEnv.score`).
What differs is TRL's own: transformers `generate` (padded batches, turn by turn, no continuous batching),
its tool-call parser (`response_template`, Qwen's), its loss (`--loss`), and no overlap of anything.

Writes OUT/steps.jsonl (per optimizer step: wall seconds, save seconds excluded, and the step's phases: wall
and process-CPU seconds of generation, tool calls, reward, the rest of scoring, forward, backward, optimizer), OUT/checkpoints/step_N/hf
(the model every --every steps and at the end, scored afterwards by agent-rl's evaluator) and OUT/run.json.
`grpo_settings`, `step_timer` (that file and the checkpoints) and `PhaseClock` are also benchmarks/trl_swe.py's (the
TRL cell of benchmarks/slow_tools.py): one way to configure and time a TRL run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV = ROOT / "envs" / "tiny_arith_agent.yaml"

# TRL's loss as shipped (its defaults: dapo, rewards / group std, linear lr decay to 0 over max_steps); the
# same with a constant lr, as agent-rl's default schedule (so the lr schedule and the loss are measured apart);
# and the setting closest to agent-rl's at k=0: VCPO on-policy is -A_i * mean_t log pi per trajectory, averaged
# over trajectories (TRL's "grpo" aggregation), rewards not divided by the group's std, no KL term, constant lr.
LOSSES = {
    "shipped": {},
    "shipped-constant-lr": {"lr_scheduler_type": "constant", "warmup_steps": 0},
    "closest": {
        "loss_type": "grpo",
        "scale_rewards": "none",
        "beta": 0.0,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
    },
}


def prompts_in_agent_rl_order(spec, tokenizer, seed: int, n: int) -> list:
    """The first `n` training tasks in the order agent-rl's PromptSource(seed) hands them out."""
    import envs
    from agent_rl.rollout.workers import PromptSource

    source = PromptSource(envs.make(spec, tokenizer).tasks("train"), seed=seed)
    return [source.tasks[source.next_id(deque())] for _ in range(n)]


def build_tool_and_reward(spec, tokenizer):
    """The `python` tool (the env's sandbox, as the agent's `sandbox.run`) and the env's reward."""
    import envs
    from envs.agent import AgentSandbox
    from envs.env import make_limits, shared_sandbox

    limits = make_limits(spec)
    tasks = {t.id: t for t in envs.make(spec, tokenizer).tasks("train")}

    async def python(code: str) -> str:
        """Run Python code in a sandbox and return what it prints.

        Args:
            code: the program
        """
        return await AgentSandbox(spec, limits, shared_sandbox(spec)).run(code)

    async def reward(completions, task_id, **_) -> list[float]:
        out = []
        for messages, tid in zip(completions, task_id, strict=True):
            last = messages[-1] if messages else {}
            # the agent's answer: the last assistant message when it calls no tool (else no answer: 0)
            answer = (
                last.get("content")
                if last.get("role") == "assistant" and not last.get("tool_calls")
                else None
            )
            env = envs.make(spec, tokenizer)
            env.reset(tasks[tid])
            out.append(await env.score(answer))
        return out

    return python, reward


# TRL's methods timed per step (exclusive of the timed methods they call), and the phase each is counted to
PHASES = {
    "_generate_single_turn": "generate",  # transformers generate on a padded batch (every turn)
    "_tool_call_loop": "tools",  # running the tool calls, parsing, the tool-result suffixes
    "_calculate_rewards": "reward",
    "_generate_and_score_completions": "score_other",  # tokenizing, decoding, advantages
    "compute_loss": "forward",  # the policy's forward and the loss
    "training_step": "backward",  # what training_step does besides the above: backward
}


class PhaseClock:
    """Wall and process-CPU seconds per phase, each method's own time only (its timed callees apart): TRL
    runs one thing at a time in one process, so the process's CPU time in a phase is that phase's."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._stack: list[list[float]] = []  # [wall start, cpu start, wall of timed callees, cpu of callees]

    def enter(self) -> None:
        self._stack.append([time.perf_counter(), time.process_time(), 0.0, 0.0])

    def leave(self, phase: str) -> None:
        t0, c0, w_in, c_in = self._stack.pop()
        w, c = time.perf_counter() - t0, time.process_time() - c0
        self.wall[phase] = self.wall.get(phase, 0.0) + w - w_in
        self.cpu[phase] = self.cpu.get(phase, 0.0) + c - c_in
        if self._stack:
            self._stack[-1][2] += w
            self._stack[-1][3] += c

    def wrap(self, obj, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            self.enter()
            try:
                return fn(*a, **k)
            finally:
                self.leave(phase)

        setattr(obj, name, timed)

    def take(self) -> dict[str, float]:
        """This step's phases as steps.jsonl fields (phase_NAME wall s, phase_cpu_NAME CPU s); reset."""
        out = {f"phase_{k}": round(v, 4) for k, v in self.wall.items()}
        out |= {f"phase_cpu_{k}": round(v, 4) for k, v in self.cpu.items()}
        self.wall, self.cpu = {}, {}
        return out


def grpo_settings(spec, seed: int, samples: int, micro_batches: int) -> dict:
    """GRPOConfig's settings of every TRL run here (this job's and benchmarks/trl_swe.py's), but the output dir, the
    steps, the lr and the loss: fp32 on CPU, the env's group and token budgets, one generation batch per optimizer
    step (`micro_batches` gradient accumulation steps over its `samples`), the prompts in the order given, TRL's own
    checkpoints, logging and progress bars off."""
    t = spec.turns
    return dict(
        use_cpu=True,
        bf16=False,  # fp32 as agent-rl's learner (TRL's default on CPU would be bf16 autocast)
        gradient_checkpointing=False,  # TRL's default is on (~20% slower); off is its fastest here
        seed=seed,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=samples // micro_batches,
        gradient_accumulation_steps=micro_batches,
        num_generations=spec.group_size,
        num_iterations=1,
        shuffle_dataset=False,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_completion_length=t.max_response_tokens,
        generation_kwargs={"max_new_tokens": t.max_tokens_per_turn},
        max_tool_calling_iterations=t.max_turns - 1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def save_checkpoint(ck: Path, model: Any, tokenizer: Any = None) -> None:
    """CK/hf: the model (and its tokenizer, when given), written into CK/.tmp_hf and renamed, so a CK/hf is whole."""
    model.save_pretrained(ck / ".tmp_hf")
    if tokenizer is not None:
        tokenizer.save_pretrained(ck / ".tmp_hf")
    os.replace(ck / ".tmp_hf", ck / "hf")


def step_timer(
    out: Path,
    steps: int,
    every: int,
    clock: PhaseClock,
    model: Callable[[], Any],
    tokenizer: Any = None,
    extra: Callable[[], dict] = dict,
) -> Any:
    """The TrainerCallback of every TRL run here (this job's and benchmarks/trl_swe.py's). Per optimizer step, one
    line of OUT/steps.jsonl: its wall seconds (`step_seconds`, from the end of the last step, its checkpoint save
    excluded), the save's seconds, TRL's phases (`clock.take()`; the optimizer's step is timed here) and the rest of
    the step (`phase_rest`: the Trainer's loop, logging), and `extra()`'s fields. A checkpoint every `every` steps and
    at the last (`save_checkpoint(OUT/checkpoints/step_N, model(), tokenizer)`)."""
    from transformers import TrainerCallback

    path = out / "steps.jsonl"
    path.write_text("")

    class StepTimer(TrainerCallback):
        t = 0.0

        def on_train_begin(self, *a, **k):
            self.t = time.monotonic()

        def on_step_end(self, _args, state, _control, **k):
            now = time.monotonic()
            step_s, step = now - self.t, state.global_step
            save_s = 0.0
            if step % every == 0 or step == steps:
                save_checkpoint(out / "checkpoints" / f"step_{step}", model(), tokenizer)
                save_s = time.monotonic() - now
            rec = {"step": step, "step_seconds": step_s, "save_seconds": save_s, "time": time.time()}
            phases = clock.take()
            timed = sum(v for k, v in phases.items() if not k.startswith("phase_cpu_"))
            rec |= phases | {"phase_rest": round(step_s - timed, 4)} | extra()
            with path.open("a") as f:  # one line per step, whole
                f.write(json.dumps(rec) + "\n")
            print(f"trl step {step}/{steps}: {step_s:.2f} s", flush=True)
            self.t = time.monotonic()

        def on_pre_optimizer_step(self, *a, **k):
            clock.enter()

        def on_optimizer_step(self, *a, **k):
            clock.leave("optimizer")

    return StepTimer()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss", choices=sorted(LOSSES), default="shipped")
    p.add_argument("--every", type=int, default=5, help="save a checkpoint every N steps (and at the end)")
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps per 64 samples")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (x the env's group_size samples)")
    args = p.parse_args(argv)
    t_start = time.time()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import envs

    spec = envs.load(ENV)
    from trl.chat_template_utils import qwen3_template

    tok = AutoTokenizer.from_pretrained(args.model)
    # TRL's parser for Qwen's ChatML + Hermes tool calls, which the warm start's template renders (TRL only
    # recognises known templates by their text, so it is set by hand, as TRL's docs say to)
    tok.response_template = qwen3_template
    batch_prompts, group = args.prompts, spec.group_size
    tasks = prompts_in_agent_rl_order(spec, tok, args.seed, args.steps * batch_prompts)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t.problem}], "task_id": t.id} for t in tasks]
    )
    python, reward = build_tool_and_reward(spec, tok)
    samples = batch_prompts * group
    if samples % args.micro_batches:
        raise SystemExit(f"--micro-batches {args.micro_batches} must divide the {samples} samples of a step")
    config = GRPOConfig(
        output_dir=str(args.out / "trl"),
        max_steps=args.steps,
        learning_rate=args.lr,
        **grpo_settings(spec, args.seed, samples, args.micro_batches),
        **LOSSES[args.loss],
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    clock = PhaseClock()
    timer = step_timer(args.out, args.steps, args.every, clock, lambda: trainer.model)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tok,
        tools=[python],
        callbacks=[timer],
    )
    for name, phase in PHASES.items():
        clock.wrap(trainer, name, phase)
    t_train = time.time()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    (args.out / "run.json").write_text(
        json.dumps(
            {
                "loss": args.loss,
                "trl_loss_settings": {
                    k: getattr(config, k)
                    for k in ("loss_type", "scale_rewards", "beta", "lr_scheduler_type", "warmup_steps")
                },
                "threads": args.threads,
                "micro_batches": args.micro_batches,
                "startup_seconds": t_train - t_start,
                "reward_per_step": [h["reward"] for h in logs],
                "tools_call_frequency": [h.get("tools/call_frequency") for h in logs],
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
