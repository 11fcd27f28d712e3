"""Every make target the README and docs/ document, run from a fresh clone of HEAD, as a new user would.

    python3 scripts/fresh_clone_targets.py                   # all of RUN, one after another (~1.5-3 h)
    python3 scripts/fresh_clone_targets.py --targets test,run
    python3 scripts/fresh_clone_targets.py --nice 15 --keep  # lower priority; keep the clone afterwards

The clone goes to a fresh temporary folder, beside a link named `shared` to this checkout's ../shared (the
data sets the tests read), and starts with nothing built: each target installs what it needs, as on a user's
machine. The targets run in order, each under `nice`; every one's output goes to its own log, and a table of
pass/fail and wall time per target to runs/fresh-clone/<commit>.md (and .json), rewritten after every target
so an interrupted run keeps what finished. Beside the wall time, the CPU time of the target's whole process tree
(the processes it waited for): on a machine shared with other jobs, the better guide to an idle one's time. Every target runs with PYTHONWARNINGS=always::ResourceWarning, and
the table counts the resource warnings each printed (unclosed sessions, files, event loops; leaked semaphores;
tasks destroyed while pending), which a user reads as bugs. Exits non-zero if a target failed.

RUN and NOT_RUN are the one list of documented targets: tests/test_documented_targets.py checks that every
`make X` the README and docs/ mention is in one of them, and that each is a target of the Makefile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESOURCE_WARNING = re.compile(
    r"ResourceWarning|Unclosed|unclosed|leaked semaphore|Task was destroyed but it is pending"
)

# Run from a fresh clone, in this order (the quick ones first, so a broken install shows early).
# test-slow covers test-heavy
RUN = ("test", "run", "test-slow", "test-vllm", "run-real", "docs", "test-harnesses")
# Documented, but not run here, and why.
NOT_RUN = {
    "install": "every target above runs it first",
    "system-deps": "every target above that needs it runs it first",
    "verifiers": "make test runs it first",
    "smollm": "make test, test-slow and run-real run it first",
    "docs-serve": "serves the site until stopped (make docs builds the same pages)",
    "test-latest": "installs the newest versions the registry has today: a drift check, not reproducible",
    "test-heavy": "a part of make test-slow, which runs",
    "test-docker": "the docker-marked tests run in make test (they start a private dockerd)",
    "test-megatron": "the megatron-marked tests run in make test",
    "test-cpus": "the suite four times (threads x kernel sets); run by hand, docs/tests.md",
    "bench": "every benchmark, hours; each writes its own results file",
    "run-swe": "the swe_tiny learning run in containers (tens of minutes); its --quick pipeline runs in make test-heavy",
    "bench-trl": "the TRL comparison, about an hour, in its own venv",
    "bench-slow-tools": "the slow-tools benchmark in containers, hours (estimated); part of make bench",
    "trl-venv": "TRL's venv, which make test-slow (and test-heavy, bench-trl) makes first",
    "lock": "re-resolves requirements.lock against the registry (changes the file)",
    "lint": "ruff; make test runs ruff check",
}


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _row(target: str, rc: int | None, seconds: float, log: Path, cpu_s: float | None = None) -> dict:
    warned = [
        ln.strip()
        for ln in log.read_text(errors="replace").splitlines()
        if RESOURCE_WARNING.search(ln) and "/pip/" not in ln  # pip's own, while a target installs: not ours
    ]
    return {
        "target": target, "passed": rc == 0, "rc": rc, "minutes": round(seconds / 60, 1), "log": str(log),
        "cpu_minutes": None if cpu_s is None else round(cpu_s / 60, 1),
        "resource_warnings": len(warned), "first_warning": warned[0][:200] if warned else None,
    }  # fmt: skip


def _write(out: Path, head: dict, rows: list[dict]) -> None:
    out.with_suffix(".json").write_text(json.dumps({**head, "targets": rows}, indent=2) + "\n")
    lines = [
        f"# make targets from a fresh clone of {head['commit']} ({head['date']})",
        "",
        f"{head['machine']}; `nice -n {head['nice']}`; load average {head['load_start']} at the start.",
        "",
        "| target | result | wall time (min) | CPU time (min) | resource warnings |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        result = (
            "not in this commit's Makefile"
            if r["rc"] is None
            else "pass"
            if r["passed"]
            else f"FAIL (exit {r['rc']}; log {r['log']})"
        )
        warned = str(r["resource_warnings"]) + (
            f" (first: `{r['first_warning']}`)" if r["first_warning"] else ""
        )
        lines.append(
            f"| make {r['target']} | {result} | {r['minutes']} | {r.get('cpu_minutes')} | {warned} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--targets", default=",".join(RUN), help=f"comma-separated, in order (default {','.join(RUN)})"
    )
    p.add_argument("--nice", type=int, default=15, help="niceness of every target (default 15)")
    p.add_argument("--keep", action="store_true", help="keep the clone (default: removed at the end)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "fresh-clone", help="results folder")
    p.add_argument(
        "--recount", metavar="JSON", type=Path, help="only rebuild that results table from its logs"
    )
    args = p.parse_args(argv)
    if args.recount:
        done = json.loads(args.recount.read_text())
        rows = [
            _row(r["target"], r["rc"], r["minutes"] * 60, Path(r["log"]), (r.get("cpu_minutes") or 0) * 60)
            for r in done.pop("targets")
        ]
        _write(args.recount.with_suffix(""), done, rows)
        print(args.recount.with_suffix(".md").read_text())
        return 0
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in RUN]
    if unknown:
        p.error(f"--targets: {unknown} not in RUN {RUN} (scripts/fresh_clone_targets.py)")
    shared = (ROOT.parent / "shared").resolve()
    if not shared.is_dir():
        print(
            f"warning: {ROOT.parent / 'shared'} not found: tests that read ../shared will skip",
            file=sys.stderr,
        )

    commit = _git("rev-parse", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no"):
        print("note: uncommitted changes are not in the clone (it is HEAD)", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still removes its clone (finally)
    top = Path(tempfile.mkdtemp(prefix="agent-rl-fresh-"))
    clone = top / "agent-rl"
    (top / "shared").symlink_to(shared, target_is_directory=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    _git("checkout", "--quiet", commit, cwd=clone)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / commit[:12]
    logs = args.out / f"{commit[:12]}-logs"
    logs.mkdir(exist_ok=True)
    head = {
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}",
        "nice": args.nice,
        "load_start": round(os.getloadavg()[0], 2),
        "clone": str(clone),
    }
    print(f"fresh clone of {commit[:12]} in {clone}; results: {out}.md", flush=True)
    rows: list[dict] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "PYTEST"))}
    env["PYTHONWARNINGS"] = (
        "always::ResourceWarning"  # shown, not raised: the run goes on and the table counts them
    )
    try:
        defined = set(
            re.findall(r"^([a-z][a-z0-9-]*)\s*:(?!=)", (clone / "Makefile").read_text(), re.MULTILINE)
        )
        for target in targets:
            log = logs / f"{target}.log"
            if (
                target not in defined
            ):  # documented by a branch not merged here yet (make docs): said, not failed
                log.write_text(f"make {target}: not a target of this commit's Makefile\n")
                rows.append(_row(target, None, 0.0, log))
                print(f"make {target}: not in this commit's Makefile, skipped", flush=True)
                _write(out, head, rows)
                continue
            print(f"[{time.strftime('%H:%M:%S')}] make {target} (log {log}) ...", flush=True)
            t0, cpu0 = time.monotonic(), _children_cpu()
            with open(log, "w") as f:
                rc = subprocess.run(
                    ["nice", "-n", str(args.nice), "make", target], cwd=clone, stdout=f, stderr=subprocess.STDOUT,
                    env=env,
                ).returncode  # fmt: skip
            rows.append(_row(target, rc, time.monotonic() - t0, log, _children_cpu() - cpu0))
            print(f"[{time.strftime('%H:%M:%S')}] make {target}: {'pass' if rc == 0 else f'FAIL (exit {rc})'} "
                  f"in {rows[-1]['minutes']} min", flush=True)  # fmt: skip
            _write(out, head, rows)
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)
    print(out.with_suffix(".md").read_text())
    return 0 if all(r["passed"] or r["rc"] is None for r in rows) else 1


def _children_cpu() -> float:
    """CPU seconds (user + system) of every finished process this one waited for, theirs included: a measure
    of a target's work that a machine shared with other jobs does not inflate the way it does wall time."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
