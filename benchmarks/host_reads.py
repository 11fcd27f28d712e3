"""How often one learner step makes the host wait for the device: the calls counted, per step, through a real
torch-learner rank (`TorchRank`, proxy OPOB, the tests' small Qwen2 shape) for several micro-batch layouts, exact
OPOB with ghost norms (vcpo/ghost.py) in one, and
(`--megatron`, the default on CUDA) through a Megatron rank (exact OPOB).

    .venv/bin/python benchmarks/host_reads.py [--device cpu|cuda] [--megatron]
        # -> benchmarks/results/host_reads.{json,md}

A read of a tensor's value (`.item()`, `bool()`, `int()`, `float()`, `.tolist()`, `torch.equal`), a copy to the
host (`.cpu()`), and an op whose output size depends on the values (`nonzero`, `unique`, `masked_select`,
indexing with a boolean mask, `repeat_interleave` without `output_size`, one-argument `torch.where`) each wait,
on a GPU, for every kernel queued before them; between two of them the GPU idles while the host launches the
next ones. On the CPU nothing waits, so the calls are counted instead (`HostReads`, a `TorchFunctionMode` sees
every one), which tells a step that plans from Python ints from one that reads tensors; a read of a tensor that
already is on the host counts too, so on a GPU the syncs are at most the count. Not counted: `.to("cpu")` (the
same call moves a tensor to the device the code runs on); code that wants a copy on the host writes `.cpu()`.
On CUDA, `cuda_syncs` counts the real waits with torch's sync debug mode (`--device cuda` reports both).
The tests use both (tests/vcpo/test_host_reads.py, tests/learners/test_packed_logprobs.py).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import platform
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _learner_bench import SMALL, Cell, Rank, batch, write_model  # noqa: E402
from bench_paths import ROOT, portable  # noqa: E402

READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "nonzero", "argwhere",
         "unique", "unique_consecutive", "masked_select", "equal", "allclose"}  # fmt: skip


def _has_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


class HostReads(TorchFunctionMode):
    """`with HostReads() as reads:` ... `reads.count`, `reads.where` ("package/file:line function" of each call),
    `reads.functions` (the set of those functions)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []
        self.paused = False

    @property
    def count(self) -> int:
        return len(self.where)

    @property
    def functions(self) -> set[str]:
        return {w.rsplit(" ", 1)[-1] for w in self.where}

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Calls made inside are not counted (a function whose reads another test counts)."""
        self.paused, was = True, self.paused
        try:
            yield
        finally:
            self.paused = was

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if not self.paused and self._reads(func, args, kwargs):
            self.where.append(_site())
        return func(*args, **kwargs)

    @staticmethod
    def _reads(func: Any, args: tuple, kwargs: dict) -> bool:
        name = getattr(func, "__name__", "")
        if name in READS:
            return True
        if name in ("__getitem__", "__setitem__"):
            return len(args) > 1 and _has_mask(args[1])
        if name == "repeat_interleave":
            return "output_size" not in kwargs and len(args) > 1 and isinstance(args[1], torch.Tensor)
        return name == "where" and len(args) + len(kwargs) == 1


def _site() -> str:
    """'package/file.py:line function' of the call (its innermost Python frame)."""
    frame = traceback.extract_stack()[-3]
    return (
        f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"
    )


@contextlib.contextmanager
def cuda_syncs() -> Iterator[list[str]]:
    """The synchronizing CUDA calls made inside (torch's sync debug mode warns on each), as their messages."""
    got: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield got
        finally:
            torch.cuda.set_sync_debug_mode("default")
    got.extend(str(w.message) for w in caught if "synchroniz" in str(w.message))


ROWS, LENGTH = 8, 64  # 4 groups of 2 (`_learner_bench.batch`)
# (name, rows per micro-batch, recompute): recompute holds a group split over micro-batches (proxy_hold_group)
LAYOUTS = (
    ("one forward", 8, False),
    ("a group per micro-batch", 2, False),
    ("a row per micro-batch, held group", 1, True),
    ("a row per micro-batch, forward-only first", 1, False),
)


# exact OPOB with ghost norms (vcpo/ghost.py): a group per micro-batch, one forward, an activation-only backward
# for the norms, then the weighted backward; the norms stay on the device until the step's end
GHOST = ("exact OPOB, ghost norms, a group per micro-batch", 2, False)

# the Megatron learner (exact OPOB only: one trajectory per forward); on CPU its count includes the reads of the
# host copies of the pack's bounds (host_bounds.py), which are no waits: only its CUDA syncs say what a GPU waits
MEGATRON = ("Megatron, exact OPOB", 1, False)


def measure(
    model: Path,
    rows_per_micro_batch: int,
    recompute: bool,
    device: str,
    backend: str = "torch",
    norms: str = "",
) -> dict[str, Any]:
    """One warm-up step, then one counted step (and, on CUDA, one step under the sync debug mode). `norms`
    'ghost': the torch learner's exact OPOB with ghost norms (else proxy OPOB; Megatron: exact)."""
    opob = "exact" if backend == "megatron" or norms == "ghost" else "proxy"
    cell = Cell(backend, LENGTH, ROWS, recompute=recompute, opob=opob, dtype="float32",  # type: ignore[arg-type]
                micro_batch_tokens=rows_per_micro_batch * LENGTH, norms=norms or "backward")  # fmt: skip
    rank = Rank(model, cell, device)
    host_batch = batch(ROWS, LENGTH, rank.vocab)  # built on the host, as a run hands it to the learner
    forwards = [0]
    decoder = rank.model.decoder if backend == "megatron" else rank.model.get_decoder()
    decoder.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    rank.step(host_batch)
    forwards[0] = 0
    with HostReads() as reads:
        rank.step(host_batch)
    out: dict[str, Any] = {
        "reads": reads.count,
        "forwards": forwards[0],
        "sites": collections.Counter(reads.where),
    }
    if device.startswith("cuda"):
        with cuda_syncs() as syncs:
            rank.step(host_batch)
        out["cuda_syncs"] = len(syncs)
    return out


def _in_logprobs(site: str) -> bool:
    """A read made by a learner's log-prob function or the model under it (not by vcpo.Step)."""
    return any(part in site for part in ("hf_logprobs", "masking_utils", "megatron/", "rope_utils"))


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Host reads per learner step ({result['commit']}, {result['device']})",
        "",
        f"`benchmarks/host_reads.py`: one learner step ({ROWS} x {LENGTH} tokens in groups of 2, the small Qwen2 "
        "shape, fp32; the torch learner with proxy OPOB in four micro-batch layouts and with exact OPOB from ghost norms, with --megatron or on CUDA the "
        "Megatron learner too), the calls that on a GPU wait for the device counted per step.",
        "",
        "| layout | forwards | reads per step | of them in the log-probs (per forward) |"
        + (" CUDA syncs |" if result["device"].startswith("cuda") else ""),
        "|---|---|---|---|" + ("---|" if result["device"].startswith("cuda") else ""),
    ]
    for row in result["layouts"]:
        per_forward = sum(n for site, n in row["sites"].items() if _in_logprobs(site))
        lines.append(
            f"| {row['layout']} | {row['forwards']} | {row['reads']} | {per_forward} "
            f"({per_forward / max(row['forwards'], 1):g}) |"
            + (f" {row['cuda_syncs']} |" if "cuda_syncs" in row else "")
        )
    if any(row["backend"] == "megatron" for row in result["layouts"]):
        lines += ["", "Megatron's row on CPU counts reads of the pack's bounds' host copies too (no wait on a GPU);"
                  " its CUDA syncs are what a GPU waits."]  # fmt: skip
    lines += [f"\nFailed: {f}" for f in result.get("failed", [])]
    busiest = max(
        (r for r in result["layouts"] if r["backend"] == "torch"), key=lambda r: r["reads"], default=None
    )
    if busiest is not None:
        lines += ["", "Where (the busiest torch layout's reads, by call site):", ""]
        lines += [f"- {n} x `{site}`" for site, n in sorted(busiest["sites"].items(), key=lambda x: -x[1])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU): also counts the real syncs")
    ap.add_argument(
        "--commit", help="the commit measured (default: git rev-parse; the GPU machine has no .git)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "host_reads")
    ap.add_argument(
        "--megatron",
        action="store_true",
        help="also the Megatron learner's step (the default with --device cuda)",
    )
    args = ap.parse_args(argv)
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        ap.error(f"--device {args.device!r}: cpu or cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no GPU here ({torch.__version__})")
    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False
        ).stdout.strip()
        or "unknown"
    )
    model = write_model(Path(tempfile.mkdtemp()) / "small", SMALL, device=args.device)
    cells = [(*c, "torch") for c in LAYOUTS] + [(*GHOST, "torch ghost")]
    if args.megatron or args.device.startswith("cuda"):
        cells.append((*MEGATRON, "megatron"))
    layouts, failed = [], []
    for i, (name, rows, recompute, backend) in enumerate(cells, 1):
        print(f"[{i}/{len(cells)}] {name}", flush=True)
        try:
            row = measure(
                model, rows, recompute, args.device, backend.split()[0], "ghost" if "ghost" in backend else ""
            )
        except Exception as e:  # noqa: BLE001 — one cell's failure (a GPU machine's first run) keeps the others
            failed.append(f"{name}: {type(e).__name__}: {e}")
            print(f"    FAILED: {failed[-1]}", flush=True)
            continue
        layouts.append(
            {
                "layout": name,
                "backend": backend.split()[0],
                "rows_per_micro_batch": rows,
                "recompute": recompute,
                **row,
            }
        )
        print(f"    {row['reads']} reads per step, {row['forwards']} forwards", flush=True)
    result = {
        "commit": commit, "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__, "python": platform.python_version(), "layouts": layouts, "failed": failed,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(portable(json.dumps(result, indent=1, default=dict)) + "\n")
    args.out.with_suffix(".md").write_text(portable(markdown(result)))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
