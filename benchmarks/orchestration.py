"""The driver's CPU per model call, against an engine that answers instantly with pre-set tokens.

    .venv/bin/python benchmarks/orchestration.py [--rounds 3] [--steps 16] [--baseline REF] [--workers 1,2]

Two paths, each with the real rollout workers (`agent_rl.rollout`), the real buffer (staleness bound 2,
a consumer that takes 8 groups x 8 per step and bumps the version), the real env and the real local
sandbox; only the engine is replaced, at its protocol boundary (`InstantEngine` implements
`EngineClient`: no model compute, the same pre-set tokens every episode):

- tir:   a SimpleTIR episode of envs/tiny_arith.yaml: a turn with a python block (stop string, sandbox
         run, observation tokens), then a turn with \\boxed{} (reward). Two model calls per episode.
- agent: examples/arith_agent/agent.py (the official `openai` client, native tool calls) through the
         recording gateway on envs/tiny_arith_agent.yaml: a tool call (sandbox run), then the answer.

Measured per cell (a fresh process each; cells interleaved round by round so machine load hits all
alike): the driver process's CPU time (time.process_time: all its threads, not wall) per model call
over the measured steps, the CPU of its whole process tree (rollout workers, sandboxes) per call, and
model calls/s and episodes/s (wall). Cells: the tree at --baseline (a git worktree of that commit,
default: the merge base with main, i.e. before this branch's changes) and the current tree, in-process
(rollout.workers 1) and sharded (rollout.workers N, current tree only). One cProfile of the in-process
driver per path and tree goes into the md. Results: benchmarks/results/orchestration.{json,md}.

On benchmarks/harness: the rounds are `plan`'s seeds (cells rotated per round), each finished (cell, round) a line
of --work's runs.jsonl (`Runner`: a rerun resumes), medians and ranges from `stats.spread`, the provenance block and
the writer; `--from-results FILE` rewrites the JSON and markdown from a results file alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# appended: a cell run in the baseline tree (its PYTHONPATH) imports that tree's code, the harness from here
sys.path.append(str(ROOT))
from benchmarks.harness.provenance import Provenance, commit, describe  # noqa: E402
from benchmarks.harness.report import quick_args, results_args, results_dir, rewrite, write  # noqa: E402
from benchmarks.harness.runner import Job, Runner, plan  # noqa: E402
from benchmarks.harness.stats import spread  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
WORK = ROOT / "runs" / "bench_orchestration"
BATCH, GROUP, K = 8, 8, 2  # the main job's batch: 8 prompts x 8 samples, staleness bound 2
TIR_TURNS = ("```python\nprint(123 * 456)\n```\n", "The tool says 56088, so \\boxed{56088}.")
AGENT_TURNS = (
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(123 * 456)"}}\n</tool_call><|im_end|>',
    "The product is 56088.<|im_end|>",
)


# -- the instant engine (protocol boundary) -----------------------------------------------
class InstantEngine:
    """`EngineClient` that samples nothing: the first pre-set turn for a fresh episode, the second once
    the input holds a tool result (`second_after`: the token that marks it). Versions follow the consumer."""

    def __init__(self, turns: list[list[int]], second_after: int):
        self.turns, self.marker = turns, second_after
        self.version, self.calls = 0, 0

    async def generate(self, input_ids, sampling, *, request_id):
        from agent_rl.engines.api import Generation

        await asyncio.sleep(0)
        self.calls += 1
        ids = self.turns[1 if self.marker in input_ids else 0][: sampling.max_new_tokens]
        finish = "stop" if len(ids) == len(self.turns[1 if self.marker in input_ids else 0]) else "length"
        return Generation(list(ids), [-0.5] * len(ids), [self.version] * len(ids), finish)

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def update_weights(self, *, version, path=None, tensors=None) -> None:
        self.version = version

    async def health(self) -> bool:
        return True

    async def close(self) -> None: ...


# -- one cell (runs in its own process, against whichever tree is on sys.path) ------------
def _tree_cpu(root: int) -> float:
    """CPU seconds of the processes under `root` (this process), root's own excluded: those it reaped
    (RUSAGE_CHILDREN, their reaped children included) and the live ones (user + system + their reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(d.name)], stats[int(d.name)] = int(f[1]), f
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree, total = [root], reaped.ru_utime + reaped.ru_stime
    for pid in tree:
        kids = [c for c, p in parents.items() if p == pid]
        tree += kids
        for c in kids:
            f = stats[c]
            total += sum(int(x) for x in f[11:15]) / tick  # utime stime cutime cstime
    return total


async def _cell(path: str, workers: int, steps: int, warm: int, tok_dir: Path, profile: bool) -> dict:
    from transformers import AutoTokenizer

    import envs
    from agent_rl.buffer import RolloutBuffer
    from agent_rl.config import BufferConfig, RolloutConfig
    from agent_rl.rollout.workers import PromptSource, Rollouts

    tree = Path(envs.__file__).resolve().parents[1]
    spec = envs.load(tree / "envs" / ("tiny_arith.yaml" if path == "tir" else "tiny_arith_agent.yaml"))
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    texts = TIR_TURNS if path == "tir" else AGENT_TURNS
    turns = [tok.encode(t, add_special_tokens=False) for t in texts]
    marker = tok.convert_tokens_to_ids("output" if path == "tir" else "response")  # only in a tool result
    engine = InstantEngine(turns, marker)
    sandbox = envs.make_sandbox(spec)
    buffer = RolloutBuffer(BufferConfig(max_staleness=K), batch_prompts=BATCH, group_size=spec.group_size)
    prompts = PromptSource(envs.make(spec, tok, sandbox).tasks("train"), seed=0)
    cfg = RolloutConfig(max_concurrent_episodes=64)
    kw = dict(max_seq_len=256, seed=0)
    if workers == 1:
        rollouts = Rollouts(cfg, buffer, prompts, lambda: envs.make(spec, tok, sandbox), engine, **kw)
    else:
        from agent_rl.rollout.sharded import ShardedRollouts, WorkerEnv

        cfg = cfg.model_copy(update={"workers": workers})
        rollouts = ShardedRollouts(cfg, buffer, prompts, WorkerEnv(spec, tok), engine, **kw)
    rollouts.start()
    prof = CpuSampler() if profile else None
    try:
        for _ in range(warm):
            await buffer.take(BATCH)
            engine.version += 1
            buffer.set_version(engine.version)
        calls0, eps0 = engine.calls, rollouts.counters.episodes
        cpu0, tree0, t0 = time.process_time(), _tree_cpu(os.getpid()), time.perf_counter()
        if prof is not None:
            prof.start()
        for _ in range(steps):
            await buffer.take(BATCH)
            engine.version += 1
            buffer.set_version(engine.version)
        if prof is not None:
            prof.stop()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        tree_cpu = _tree_cpu(os.getpid()) - tree0
        calls, episodes = engine.calls - calls0, rollouts.counters.episodes - eps0
    finally:
        await rollouts.stop()
        await sandbox.close()
        with contextlib.suppress(Exception):
            await envs.close_shared_sandboxes()
    out = {
        "calls": calls,
        "episodes": episodes,
        "wall_s": wall,
        "driver_cpu_s": cpu,
        "driver_ms_per_call": 1e3 * cpu / calls,
        "total_ms_per_call": 1e3 * (cpu + tree_cpu) / calls,
        "calls_per_s": calls / wall,
        "episodes_per_s": episodes / wall,
    }
    if prof is not None:
        out["profile"] = f"{prof.samples} samples\n" + prof.table(cpu, calls)
    return out


class CpuSampler:
    """A statistical profile in process CPU time: every `interval` s of CPU (SIGPROF, ITIMER_PROF) the main
    thread's stack is counted. Hand-written because cProfile's per-call overhead inflates the many small
    functions of this path several-fold, and pyinstrument and py-spy sample wall time."""

    def __init__(self, interval: float = 2e-4):
        self.interval, self.samples = interval, 0
        self.own: Counter[str] = Counter()
        self.inclusive: Counter[str] = Counter()

    def _on_signal(self, signum, frame) -> None:
        self.samples += 1
        seen: set[str] = set()
        f, own = frame, True
        while f is not None:
            c = f.f_code
            key = f"{Path(c.co_filename).parent.name}/{Path(c.co_filename).name}:{c.co_firstlineno}({c.co_name})"
            if own:
                self.own[key] += 1
                own = False
            if key not in seen:
                seen.add(key)
                self.inclusive[key] += 1
            f = f.f_back

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._on_signal)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)

    def table(self, cpu_s: float, calls: int, top: int = 40) -> str:
        """Functions by inclusive CPU share (own share beside), in µs of driver CPU per model call. The kernel
        fires the timer at its tick (a few ms of CPU), not at `interval`: shares are scaled to the CPU measured."""
        us = 1e6 * cpu_s / max(self.samples, 1) / calls
        rows = [f"{'incl us/call':>12s} {'incl %':>7s} {'own us/call':>11s} {'own %':>6s}  function"]
        for key, n in self.inclusive.most_common(top):
            o = self.own.get(key, 0)
            rows.append(
                f"{n * us:12.1f} {100 * n / self.samples:6.1f}% {o * us:11.1f} {100 * o / self.samples:5.1f}%  {key}"
            )
        rows += ["", "top by own CPU:"]
        for key, o in self.own.most_common(15):
            rows.append(f"{'':12s} {'':7s} {o * us:11.1f} {100 * o / self.samples:5.1f}%  {key}")
        return "\n".join(rows)


# -- the driver of the benchmark ----------------------------------------------------------
def _build_tokenizers(work: Path) -> dict[str, Path]:
    """The tiny tokenizers the main job and the agent example use (trained offline, cached in `work`)."""
    from agent_rl.openai.templates import HERMES_TOOLS
    from agent_rl.tools.tiny import train_tokenizer
    from envs import tiny_arith

    out = {"tir": work / "tok_tir", "agent": work / "tok_agent"}
    if not (out["tir"] / "tokenizer.json").is_file():
        train_tokenizer(tiny_arith.corpus(), 512).save_pretrained(str(out["tir"]))
    if not (out["agent"] / "tokenizer.json").is_file():
        sys.path.insert(0, str(ROOT))
        from examples.agent_arith import chat_row, rows_text

        probe = train_tokenizer(["x"], 300)
        probe.chat_template = HERMES_TOOLS
        corpus = [
            rows_text(chat_row(probe, t)) for t in tiny_arith.teacher_traces(2000, 12345, tool_rate=0.5)
        ]
        tok = train_tokenizer(corpus, 512)
        tok.chat_template = HERMES_TOOLS
        tok.save_pretrained(str(out["agent"]))
    return out


def _baseline_tree(ref: str, work: Path) -> tuple[Path, str]:
    """A git worktree of `ref` in `work` (created once, kept at that commit)."""
    sha = subprocess.run(
        ["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    tree = work / f"base_{sha[:10]}"
    if not (tree / "agent_rl").is_dir():
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True, capture_output=True
        )
    return tree, sha


def _run_cell(tree: Path, path: str, workers: int, args, tok: Path, profile: bool) -> dict:
    steps = (args.steps if path == "tir" else args.agent_steps) * (
        3 if profile else 1
    )  # profiles: more samples
    spec = dict(path=path, workers=workers, steps=steps, warm=args.warm, tok=str(tok), profile=profile)
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--cell", json.dumps(spec)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cell {spec} in {tree} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


BEFORE = "14135f9"  # main just before the orchestration work of issue 23 landed: the "before" column


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every cell")
    p.add_argument("--steps", type=int, default=16, help="measured consumer steps (8 groups x 8), tir path")
    p.add_argument("--agent-steps", type=int, default=4, help="measured consumer steps, agent path")
    p.add_argument("--warm", type=int, default=2, help="consumer steps before measuring")
    p.add_argument(
        "--baseline",
        default=BEFORE,
        help=f"git ref of the baseline tree (default {BEFORE}: main before this work; 'merge-base': with main; 'none': skip)",
    )
    p.add_argument("--workers", default="1,2", help="rollout process counts of the current tree")
    p.add_argument("--paths", default="tir,agent")
    p.add_argument("--cell", help=argparse.SUPPRESS)
    p.add_argument(
        "--work",
        type=Path,
        default=WORK,
        help=f"tokenizers, baseline tree and runs (default {WORK.relative_to(ROOT)})",
    )
    results_args(p, "orchestration")
    quick_args(p, rounds=1, steps=1, agent_steps=1, warm=1, baseline="none")
    args = p.parse_args(argv)
    if rewrite(args, "orchestration", _markdown):
        return 0
    if args.cell:
        c = json.loads(args.cell)
        out = asyncio.run(_cell(c["path"], c["workers"], c["steps"], c["warm"], Path(c["tok"]), c["profile"]))
        print(json.dumps(out))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    prov = Provenance()
    toks = _build_tokenizers(args.work)
    trees = {"current": (ROOT, _head(ROOT))}
    if args.baseline != "none":
        ref = args.baseline
        if ref == "merge-base":
            ref = subprocess.run(
                ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        trees["baseline"] = _baseline_tree(ref, args.work)
    paths = args.paths.split(",")
    ns = [int(n) for n in args.workers.split(",")]
    grid = {f"{t}/{path}/workers={n}": (t, path, n)
            for t, path, n in [(t, path, 1) for path in paths for t in trees]
            + [("current", path, n) for path in paths for n in ns if n > 1]}  # fmt: skip

    def run(job: Job) -> dict:
        tree, path, n = grid[job.cell]
        res = _run_cell(trees[tree][0], path, n, args, toks[path], profile=False)
        print(f"driver {res['driver_ms_per_call']:.2f} ms/call, {res['calls_per_s']:.0f} calls/s", flush=True)
        return {"round": job.seed, "tree": tree, "path": path, "workers": n, "commit": trees[tree][1], **res}

    # one work folder per trees and settings measured (a dirty tree never resumes): a rerun resumes only those runs
    tag = "_".join(sha[:10] for _, sha in trees.values()) + ("_dirty" if commit().endswith("+dirty") else "")
    work = args.work / f"{tag}_s{args.steps}_a{args.agent_steps}_w{args.warm}"
    if tag.endswith("_dirty"):
        shutil.rmtree(work, ignore_errors=True)
    jobs = plan(list(grid), range(args.rounds))
    cells = [
        {k: v for k, v in r.items() if k not in ("cell", "seed")} for r in Runner(work).run(jobs, run).records
    ]
    profiles = {}
    for tree, path, n in grid.values():
        print(f"profile {tree} {path} workers={n}", flush=True)
        res = _run_cell(trees[tree][0], path, n, args, toks[path], profile=True)
        profiles[f"{tree}/{path}/workers={n}"] = {k: v for k, v in res.items() if k != "profile"} | {
            "table": res["profile"]
        }
    summary = _summary(cells, trees, paths, ns)
    result = {
        "benchmark": "orchestration",
        "meta": prov.meta(),
        "trees": {k: v[1] for k, v in trees.items()},
        "settings": {
            "rounds": args.rounds,
            "steps": {"tir": args.steps, "agent": args.agent_steps},
            "warm": args.warm,
            "batch": BATCH,
            "k": K,
        },
        "cells": cells,
        "summary": summary,
        "goals": _goals(summary),
        "profiles": profiles,
    }
    write("orchestration", result, results_dir(args.out, scratch=args.quick, name="orchestration"), _markdown)
    return 0


def _head(root: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


def _summary(cells: list[dict], trees: dict, paths: list[str], ns: list[int]) -> dict:
    def of(tree: str, path: str, n: int, key: str) -> dict[str, float | None]:
        return spread(c[key] for c in cells if (c["tree"], c["path"], c["workers"]) == (tree, path, n))

    def med(tree: str, path: str, n: int, key: str) -> float | None:
        return of(tree, path, n, key)["median"]

    def span(tree: str, path: str, n: int, key: str) -> list[float]:
        s = of(tree, path, n, key)
        return [] if s["min"] is None else [s["min"], s["max"]]

    out: dict = {}
    for path in paths:
        row: dict = {}
        for tree in trees:
            row[f"{tree}_driver_ms_per_call"] = med(tree, path, 1, "driver_ms_per_call")
            row[f"{tree}_driver_ms_per_call_range"] = span(tree, path, 1, "driver_ms_per_call")
            row[f"{tree}_total_ms_per_call"] = med(tree, path, 1, "total_ms_per_call")
        row["calls_per_s"] = {str(n): med("current", path, n, "calls_per_s") for n in ns}
        row["calls_per_s_range"] = {str(n): span("current", path, n, "calls_per_s") for n in ns}
        row["episodes_per_s"] = {str(n): med("current", path, n, "episodes_per_s") for n in ns}
        row["sharded_driver_ms_per_call"] = {
            str(n): med("current", path, n, "driver_ms_per_call") for n in ns if n > 1
        }
        base = row["calls_per_s"].get("1")
        row["scaling"] = {str(n): (v / base if v and base else None) for n, v in row["calls_per_s"].items()}
        out[path] = row
    return out


GOALS_MS = {"tir": 1.0, "agent": 3.0}  # issue #23: driver CPU per SimpleTIR turn / per gateway chat call


def _goals(summary: dict) -> dict:
    out = {}
    for path, row in summary.items():
        ms = row["current_driver_ms_per_call"]
        out[f"{path}_driver_ms_per_call"] = {
            "goal": GOALS_MS[path],
            "measured": ms,
            "met": ms <= GOALS_MS[path],
        }
        for n, x in row["scaling"].items():
            if n != "1" and x is not None:
                out[f"{path}_calls_per_s_x{n}"] = {
                    "goal": 0.8 * int(n),
                    "measured": x,
                    "met": x >= 0.8 * int(n),
                }
    return out


def _markdown(r: dict) -> str:
    s, m = r["summary"], r.get("machine")
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    when = (describe(r["meta"]) if m is None else  # written before the harness: its own provenance fields
            f"{r['date']}; {m['cpus']} cores; load average {m['load_avg_start'][0]:.1f} at the start, "
            f"{m['load_avg_end'][0]:.1f} at the end")  # fmt: skip
    lines = [
        "# Orchestration: driver CPU per model call (instant engine)",
        "",
        f"{when} (the machine is shared); trees: {r['trees']}; "
        f"{r['settings']['rounds']} interleaved rounds; steps {r['settings']['steps']} x {r['settings']['batch']} "
        "groups x 8 episodes, 2 model calls per episode; medians [min, max] over rounds. Driver CPU: the "
        "driver process's CPU time (all threads) over the measured steps per model call; whole tree: plus its "
        "rollout processes and sandboxes.",
        "",
        "| path | baseline driver ms/call | current driver ms/call | current, whole tree ms/call |",
        "|---|---|---|---|",
    ]
    for path, row in s.items():
        br, cr = (
            row.get("baseline_driver_ms_per_call_range") or [None, None],
            row["current_driver_ms_per_call_range"],
        )
        lines.append(
            f"| {path} | {f(row.get('baseline_driver_ms_per_call'))} [{f(br[0])}, {f(br[1])}] "
            f"| {f(row['current_driver_ms_per_call'])} [{f(cr[0])}, {f(cr[1])}] | {f(row['current_total_ms_per_call'])} |"
        )
    lines += [
        "",
        "| path | rollout processes | calls/s [min, max] | episodes/s | x of 1 process | driver ms/call |",
        "|---|---|---|---|---|---|",
    ]
    for path, row in s.items():
        for n, v in row["calls_per_s"].items():
            rng = row["calls_per_s_range"][n]
            d = row["sharded_driver_ms_per_call"].get(n, row["current_driver_ms_per_call"])
            lines.append(
                f"| {path} | {n} | {v:.0f} [{rng[0]:.0f}, {rng[1]:.0f}] | {row['episodes_per_s'][n]:.0f} "
                f"| {f(row['scaling'][n])} | {f(d)} |"
            )
    lines += ["", "| goal | target | measured | met |", "|---|---|---|---|"]
    for name, g in r["goals"].items():
        lines.append(f"| {name} | {g['goal']:g} | {g['measured']:.2f} | {'yes' if g['met'] else 'no'} |")
    for name, prof in r["profiles"].items():
        lines += [
            "",
            f"## Profile: {name} (driver CPU, sampled; {prof['driver_ms_per_call']:.2f} ms/call in this run)",
            "",
            "```",
            prof["table"],
            "```",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
