"""The TRL cell of benchmarks/slow_tools.py, on agent-rl's side: its warm start, its tuning pass, one run and its
scoring (each TRL process is benchmarks/trl_swe.py in .venv-trl, as a user runs TRL).

Warm start, made the way examples/swe_tiny.py makes ours: a tiny Qwen2 built from scratch by the same function,
seed and sizes, its tokenizer trained on the same corpus plus the tool-call format's fixed text (as ours has the
fenced format's), the Hermes tool template (agent_rl.openai.templates.HERMES_TOOLS, which TRL parses with its Qwen
response template); SFT with the same options on the same oracle traces (the train tasks' and the same extra ones),
each rendered as a `bash` tool call and its output (trl_swe.sft_row).

Tuning pass (as benchmarks/vs_trl.py tunes TRL): {1, 2} torch threads x {1, 2, 4, 8} micro-batches (those that
divide a step's samples), seed 0, --tune-steps steps each; the lowest median s/step after the first step is the
cell's configuration. Kept in WORK/trl_tune.json, so a resumed invocation does not tune again.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness.runner import tune as harness_tune
from benchmarks.harness.train import run_logged

ROOT = Path(__file__).resolve().parents[1]
TRL_SWE = ROOT / "benchmarks" / "trl_swe.py"
THREADS, MICRO_BATCHES = (1, 2), (1, 2, 4, 8)


@dataclass(frozen=True)
class TrlConfig:
    threads: int
    micro_batches: int

    @property
    def label(self) -> str:
        return f"{self.threads} thread(s), {self.micro_batches} micro-batch(es)"


def candidates(samples: int, quick: bool) -> list[TrlConfig]:
    out = [TrlConfig(t, m) for t in THREADS for m in MICRO_BATCHES if samples % m == 0]
    return out[:2] if quick else out


def warm_start(work: Path, tasks_dir: Path, extra: int, sft: dict) -> Path:
    """WORK/trl_sft: the TRL-format warm start (see the module docstring), built once."""
    from agent_rl.openai.templates import HERMES_TOOLS, set_template
    from agent_rl.tools.sft import run_sft
    from agent_rl.tools.tiny import build_tiny
    from benchmarks.trl_swe import format_texts, sft_row
    from envs.harbor.task import heldout, load_tasks
    from examples import swe_tiny

    out = work / "trl_sft"
    if (out / "config.json").is_file():
        return out
    base = work / "trl_base"
    traces = [
        (t.instruction, swe_tiny.fix_command(t.path))
        for t in load_tasks(tasks_dir)
        if not heldout(t.name, swe_tiny.HELDOUT)
    ]
    traces += swe_tiny.extra_traces(extra, swe_tiny.heldout_pairs(tasks_dir))
    if not (base / "config.json").is_file():
        texts = swe_tiny.corpus(tasks_dir) + format_texts()
        texts += [json.dumps({"command": swe_tiny.fix_command(t.path)}) for t in load_tasks(tasks_dir)]
        build_tiny(base, texts, seed=0, **swe_tiny.MODEL)
        set_template(base, HERMES_TOOLS)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    data = work / "trl_sft.jsonl"
    with open(data, "w") as f:
        f.writelines(json.dumps(sft_row(tok, i, c, swe_tiny.PASSED)) + "\n" for i, c in traces)
    run_sft(base, data, out, **sft)
    return out


def train_process(
    trl_py: Path, model: Path, env: Path, run_dir: Path, cfg: TrlConfig, *, seed: int, steps: int, every: int,
    prompts: int, lr: float,
) -> dict:  # fmt: skip
    """One `trl_swe.py train` process; its wall time and start."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(trl_py), str(TRL_SWE), "train", "--model", str(model), "--env", str(env)]
    cmd += ["--out", str(run_dir), "--seed", str(seed), "--steps", str(steps), "--every", str(every)]
    cmd += ["--prompts", str(prompts), "--lr", str(lr)]
    cmd += ["--threads", str(cfg.threads), "--micro-batches", str(cfg.micro_batches)]
    start = time.time()
    wall = run_logged(cmd, run_dir.parent / f"{run_dir.name}.log", f"{run_dir.name} (TRL)")
    return {"process_wall_s": wall, "process_start": start}


def score(
    trl_py: Path, env: Path, checkpoints: list[Path], limit: int, out: Path, seed: int = 0
) -> dict[str, float]:
    """{checkpoint dir: held-out solve rate} by `trl_swe.py score` (one process for all of them)."""
    model = checkpoints[0]
    cmd = [str(trl_py), str(TRL_SWE), "score", "--model", str(model), "--env", str(env), "--out", str(out)]
    cmd += ["--seed", str(seed), "--limit", str(limit), *map(str, checkpoints)]
    run_logged(cmd, out.with_suffix(".log"), "scoring TRL checkpoints")
    return json.loads(out.read_text())


def steps_of(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines()]


def tune(trl_py: Path, model: Path, env: Path, work: Path, *, samples: int, prompts: int, lr: float,
         steps: int, quick: bool, log) -> dict:  # fmt: skip
    """The tuning pass (module docstring): {'chosen': TrlConfig fields, 's_per_step': {label: median or None}}."""
    cache = work / "trl_tune.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    cands = candidates(samples, quick)

    def measure(_: str, c: TrlConfig) -> float | None:
        d = work / "trl_tune" / f"t{c.threads}_m{c.micro_batches}"
        log(f"TRL tuning: {c.label}")
        try:
            train_process(trl_py, model, env, d, c, seed=0, steps=steps, every=steps, prompts=prompts, lr=lr)
        except SystemExit as e:
            log(f"  failed, left out: {e}")
            return None
        shutil.rmtree(d / "checkpoints", ignore_errors=True)
        med = statistics.median(r["step_seconds"] for r in steps_of(d)[1:])
        log(f"  median {med:.2f} s/step")
        return med

    t = harness_tune({"trl": cands}, measure, label=lambda c: c.label)
    chosen = t["chosen"]["trl"]
    if chosen is None:
        raise SystemExit(f"TRL tuning pass: every candidate failed; see the logs under {work / 'trl_tune'}")
    out = {"chosen": asdict(chosen), "s_per_step": t["measured"], "steps": steps}
    cache.write_text(json.dumps(out, indent=1) + "\n")
    return out


def episode_stats(steps: list[dict]) -> tuple[dict, dict]:
    """(tools, in_flight) as slow_tools.py records them for agent-rl's runs, from trl_swe.py's steps.jsonl.
    Tool share: per step, TRL's tool and reward phases over generation + tools + reward (its phases are batch-wide:
    a rollout's own generation seconds are not separable); the tool and episode seconds per episode (tool: its
    commands and its verifier; episode: reset to verdict). In flight: the episodes' reset-to-verdict seconds over the
    steps' seconds (Little's law, as for agent-rl)."""
    eps = [e for s in steps for e in s["episodes"]]
    shares = []
    for s in steps:
        tools = s.get("phase_tools", 0.0) + s.get("phase_reward", 0.0)
        total = tools + s.get("phase_generate", 0.0)
        if total > 0:
            shares.append(tools / total)
    med = statistics.median
    wall = sum(s["step_seconds"] for s in steps)
    tools = {
        "episodes": len(eps),
        "tool_share_median": med(shares) if shares else None,
        "tool_share_mean": statistics.mean(shares) if shares else None,
        "tool_seconds_median": med(e["tool_s"] for e in eps) if eps else None,
        "episode_seconds_median": med(e["episode_s"] for e in eps) if eps else None,
        "infra_failed": sum(len(s.get("infra_failed", [])) for s in steps),
    }
    busy = sum(e["episode_s"] for e in eps)
    return tools, {"mean": busy / wall if wall > 0 else None, "episodes": len(eps)}
