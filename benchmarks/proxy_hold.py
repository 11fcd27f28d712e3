"""Proxy OPOB under activation recompute, a group split over micro-batches: its graphs held until the baseline
(`vcpo.StepConfig.proxy_hold_group`, what the torch learner does with gradient checkpointing) against a forward
without gradients for the baseline first (what it did before, and still does without checkpointing).

    nice -n 15 .venv/bin/python benchmarks/proxy_hold.py [--model DIR | --shape qwen2.5-0.5b] [--length 1024]
        [--rounds 2] [--repeats 2] [--device cpu|cuda] [--dtype float32|bfloat16]
        # -> benchmarks/results/proxy_hold.{json,md}
    # on a GPU (scripts/gpu_checks.sh's `hold` part): --shape qwen2.5-0.5b --device cuda --dtype bfloat16 --length 32768

One torch-learner step (`TorchRank`, proxy OPOB, gradient checkpointing, one torch thread on CPU) on one group of
two trajectories of `--length` tokens, one trajectory per micro-batch (`micro_batch_tokens` = length), so the
group's baseline needs both before either backward. `--model`: an HF directory (SmolLM2-135M-Instruct:
`agent-rl prepare smollm2 --out DIR`); `--shape`: a random model built here (tiny: the tests' tiny Qwen2, the
default; qwen2.5-0.5b: gpu_learners' shape). Each variant runs in a fresh process (its peak memory is its own),
the two alternating for `--rounds` rounds; per process one warm-up step and `--repeats` timed steps. Reported:
seconds per step (on CPU the process's own CPU seconds, robust to other load on a shared machine, which the
ratio uses; wall seconds too, synchronised on CUDA, which the ratio uses there), layer 0's attention forwards
per step (the recomputed forward counts: 3 per trajectory before, 2 held), peak memory and the memory model's
estimate of each (`agent_rl.learners.memory`). Peak memory is of live tensors over a step after the warm-up:
torch.cuda.max_memory_allocated on CUDA; on CPU torch's CPU allocator under the profiler, in one more fresh
process per variant, untimed (benchmarks/_cpu_peak.py's "tensors" counter; resident memory also counts the
autograd graph, kernel scratch and malloc arenas, hundreds of MiB here).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _learner_bench import QWEN25_05B, SMALL, Cell, Rank, batch, sync, write_model  # noqa: E402
from bench_paths import ROOT, portable  # noqa: E402

VARIANTS = ("forward-only", "held")  # vcpo.StepConfig.proxy_hold_group False / True
SHAPES = {"tiny": SMALL, "qwen2.5-0.5b": QWEN25_05B}


def cell(length: int, dtype: str = "float32") -> Cell:
    return Cell("torch", length, 2, recompute=True, opob="proxy", dtype=dtype, micro_batch_tokens=length)  # type: ignore[arg-type]


def child(model: Path, length: int, variant: str, repeats: int, device: str, dtype: str) -> dict:
    """One variant in this process: warm-up, then `repeats` timed steps."""
    torch.set_num_threads(1)
    rank, b = _built(model, length, variant, device, dtype)
    calls = [0]
    attention0 = (
        rank.model.get_decoder().layers[0].self_attn
    )  # the recomputed forward calls it again (not its layer's hook)
    attention0.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    rank.step(b)
    sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    cpu, wall, forwards = [], [], []
    for _ in range(repeats):
        calls[0] = 0
        c0, w0 = time.process_time(), time.perf_counter()
        rank.step(b)
        sync(device)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        forwards.append(calls[0])
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None  # CPU: memory_child
    return {"cpu_s": cpu, "wall_s": wall, "attention0_forwards": forwards, "peak_bytes": peak}


def memory_child(model: Path, length: int, variant: str, dtype: str) -> dict:
    """CPU: the peak of live tensor bytes over the step after the warm-up, counted from before the rank is built."""
    from _cpu_peak import MEASURED, tensor_peak

    torch.set_num_threads(1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        rank, b = _built(model, length, variant, "cpu", dtype)
        rank.step(b)
        with torch.profiler.record_function(MEASURED):
            rank.step(b)
    return {"peak_bytes": tensor_peak(prof, rank.model)}


def _built(model: Path, length: int, variant: str, device: str, dtype: str) -> tuple[Rank, object]:
    c = cell(length, dtype)
    rank = Rank(model, c, device)
    step = (
        rank.impl._step
    )  # the rank's vcpo.Step: the learner sets proxy_hold_group from gradient checkpointing
    step.cfg = replace(step.cfg, proxy_hold_group=variant == "held")
    return rank, batch(c.rows, length, rank.vocab, device=device)


def estimate(model: Path, length: int, variant: str, device: str, dtype: str) -> int:
    from gpu_learners import setup_for

    from agent_rl.learners import memory as mm

    dims = mm.ModelDims.from_model_dir(model)
    setup = setup_for(cell(length, dtype), device, dims)
    return mm.step_memory(dims, setup if variant == "held" else replace(setup, group_rows=1), length).total


def markdown(out: dict) -> str:
    rows, cuda = out["variants"], out["device"].startswith("cuda")
    time_label = "wall s (synchronised)" if cuda else "CPU s"
    lines = [
        "# Proxy OPOB under recompute: a split group's graphs held, or a forward without gradients first",
        "",
        f"`{out['command']}`; {out['date']}, commit {out['commit']}; {out['machine']}. Model: {out['model']}; one "
        f"group of 2 x {out['length']} tokens, one trajectory per micro-batch, {out['dtype']}, gradient "
        f"checkpointing, {out['device']}{'' if cuda else ', one torch thread'}; {out['rounds']} rounds of fresh "
        f"processes (alternating), {out['repeats']} timed steps each after a warm-up. The ratio is of {time_label} "
        "per step"
        + ("" if cuda else " (the process's own CPU seconds)")
        + ", median over all rounds' steps. Peak tensor memory: "
        + (
            "torch.cuda.max_memory_allocated over the timed steps."
            if cuda
            else "live tensor bytes as torch's CPU "
            "allocator counts them, over a step after the warm-up, in one more process per variant (untimed)."
        ),
        "",
        "| variant | CPU s / step | wall s / step | layer-0 attention forwards / step | peak tensor memory (MiB) "
        "| memory model (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        r = rows[v]
        lines.append(
            f"| {v} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['attention0_forwards']} | {r['peak_bytes'] / 2**20:.0f} "
            f"| {r['estimate_bytes'] / 2**20:.0f} |"
        )
    lines += [
        "",
        f"Held / forward-only, {time_label} per step: **{out['ratio']:.2f}** (per round: "
        f"{', '.join(f'{x:.2f}' for x in out['ratio_rounds'])}).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument(
        "--model", type=Path, help="an HF model directory (SmolLM2: agent-rl prepare smollm2 --out DIR)"
    )
    where.add_argument(
        "--shape", choices=SHAPES, help="a random model of this shape, built here (default: tiny)"
    )
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU)")
    ap.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="the learner's compute dtype"
    )
    ap.add_argument(
        "--commit", help="the commit measured (default: git rev-parse; the GPU machine has no .git)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "proxy_hold")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)  # a CPU child: tensor bytes
    args = ap.parse_args(argv)
    if args.length < 8:
        ap.error(f"--length {args.length}: at least 8 tokens")
    if args.model is not None and not (args.model / "config.json").is_file():
        ap.error(
            f"--model {args.model}: no config.json there (an HF model directory; agent-rl prepare smollm2 --out DIR)"
        )
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        ap.error(f"--device {args.device!r}: cpu or cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no GPU here ({torch.__version__})")
    if args.variant is not None and args.memory:
        print(json.dumps(memory_child(args.model, args.length, args.variant, args.dtype)))
        return 0
    if args.variant is not None:
        print(json.dumps(child(args.model, args.length, args.variant, args.repeats, args.device, args.dtype)))
        return 0
    shape = args.shape or "tiny"
    model = args.model or write_model(Path(tempfile.mkdtemp()) / shape, SHAPES[shape], device=args.device)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    cuda = args.device.startswith("cuda")

    def spawn(v: str, *extra: str) -> dict:
        proc = subprocess.run(
            [sys.executable, __file__, "--model", str(model), "--length", str(args.length), "--variant", v,
             "--repeats", str(args.repeats), "--device", args.device, "--dtype", args.dtype, *extra],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode:
            raise SystemExit(f"proxy_hold: the {v} process failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    for r in range(args.rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            print(f"proxy_hold: round {r + 1}/{args.rounds}, {v}", file=sys.stderr, flush=True)
            runs[v].append(spawn(v))
    peaks = {}
    for v in VARIANTS:
        if cuda:
            peaks[v] = min(run["peak_bytes"] for run in runs[v])
        else:
            print(f"proxy_hold: {v}, peak tensor memory (profiled, untimed)", file=sys.stderr, flush=True)
            peaks[v] = spawn(v, "--memory")["peak_bytes"]
    key = "wall_s" if args.device.startswith("cuda") else "cpu_s"  # what the ratio compares
    variants = {
        v: {
            "cpu_s": statistics.median(x for run in runs[v] for x in run["cpu_s"]),
            "wall_s": statistics.median(x for run in runs[v] for x in run["wall_s"]),
            "attention0_forwards": max(x for run in runs[v] for x in run["attention0_forwards"]),
            "peak_bytes": peaks[v],
            "estimate_bytes": estimate(model, args.length, v, args.device, args.dtype),
            "runs": runs[v],
        }
        for v in VARIANTS
    }
    per_round = [
        statistics.median(h[key]) / statistics.median(f[key])
        for h, f in zip(runs["held"], runs["forward-only"], strict=True)
    ]
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    commit = args.commit or git.stdout.strip() or "unknown"
    gpu = f", {torch.cuda.get_device_name()}" if args.device.startswith("cuda") else ""
    out = {
        "command": portable(
            " ".join(["benchmarks/proxy_hold.py", *(argv if argv is not None else sys.argv[1:])])
        ),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
        "machine": f"{platform.machine()}{gpu}, torch {torch.__version__}",
        "model": portable(str(args.model))
        if args.model
        else f"a random {shape} Qwen2 ({SHAPES[shape]['num_hidden_layers']} layers, hidden {SHAPES[shape]['hidden_size']})",
        "device": args.device,
        "dtype": args.dtype,
        "length": args.length,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "variants": variants,
        "ratio_of": key,
        "ratio": variants["held"][key] / variants["forward-only"][key],
        "ratio_rounds": per_round,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(out) + "\n")
    print(markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
