"""Both learners where users run them: correctness on the device, the anchor, tokens/s, MFU and peak memory.

On a GPU machine (Python 3.12, torch, transformers, peft; no network, no pydantic / megatron-core / ray /
liger), from the repository root, after `bash scripts/gpu_wheels.sh` filled wheels/ on a machine with pip
access (the device tool carries that git-ignored folder with the tree):

    pip install --no-index --no-deps --target /tmp/site wheels/*.whl && PYTHONPATH=/tmp/site:. python benchmarks/gpu_learners.py

Results: benchmarks/results/gpu_learners.{json,md}. Sections, most important first, inside --budget-s
(default 330 s, so the whole run ends within 6 minutes on one H100/H200; cells left when it runs out are
recorded as not run):
(a) correctness (fp32, a small model): learner log-probs on the device vs CPU, one VCPO step on both
    (loss, grad norm, ESS), Megatron TP=1 vs the torch learner's log-probs on the device;
(b) the anchor: a transformers training step with SDPA attention and Liger's fused linear cross-entropy
    (fp32 master weights, bf16 autocast, fused AdamW) on the same batches as the learner cells, at its best: a
    short tuning pass per batch (`tune_anchor`: all rows in one forward, then fewer, each with and without
    gradient checkpointing; whatever fits the device) picks the fastest, which is then timed;
(c) both learners (TorchRank; MegatronRank in a 1-rank process group; no Ray) on the Qwen2.5-0.5B shape
    (random init, bf16 autocast) at 4k, 8k, 32k and 128k tokens per trajectory: recompute on and off, exact
    and proxy OPOB, LoRA; tokens/s, MFU (6 * params * tokens against the device's dense bf16 peak) and
    torch.cuda.max_memory_allocated, each cell's ratio to the tuned anchor of the same batch, exact OPOB with
    ghost norms (vcpo/ghost.py) and with a backward per trajectory,
    and the memory model's estimate beside the measured peak. A cell the memory model rules out is skipped
    with its estimate; one that runs out of memory is recorded as OOM and the run goes on.

    --cpu-smoke    every section with tiny shapes on CPU (the anchor without Liger); tests/benchmarks run it
    --cpu-memory   the CPU table: peak memory of one step, both learners, 1k-16k tokens per trajectory, with
                   the memory model's estimate (benchmarks/results/learner_memory_cpu.{json,md})
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _learner_bench import GROUP, QWEN25_05B, SMALL, Cell, Rank, batch, recipe, timed_steps, write_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Dense bf16 peak TFLOP/s by device name (vendor data sheets, without sparsity); the first match wins.
PEAK_TFLOPS = (
    ("H200 NVL", 835.0), ("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0),
    ("GH200", 989.0), ("A100", 312.0), ("L40S", 362.0),
)  # fmt: skip
GPU_LENGTHS = {4096: 8, 8192: 4, 32768: 2, 131072: 2}  # tokens per trajectory -> trajectories per step
SMOKE_LENGTHS = {64: 4, 256: 2}
MICRO_BATCH_TOKENS = 16384  # proxy OPOB and the anchor: rows per forward = 16384 // length (at least 1)
# fp32 on two devices: the same sums in other orders (reductions over hidden, vocab and layers, a few
# thousand terms): each log-prob within ~1e3 float32 eps (1.2e-7) of the other.
LOGPROB_ATOL = 1e-4
# The step's loss, grad norm and ESS are sums and ratios of such log-probs over <= 256 tokens a trajectory
# (the sequence log-weight adds them up): relative 1e-3.
STEP_RTOL = 1e-3


def peak_tflops(device_name: str) -> float | None:
    return next((tf for key, tf in PEAK_TFLOPS if key in device_name), None)


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "can't allocate memory" in str(e)


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- (a) correctness ---------------------------------------------------------------------------------


def correctness(model_dir: Path, device: str) -> dict[str, Any]:
    """fp32 log-probs and one VCPO step of the torch learner on `device` vs CPU; Megatron vs torch on `device`."""
    cell = Cell("torch", length=128, rows=4, dtype="float32")
    b = batch(cell.rows, cell.length, SMALL["vocab_size"], seed=1)
    ref, dev = Rank(model_dir, cell, "cpu"), Rank(model_dir, cell, device)
    with torch.no_grad():
        lp_ref = ref.logprobs(b.input_ids, b.attention_mask)
        lp_dev = dev.logprobs(b.input_ids.to(device), b.attention_mask.to(device)).cpu()
    out: dict[str, Any] = {}
    diff = float((lp_ref - lp_dev).abs().max())
    out["logprobs_device_vs_cpu"] = {"max_abs_diff": diff, "atol": LOGPROB_ATOL, "ok": diff <= LOGPROB_ATOL}
    m_ref, m_dev = ref.step(b), dev.step(b.to(device))
    keys = ("loss", "grad_norm", "ess")
    rel = {k: abs(m_ref[k] - m_dev[k]) / max(abs(m_ref[k]), 1e-12) for k in keys}
    out["vcpo_step_device_vs_cpu"] = {
        "cpu": {k: m_ref[k] for k in keys}, "device": {k: m_dev[k] for k in keys}, "rel_diff": rel,
        "rtol": STEP_RTOL, "ok": all(v <= STEP_RTOL for v in rel.values()),
    }  # fmt: skip
    del ref, m_ref
    try:
        meg = Rank(model_dir, replace(cell, backend="megatron"), device)
    except ImportError as e:
        out["megatron_vs_torch_logprobs"] = {"skipped": str(e), "ok": None}
    else:
        dev = Rank(model_dir, cell, device)  # fresh weights: `dev` stepped above
        ids, mask = b.input_ids.to(device), b.attention_mask.to(device)
        with torch.no_grad():
            diff = float((meg.logprobs(ids, mask) - dev.logprobs(ids, mask)).abs().max())
        out["megatron_vs_torch_logprobs"] = {
            "max_abs_diff": diff,
            "atol": LOGPROB_ATOL,
            "ok": diff <= LOGPROB_ATOL,
        }
        del meg
    del dev
    free(device)
    return out


# -- (b) the anchor: what a user gets from transformers + Liger ---------------------------------------


class Anchor:
    """A transformers training step: SDPA attention, fp32 master weights, bf16 autocast, fused AdamW (CUDA), and
    Liger's fused linear cross-entropy on the loss tokens (plain cross-entropy over logits where Liger is absent)."""

    def __init__(self, model_dir: Path, cell: Cell, device: str, *, liger: bool):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.to(device).train()
        self.model.config.use_cache = False
        self.configure(cell)
        cuda = device.startswith("cuda")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, weight_decay=0.1, fused=cuda)
        self.device = device
        self.lce = None
        if liger:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            self.lce = LigerFusedLinearCrossEntropyLoss(reduction="sum")

    def configure(self, cell: Cell) -> None:
        """Micro-batch rows and checkpointing of `cell` from now on (the tuning pass reuses one model)."""
        self.cell = cell
        if (
            cell.recompute
        ):  # transformers 5 renamed it; older releases have gradient_checkpointing_enable only
            getattr(self.model, "activation_checkpointing_enable", self.model.gradient_checkpointing_enable)()
        else:
            getattr(
                self.model, "activation_checkpointing_disable", self.model.gradient_checkpointing_disable
            )()

    def step(self, b) -> dict[str, float]:
        labels = torch.where(b.loss_mask[:, 1:] > 0, b.input_ids[:, 1:], -100)
        n_loss = float((labels != -100).sum())
        rows = self.cell.micro_batch_rows
        total = 0.0
        for i in range(0, b.size, rows):
            ids, lab = b.input_ids[i : i + rows], labels[i : i + rows]
            with torch.autocast(
                self.device.split(":")[0], dtype=torch.bfloat16, enabled=self.cell.dtype == "bfloat16"
            ):
                hidden = self.model.model(input_ids=ids).last_hidden_state[:, :-1]
                if self.lce is not None:
                    loss = self.lce(
                        self.model.lm_head.weight, hidden.reshape(-1, hidden.shape[-1]), lab.reshape(-1)
                    )
                else:
                    logits = self.model.lm_head(hidden).float()
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="sum"
                    )
            (loss / n_loss).backward()
            total += float(loss.detach())
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"loss": total / n_loss, "grad_norm": norm}


# -- (c) cells -----------------------------------------------------------------------------------------


def cell_plan(lengths: dict[int, int], *, smoke: bool = False) -> list[Cell]:
    """Every cell, most important first: the anchor, torch proxy+ckpt and exact (ghost norms)+ckpt at the first
    length, Megatron at the second, the third length's cells, the first length's without recompute and exact with
    a backward per trajectory, the fourth's with recompute (does it fit), then the rest. An anchor cell stands for its length's tuning pass (`tune_anchor`). `smoke`: one cell of each
    kind (the first length)."""
    ls = list(lengths)

    def c(backend: str, length: int, **kw: Any) -> Cell:
        return Cell(backend, length, lengths[length], micro_batch_tokens=MICRO_BATCH_TOKENS, **kw)  # type: ignore[arg-type]

    first = [
        c("anchor", ls[0]), c("torch", ls[0], opob="proxy", recompute=True),
        c("torch", ls[0], recompute=True, norms="ghost"), c("megatron", ls[1]),
    ]  # fmt: skip
    long = [] if len(ls) < 3 else [
        c("anchor", ls[2]), c("torch", ls[2], opob="proxy", recompute=True),
        c("torch", ls[2], recompute=True, norms="ghost"),
        c("torch", ls[2], recompute=True), c("megatron", ls[2], recompute=True),
    ]  # fmt: skip
    # the first length without recompute, and exact OPOB with a backward per trajectory beside the ghost cell:
    # issue 63's goal (exact <= 1.15x proxy) at the length where the per-trajectory backward was host-bound
    short = [
        c("torch", ls[0], opob="proxy"), c("torch", ls[0], norms="ghost"), c("torch", ls[0], recompute=True),
    ]  # fmt: skip
    longest = [] if len(ls) < 4 else [
        c("anchor", ls[3]), c("torch", ls[3], opob="proxy", recompute=True),
        c("megatron", ls[3], recompute=True),
    ]  # fmt: skip
    rest = []
    for length in ls[:1] if smoke else ls:
        rest.append(c("anchor", length))
        for recompute in (False, True):
            rest += [
                c("torch", length, opob="proxy", recompute=recompute),
                c("torch", length, recompute=recompute, norms="ghost"),
                c("torch", length, recompute=recompute),
                c("megatron", length, recompute=recompute),
            ]
        rest.append(c("torch", length, opob="proxy", recompute=True, lora=True))
    seen: set[Cell] = set()
    return [x for x in [*first, *long, *short, *longest, *rest] if not (x in seen or seen.add(x))]


def run_cell(
    cell: Cell, model_dir: Path, device: str, *, liger: bool, memory: int, tflops: float | None
) -> dict:
    """Build, warm up, time `cell.repeats` steps; the memory model's estimate beside the measured peak."""
    from agent_rl.learners import memory as mm

    row: dict[str, Any] = cell.as_dict()
    dims = mm.ModelDims.from_model_dir(model_dir)
    if cell.backend != "anchor":
        est = mm.step_memory(dims, setup_for(cell, device, dims), cell.length)
        row["estimate_gib"] = est.total / mm.GiB
        if est.total > memory:
            return row | {
                "status": "skipped",
                "reason": f"memory model: {est.describe()} > {memory / mm.GiB:.1f} GiB",
            }
    b = batch(cell.rows, cell.length, dims.vocab, device=device)
    runner = None
    t0 = time.monotonic()
    try:
        runner = (
            Anchor(model_dir, cell, device, liger=liger)
            if cell.backend == "anchor"
            else Rank(model_dir, cell, device)
        )
        row["build_s"] = time.monotonic() - t0
        timing = timed_steps(lambda: runner.step(b), cell.repeats, device)
    except Exception as e:  # noqa: BLE001 - one cell's failure is that cell's result; the run goes on
        status = "oom" if is_oom(e) else "error"
        return row | {"status": status, "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    finally:
        runner = None  # the model and optimizer go before the next cell is built
        free(device)
    row |= {
        "status": "ok", "step_s": timing.step_s, "steps_s": list(timing.steps_s),
        "tokens_per_s": cell.tokens / timing.step_s, "loss": timing.metrics.get("loss"),
        "peak_gib": timing.peak_bytes / 2**30 if timing.peak_bytes is not None else None,
        "wall_s": time.monotonic() - t0,
    }  # fmt: skip
    row["mfu"] = 6 * dims.params * row["tokens_per_s"] / (tflops * 1e12) if tflops else None
    return row


def setup_for(cell: Cell, device: str, dims):
    """The memory model's view of a cell: through the recipe a user would write for it, as `agent-rl train` sees it."""
    from agent_rl.learners import memory as mm

    device_kind = "cuda" if device.startswith("cuda") else "cpu"
    return mm.setup_of(recipe(Path("model"), cell), dims, device_kind, group_size=GROUP)  # type: ignore[arg-type]


def capacity(device: str) -> dict[str, Any]:
    """The memory model's longest trajectory for each learner setup on the 0.5B shape, on this device's memory."""
    from agent_rl.learners import memory as mm

    mem = mm.device_memory()
    dims = mm.ModelDims.from_config(QWEN25_05B | {"model_type": "qwen2"})
    setups = {}
    for backend in ("torch", "megatron"):
        for opob in ("exact", "proxy") if backend == "torch" else ("exact",):
            for recompute in (False, True):
                cell = Cell(
                    backend, 1, 2, recompute=recompute, opob=opob, micro_batch_tokens=MICRO_BATCH_TOKENS
                )  # type: ignore[arg-type]
                name = cell.name.rsplit(" ", 1)[0]
                setups[name] = mm.max_trajectory_tokens(dims, setup_for(cell, device, dims), mem.bytes)
    return {"memory": mem.name, "memory_gib": mem.bytes / mm.GiB, "max_trajectory_tokens": setups}


def anchor_candidates(cell: Cell, least_rows: int | None = None) -> list[Cell]:
    """The anchor's configurations for `cell`'s batch, likely fastest first: all rows in one forward, then half
    as many per forward, down to `least_rows` (default: the learner's micro-batch, MICRO_BATCH_TOKENS // length),
    each without and with gradient checkpointing; one timed step each."""
    least = least_rows or max(1, min(cell.rows, MICRO_BATCH_TOKENS // cell.length))
    rows, sizes = cell.rows, []
    while rows >= least:
        sizes.append(rows)
        rows //= 2
    return [replace(cell, micro_batch_tokens=n * cell.length, recompute=r, repeats=1)
            for n in sizes for r in (False, True)]  # fmt: skip


def tune_anchor(cell: Cell, model_dir: Path, device: str, *, liger: bool, memory: int, tflops: float | None,
                least_rows: int | None = None) -> list[dict]:  # fmt: skip
    """The tuning pass (as benchmarks/vs_trl.py tunes TRL): every candidate that fits the device (an OOM does not)
    gets a warm-up and one timed step; the fastest is then timed with `cell.repeats` and recorded under the
    plan's name with `anchor_best`. Rows: the candidates (`tuning`), then the chosen cell."""
    measure = run_cell
    candidates = anchor_candidates(cell, least_rows)
    tried = []
    for cand in candidates:
        row = measure(cand, model_dir, device, liger=liger, memory=memory, tflops=tflops)
        row |= {"name": f"{cand.name} mb{cand.micro_batch_rows} (tuning)", "tuning": True}
        tried.append(row)
    ok = [(r, c) for r, c in zip(tried, candidates, strict=True) if r.get("status") == "ok"]
    if not ok:
        return tried + [
            cell.as_dict() | {"status": "error", "reason": "no anchor configuration ran", "anchor_best": True}
        ]
    _, best = max(ok, key=lambda rc: rc[0]["tokens_per_s"])
    row = measure(
        replace(best, repeats=cell.repeats), model_dir, device, liger=liger, memory=memory, tflops=tflops
    )
    row |= {"name": cell.name, "anchor_best": True, "micro_batch_rows": best.micro_batch_rows,
            "recompute": best.recompute, "reason": f"tuned: {best.micro_batch_rows} rows per forward"
            f"{', checkpointing' if best.recompute else ''}, fastest of {len(tried)} tried"}  # fmt: skip
    return tried + [row]


def ratios_to_anchor(rows: list[dict]) -> None:
    """Every learner cell against the tuned anchor of its batch (whatever its checkpointing)."""
    anchors = {(r["length"], r["rows"]): r for r in rows if r.get("anchor_best")}
    for r in rows:
        a = anchors.get((r["length"], r["rows"]))
        if r["backend"] != "anchor" and r.get("status") == "ok" and a and a.get("status") == "ok":
            r["tokens_per_s_vs_anchor"] = r["tokens_per_s"] / a["tokens_per_s"]
            if r.get("peak_gib") and a.get("peak_gib"):
                r["peak_vs_anchor"] = r["peak_gib"] / a["peak_gib"]


def run_cells(
    plan: list[Cell],
    model_dir: Path,
    device: str,
    *,
    budget_s: float,
    start: float,
    liger: bool,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
    least_anchor_rows: int | None = None,
) -> list[dict]:
    """Cells in order while the budget lasts; a cell predicted to end past it (from the tokens/s of cells already
    measured, and the slowest build so far) is recorded as not run. `on_row` sees the rows after each cell (the
    run writes them, so a run killed part-way keeps what it measured)."""
    from agent_rl.learners import memory as mm

    memory = mm.device_memory().bytes
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu"
    tflops = peak_tflops(name) if device.startswith("cuda") else None
    rows: list[dict] = []
    for cell in plan:
        ok = [r for r in rows if r.get("status") == "ok"]
        speed = min((r["tokens_per_s"] for r in ok if r["backend"] == cell.backend), default=None)
        speed = speed or min((r["tokens_per_s"] for r in ok), default=None)
        build = max((r.get("build_s", 0.0) for r in ok), default=0.0)
        predicted = build + (1 + cell.repeats) * cell.tokens / speed if speed else 0.0
        left = budget_s - (time.monotonic() - start)
        if predicted > left or left <= 0:
            rows.append(
                cell.as_dict()
                | {"status": "not_run", "reason": f"budget: predicted {predicted:.0f} s, {left:.0f} s left"}
            )
            continue
        print(f"[{time.monotonic() - start:6.1f} s] {cell.name}", flush=True)
        if cell.backend == "anchor":
            rows += tune_anchor(
                cell,
                model_dir,
                device,
                liger=liger,
                memory=memory,
                tflops=tflops,
                least_rows=least_anchor_rows,
            )
        else:
            rows.append(run_cell(cell, model_dir, device, liger=liger, memory=memory, tflops=tflops))
        print(
            f"          -> {rows[-1]['status']} {rows[-1].get('tokens_per_s', '')} {rows[-1].get('reason', '')}",
            flush=True,
        )
        on_row(rows)
    ratios_to_anchor(rows)
    return rows


# -- the run, and its report --------------------------------------------------------------------------


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "peft", "megatron-core", "liger-kernel", "pydantic"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout)"


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    device = args.device
    smoke = args.cpu_smoke
    liger = device.startswith("cuda") and not args.no_liger
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": args.commit or git_commit(),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else f"cpu ({platform.processor() or platform.machine()})",
        "versions": versions(), "budget_s": args.budget_s, "smoke": smoke, "liger": liger,
        "shape": "small (cpu smoke)" if smoke else "Qwen2.5-0.5B (random init)",
    }  # fmt: skip
    if device.startswith("cuda"):
        meta["peak_tflops"] = peak_tflops(meta["device"])
    with tempfile.TemporaryDirectory() as tmp:
        small = write_model(Path(tmp) / "small", SMALL)
        print(f"[{time.monotonic() - start:6.1f} s] correctness", flush=True)
        checks = correctness(small, device)
        big = small if smoke else write_model(Path(tmp) / "qwen2.5-0.5b", QWEN25_05B, device=device)
        plan = cell_plan(SMOKE_LENGTHS if smoke else GPU_LENGTHS, smoke=smoke)
        if smoke:  # one timed step, CPU-sized micro-batches
            plan = [replace(c, repeats=1, micro_batch_tokens=256) for c in plan]
        partial = args.out / "gpu_learners.partial.json"
        partial.parent.mkdir(parents=True, exist_ok=True)

        def keep(rows: list[dict]) -> None:
            partial.write_text(
                json.dumps({"meta": meta, "correctness": checks, "cells": rows}, indent=2) + "\n"
            )

        # the smoke: every cell whatever the budget (a loaded CPU would cut cells at random), and a tuning pass
        # down to one row per forward (its learner micro-batch holds every row: one size alone tunes nothing)
        budget = math.inf if smoke else args.budget_s
        cells = run_cells(plan, big, device, budget_s=budget, start=start, liger=liger, on_row=keep,
                          least_anchor_rows=1 if smoke else None)  # fmt: skip
        partial.unlink(missing_ok=True)
    meta["elapsed_s"] = time.monotonic() - start
    return {"meta": meta, "correctness": checks, "cells": cells, "capacity": capacity(device)}


def _f(x: Any, fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    lines = [
        "# Both learners on one GPU: correctness, tokens/s, MFU, peak memory (benchmarks/gpu_learners.py)", "",
        f"{m['date']}, commit {m['commit']}, {m['device']}; {m['shape']}; versions {json.dumps(m['versions'])}; "
        f"budget {m['budget_s']:.0f} s, ran {m['elapsed_s']:.0f} s. Anchor: transformers + SDPA + "
        f"{'Liger fused linear cross-entropy' if m['liger'] else 'plain cross-entropy (no Liger)'}, fp32 master weights, "
        "bf16 autocast, AdamW. MFU = 6 x params x tokens/s over the device's dense bf16 peak.", "",
        "## Correctness (fp32, small model)", "",
    ]  # fmt: skip
    for name, c in res["correctness"].items():
        lines.append(f"- {name}: {'ok' if c.get('ok') else 'FAILED' if c.get('ok') is False else 'skipped'} "
                     f"{json.dumps({k: v for k, v in c.items() if k != 'ok'})}")  # fmt: skip
    lines += [
        "", "## Cells", "",
        "| cell | status | step s | tokens/s | MFU | peak GiB | model GiB | vs anchor tok/s | vs anchor mem | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["cells"]:
        lines.append(
            f"| {r['name']} | {r['status']} | {_f(r.get('step_s'), '.2f')} | {_f(r.get('tokens_per_s'), ',.0f')} | "
            f"{_f(r.get('mfu'), '.1%')} | {_f(r.get('peak_gib'), '.1f')} | {_f(r.get('estimate_gib'), '.2f')} | "
            f"{_f(r.get('tokens_per_s_vs_anchor'), '.2f')} | {_f(r.get('peak_vs_anchor'), '.2f')} | {r.get('reason', '')} |"
        )
    cap = res["capacity"]
    lines += [
        "", f"## Longest trajectory the memory model allows: 0.5B shape, bf16, {cap['memory']} ({cap['memory_gib']:.1f} GiB)",
        "", "| learner setup | tokens |", "|---|---|",
        *(f"| {k} | {v:,} |" for k, v in cap["max_trajectory_tokens"].items()),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def write(res: dict[str, Any], out: Path, stem: str, md: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{stem}.md").write_text(md)
    print(f"wrote {out / stem}.json and .md", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--cpu-smoke", action="store_true", help="every section with tiny shapes on CPU")
    ap.add_argument(
        "--cpu-memory", action="store_true", help="the CPU peak-memory table (learner_memory_cpu.*)"
    )
    ap.add_argument("--backends", default="torch,megatron", help="--cpu-memory: the learners to measure")
    ap.add_argument("--no-liger", action="store_true", help="the anchor without Liger (plain cross-entropy)")
    ap.add_argument(
        "--commit", help="the commit measured (default: git rev-parse; the GPU machine has no .git)"
    )
    ap.add_argument(
        "--out", type=Path, help="default: benchmarks/results; --cpu-smoke: runs/bench/gpu_learners"
    )
    args = ap.parse_args(argv)
    if args.out is None:  # a smoke run never writes over the committed GPU results
        args.out = ROOT / "runs" / "bench" / "gpu_learners" if args.cpu_smoke else RESULTS
    if args.cpu_memory:
        from _memory_table import run_table

        run_table(args.out, commit=args.commit or git_commit(), backends=tuple(args.backends.split(",")))
        return 0
    if args.cpu_smoke:
        args.device = "cpu"
        if args.out in (None, RESULTS):  # a smoke never writes over the GPU figures
            args.out = Path(tempfile.mkdtemp(prefix="gpu_learners_smoke_")) / "runs"
    elif args.out is None:
        args.out = RESULTS
    res = run(args)
    write(res, args.out, "gpu_learners", markdown(res))
    failed = [k for k, v in res["correctness"].items() if v.get("ok") is False]
    if failed:
        print(f"correctness FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
