"""Issue 59's task suite end to end: generated Harbor bug-fix tasks -> tiny model -> SFT on the oracle's traces ->
held-out solve rate -> async VCPO in containers -> held-out solve rate, curves.

Run: `python -m examples.swe_tiny [--fresh] [--tasks 300] [--quick] [--set KEY=VALUE ...]` (`make run-swe`); the
recipe is recipes/swe_tiny.yaml. Every stage is skipped when its output exists (tasks, model, warm start, RL
checkpoints: training resumes), so an interrupted run picks up where it stopped: Ctrl-C stops it at once (also when
it was started in the background with SIGINT ignored), SIGTERM after the RL step in progress (checkpointed), and
either way no container is left and the last line says what the same command does next. Needs a Docker engine: the one at
--docker-host / DOCKER_HOST when it answers, else a private dockerd (root) whose images are kept in RUN_DIR/dockerd.

The SFT traces are the built-in agent's format (envs/harbor/env.py): the task's instruction as the chat prompt,
one reply with a ```bash block running solution/solve.sh's fix (one sed command) and the repository's test
(pytest in the container), the test's output as the env shows it (context, not trained), then a final message
without a command, which ends the episode.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
from pathlib import Path

import torch

from agent_rl import errors
from agent_rl.config import Recipe, load_recipe
from agent_rl.errors import Terminated
from agent_rl.tools.tiny import build_tiny
from envs.harbor.env import SYSTEM
from envs.harbor.generate import generate, task_spec
from envs.harbor.image import build_images, ensure_base
from envs.harbor.private_dockerd import docker_engine
from envs.harbor.task import heldout, load_tasks
from envs.spec import ObservationConfig
from examples.pipeline import RECIPES, run

HELDOUT = 0.34
FINAL = "The bug is fixed."
SFT = dict(epochs=1, lr=2e-3, batch_size=16, max_len=512, warmup_steps=10, device="cpu")
EXTRA_TRACES = 1000
"""Oracle traces beyond the suite's train tasks (the generator's other seeds). Measured offline on 60 held-out
tasks after one SFT epoch (2026-12-06): 400 more -> 6/60 greedy, 2/60 at T=1; 1000 -> 48/60 and 26/60; 2000 ->
49/60 and 43/60. 1000 leaves RL the gap between sampling at T=1 and the greedy answer the model already knows."""
PAIRS_PER_SEED = 450  # 3 families x 5 functions x 30 modules: a seed's tasks past this repeat its pairs
MODEL = dict(vocab_size=1024, hidden=256, layers=2, heads=4, kv_heads=2)
QUICK = ["train.steps=2", "eval.limit=4", "train.batch_prompts=2", "checkpoint.every=1", "eval.every=0"]


CHECK = "python3 -m pytest -q -p no:cacheprovider /app"
"""The repository's own test, run after the fix in the same command block (a tool call that does real work)."""
PASSED = "." + "[100%]".rjust(73) + "\n1 passed in 0.05s"
"""What CHECK prints when the fix is right (the observation shown in the SFT trace; context, not trained)."""


def fix_command(task_dir: Path) -> str:
    """solution/solve.sh without its shebang (one sed command that applies the oracle's fix), then CHECK."""
    lines = (task_dir / "solution" / "solve.sh").read_text().splitlines()
    return "\n".join([*(lines[1:] if lines and lines[0].startswith("#!") else lines), CHECK])


def heldout_pairs(tasks_dir: Path) -> set[tuple[str, str]]:
    """(function, module) of every held-out task: no SFT trace may have one (its instruction would be seen)."""
    return {
        (t.config.metadata["function"], m.stem)
        for t in load_tasks(tasks_dir)
        if heldout(t.name, HELDOUT)
        for m in (t.path / "environment" / "app").glob("*.py")
        if not m.name.startswith("test_")
    }


def extra_traces(n: int, exclude: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """(instruction, command) of `n` more oracle traces from the generator's other seeds (1, 2, ...: tasks never
    built or scored), none of whose (function, module) pairs is in `exclude`."""
    out: list[tuple[str, str]] = []
    i = 0
    while len(out) < n:
        seed, index = 1 + i // PAIRS_PER_SEED, i % PAIRS_PER_SEED
        spec = task_spec(index, seed)
        if (spec.fn.name, spec.module) not in exclude:
            out.append((spec.instruction, f"{spec.fix}\n{CHECK}"))
        i += 1
    return out


def messages(instruction: str) -> list[dict[str, str]]:
    """The episode's prompt, as HarborEnv.reset renders it."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]


def trace_row(tok, instruction: str, command: str) -> dict:
    """One `agent-rl sft` row: the bash turn and the final message trained, the env's observation context only."""
    obs = ObservationConfig()
    prompt = tok.apply_chat_template(messages(instruction), tokenize=False, add_generation_prompt=True)
    return {
        "prompt": prompt,
        "response": [
            {"text": f"```bash\n{command}\n```\n", "train": True},
            {"text": obs.template.format(output=PASSED), "train": False},
            {"text": FINAL, "train": True},
        ],
    }


def corpus(tasks_dir: Path) -> list[str]:
    """The tokenizer's training text: every task's instruction, module and fix, and the agent's fixed words."""
    texts = [SYSTEM, FINAL, ObservationConfig().template]
    for t in load_tasks(tasks_dir):
        texts += [t.instruction, fix_command(t.path)]
        texts += [p.read_text() for p in (t.path / "environment" / "app").glob("*.py")]
    return texts


def write_sft_data(tasks_dir: Path, base: Path, path: Path, extra: int = EXTRA_TRACES) -> None:
    """Traces of the train tasks and `extra` generated ones (the held-out split's instructions are never seen)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    rows = [
        trace_row(tok, t.instruction, fix_command(t.path))
        for t in load_tasks(tasks_dir)
        if not heldout(t.name, HELDOUT)
    ]
    rows += [trace_row(tok, i, c) for i, c in extra_traces(extra, heldout_pairs(tasks_dir))]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def write_env(path: Path, tasks_dir: Path, docker_host: str | None) -> Path:
    """The generated suite as a `type: harbor` env (envs/swe_tiny.yaml's settings, this run's tasks and engine).
    Its tasks' Dockerfiles only copy files, so every episode starts from a warm base container (8 kept ready)."""
    harbor = {"tasks": str(tasks_dir.resolve()), "heldout_fraction": HELDOUT, "warm_containers": 8}
    if docker_host:
        harbor["docker_host"] = docker_host
    env = {
        "name": "swe_tiny",
        "type": "harbor",
        "harbor": harbor,
        "group_size": 4,
        "turns": {"max_turns": 4, "max_tokens_per_turn": 256, "max_response_tokens": 512},
    }
    path.write_text(json.dumps(env, indent=2) + "\n")  # JSON is YAML
    return path


def prebuild(tasks_dir: Path, docker_host: str | None) -> None:
    """Build every task's image once, before anything is timed (a kept engine data-root skips the built ones)."""
    import os
    import time

    from sandboxes.task_containers import ContainerPool

    t0 = time.time()
    pool = ContainerPool(docker_host, run=f"swe-tiny-build-{os.getpid()}", pool="build", warm=0)
    try:
        ensure_base(pool)
        tags = build_images(load_tasks(tasks_dir), pool)
    finally:
        pool.close()
    print(f"task images: {len(set(tags))} ready in {time.time() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fresh", action="store_true", help="delete the run dir first")
    p.add_argument("--tasks", type=int, default=300, help="tasks to generate (held-out: a stable 34%%)")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 24 tasks, 1 SFT epoch on their traces, 2 RL steps"
    )
    p.add_argument(
        "--docker-host", default=None, help="default: DOCKER_HOST's engine, else a private dockerd"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    args = p.parse_args(argv)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background by a shell without job control (`make run-swe &` in a script, a tool's shell),
        # which starts it with SIGINT ignored: `kill -INT` did nothing to an hour-long run. Ctrl-C's meaning back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(
        1
    )  # as examples/tiny_tir.py: the tiny model's matrices gain nothing from a 2nd core
    sets = (QUICK + ["logging.run_dir=runs/swe_tiny_quick"] if args.quick else []) + args.set
    root = load_recipe(RECIPES / "swe_tiny.yaml", sets).run_dir
    if not any(s.startswith("model.path=") for s in sets):  # the warm start lives in its run dir
        sets.append(f"model.path={root / 'sft'}")
    if args.fresh:
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    rl = root / "rl"
    if (
        rl.is_dir() and not (rl / "checkpoints").is_dir()
    ):  # stopped before its first checkpoint: nothing to resume
        shutil.rmtree(rl)
    n = 24 if args.quick else args.tasks
    tasks_dir = root / "tasks"
    if len(list(tasks_dir.glob("*/task.toml"))) != n:
        generate(tasks_dir, n, seed=0)
    sft = {**SFT, "epochs": 1} if args.quick else SFT
    with docker_engine(args.docker_host, data_root=(root / "dockerd").resolve()) as host:
        prebuild(tasks_dir, host)
        env = write_env(root / "swe_tiny_env.yaml", tasks_dir, host)
        recipe = load_recipe(RECIPES / "swe_tiny.yaml", [f"envs.train={env}", *sets])
        try:
            return pipeline(recipe, tasks_dir, quick=args.quick, sft=sft)
        except (
            Terminated
        ):  # SIGTERM: the trainer's own line names `agent-rl train --resume`, this command is the one
            raise Terminated(f"stopped by SIGTERM; {resume_note(rl)}") from None
        except KeyboardInterrupt:  # Ctrl-C: errors.run prints "interrupted" after this
            print(f"swe_tiny: stopped; {resume_note(rl)}", file=sys.stderr, flush=True)
            raise


def resume_note(rl: Path) -> str:
    """What the same command does next: RL resumes from its last checkpoint, or the unfinished stage starts over."""
    steps = sorted(int(p.name[5:]) for p in (rl / "checkpoints").glob("step_*") if p.is_dir())
    if steps:
        return f"RL step {steps[-1]} is checkpointed: the same command again resumes RL from it"
    return "no RL checkpoint yet: the same command again starts from the first unfinished stage"


def pipeline(recipe: Recipe, tasks_dir: Path, *, quick: bool, sft: dict) -> int:
    return run(
        recipe,
        title="swe_tiny",
        build_base=lambda base: build_tiny(base, corpus(tasks_dir), seed=0, **MODEL),
        write_sft_data=lambda base, path: write_sft_data(
            tasks_dir, base, path, extra=0 if quick else EXTRA_TRACES
        ),
        sft=sft,
        fresh=False,
        base_label="build tokenizer + Qwen2 model from scratch on the suite's text",
        sft_label="SFT warm start on the oracle solutions' traces (train tasks + generated, no held-out one)",
    )


if __name__ == "__main__":
    raise SystemExit(errors.run(main))
