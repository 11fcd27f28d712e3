"""Load-and-fault campaign: the whole loop under load, and faults injected mid-run at random moments.

    .venv/bin/python scripts/reliability.py [--repeats 2] [--only load,serve,faults] [--model HF_DIR]

Load
- `train`: the full loop (recipes/tiny_tir_smoke.yaml on the tiny model; two `agent-rl serve` engine server
  processes; the local sandbox pool; the buffer) with up to 1,000 episodes in flight
  (rollout.max_concurrent_episodes=1000, admission (k+1)·B groups x 8 = 1,000); reports episodes/s, tool
  calls/s, step time p50/p99, mean episode seconds p50/p99 over steps, and the process tree's memory (PSS)
  per step: bounded means the last steps are no higher than the early ones.
- `serve`: 256 concurrent clients on `agent-rl sandbox serve` (SandboxFusion /run_code): calls/s, p50/p99,
  the server's PSS during the run, wrong answers and HTTP errors.
Faults (each `--repeats` times, at a random step and a random moment within it)
- an engine server SIGKILLed (2 engine servers, weights by disk), a sandbox fork-server SIGKILLed, a sandbox
  fork-server SIGSTOPped (a call that never returns), the Docker daemon restarted (env on the docker backend),
  the learner process tree SIGKILLed then `--resume`, and the disk filling up under the run (a small tmpfs
  run dir: the checkpoint write fails; space freed, `--resume`). Every fault run is synchronous (k=0) and
  compared with an uninterrupted run of the same config (one per config, run first).
For each run: completed or not, the last line the user saw on stderr, recovery time (fault -> next step
logged), and the audit of batches.jsonl: every step once, no trajectory delivered twice, every delivered
group whole, and against the uninterrupted run: the prompts of every step, how often each prompt was
trained, the trajectory ids, and lost / extra trajectories by (step, prompt, member index); and both runs side by
side: steps, prompts used, trajectories admitted into training, the final weights' versions. A completed
uninterrupted run in --work is reused by a later invocation, so the campaign can be run (and resumed) one fault
at a time with --merge.
Node and replica faults (engine node lost, learner node lost + --resume, a replica added or removed mid-run) run
on a Ray cluster of several nodes on this machine: scripts/reliability_cluster.py.
Results: benchmarks/results/reliability.{json,md}, written by benchmarks/harness (its provenance block under `meta`,
its writer; `--report-only [--out DIR]` rewrites both from the JSON alone). Needs root for the tmpfs and the private dockerd (those
scenarios are skipped, saying why, otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script (`python scripts/reliability.py`): the checkout's packages

from benchmarks.harness.provenance import Provenance, describe  # noqa: E402
from benchmarks.harness.report import write  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FORKSERVER = b"/opt/agent-rl/forkserver.py"
STEPS = 10
GROUP = 8
# Faults run synchronously (k=0): the prompts and trajectories of every step are then fixed by the seed, so
# each fault run is compared, step by step, with an uninterrupted run of the same config.
K0 = {"buffer.max_staleness": 0}


# ---- processes ------------------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return out


def tree(root: int) -> list[int]:
    parents = _parents()
    found = [root]
    for pid in found:
        found += [c for c, p in parents.items() if p == pid]
    return found


def argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total / 1024


class MemorySampler(threading.Thread):
    """PSS of a process tree once a second."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.samples, self.stop = root, [], threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(1.0):
            self.samples.append((round(time.monotonic() - t0, 1), round(pss_mib(tree(self.root)), 1)))


def forkservers(root: int) -> list[int]:
    """Fork-servers in the tree (not the calls they forked, which share their argv)."""

    def is_server(pid: int) -> bool:
        return FORKSERVER in argv(pid) and not argv(pid)[0].endswith(b"bwrap")

    parents = _parents()
    return [p for p in tree(root) if is_server(p) and not is_server(parents.get(p, 0))]


def engine_servers(root: int) -> list[int]:
    return [p for p in tree(root) if b"agent_rl.engines.embedded.server" in argv(p)]


def kill_tree(root: int) -> None:
    for pid in tree(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---- training runs ---------------------------------------------------------------------------------


def train_cmd(model: Path, run_dir: Path, sets: dict[str, object], resume: bool = False) -> list[str]:
    base = {
        "model.path": model,
        "logging.run_dir": run_dir,
        "train.steps": STEPS,
        "checkpoint.every": 2,
        "rollout.max_errors": 1000,
    }
    cmd = [sys.executable, "-m", "agent_rl.cli", "train", str(ROOT / "recipes" / "tiny_tir_smoke.yaml")]
    for key, value in {**base, **sets}.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd + (["--resume", str(run_dir)] if resume else [])


def batches(run_dir: Path) -> list[dict]:
    path = run_dir / "batches.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Run:
    proc: subprocess.Popen
    log: Path
    step_times: dict[int, float] = field(default_factory=dict)  # step -> monotonic time it was logged


def start(cmd: list[str], log: Path) -> Run:
    handle = log.open("ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    return Run(proc, log)


def watch(run: Run, run_dir: Path, until: Callable[[], bool] | None = None, timeout_s: float = 900) -> None:
    """Record when each step appears in batches.jsonl; return when the process ends or `until()` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for b in batches(run_dir):
            run.step_times.setdefault(b["step"], time.monotonic())
        if run.proc.poll() is not None or (until is not None and until()):
            return
        time.sleep(0.05)
    kill_tree(run.proc.pid)
    run.proc.wait()


def last_error_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("agent-rl:") or "Error" in ln]
    return (errors or lines or [""])[-1][:300]


def _trajectory_keys(bs: list[dict]) -> Counter:
    """(step, prompt, member index) per trained trajectory: the uid's group number is left out, because a
    group dropped for an error is sampled again under a new group id (same prompt, same member indices)."""
    out: Counter = Counter()
    for b in bs:
        per_group = len(b["uids"]) // max(1, len(b["tasks"]))
        for i, uid in enumerate(b["uids"]):
            out[(b["step"], b["tasks"][i // per_group], uid.rsplit("/", 1)[1])] += 1
    return out


def audit(run_dir: Path, batch_prompts: int, reference: list[dict]) -> dict:
    """batches.jsonl of a fault run against its uninterrupted reference run (same config, k=0, so the same
    prompts in the same steps): every step once, no trajectory twice, whole groups, and the prompts and
    trajectories of every step equal to the reference's."""
    bs = batches(run_dir)
    steps = [b["step"] for b in bs]
    uids = [u for b in bs for u in b["uids"]]
    mine, ref = _trajectory_keys(bs), _trajectory_keys(reference)
    out = {
        "steps_logged": len(bs),
        "steps_ok": steps == list(range(STEPS)),
        "duplicated_trajectories": len(uids) - len(set(uids)),
        "short_batches": sum(len(b["uids"]) != batch_prompts * GROUP for b in bs),
        "reference_steps": len(reference),
        "same_prompts_as_uninterrupted": [sorted(b["tasks"]) for b in bs] == [sorted(b["tasks"]) for b in reference],
        "prompt_counts_equal": Counter(t for b in bs for t in b["tasks"]) == Counter(t for b in reference for t in b["tasks"]),
        "same_trajectory_ids": [sorted(b["uids"]) for b in bs] == [sorted(b["uids"]) for b in reference],
        "lost_trajectories": sum((ref - mine).values()),
        "extra_trajectories": sum((mine - ref).values()),
    }  # fmt: skip
    out["fault_run"], out["uninterrupted"] = (
        run_summary(bs, run_dir),
        run_summary(reference, REFERENCE_DIRS.get(id(reference))),
    )
    last = (metrics(run_dir) or [{}])[-1]
    out["episodes_ended_as_error"] = int(last.get("rollout/errors", 0))
    out["groups_dropped_for_error"] = int(last.get("buffer/dropped_error", 0))
    return out


def final_version(run_dir: Path | None) -> int | None:
    """The policy version of the run's last checkpoint (checkpoints/latest/**/learner.json), None if none."""
    if run_dir is None:
        return None
    found = sorted((run_dir / "checkpoints" / "latest").glob("**/learner.json"))
    return json.loads(found[0].read_text())["version"] if found else None


def run_summary(bs: list[dict], run_dir: Path | None) -> dict:
    """What a run trained, for the table's side-by-side columns: steps, prompts used (distinct / all), trajectories
    admitted into training, and the final weights' versions (the last checkpoint's, and the newest version that
    sampled a token of the last step)."""
    last_versions = [v for runs in (bs[-1].get("versions") or []) for v, _ in runs] if bs else []
    tasks = [t for b in bs for t in b["tasks"]]
    return {
        "steps": len(bs),
        "prompts_used": len(tasks),
        "distinct_prompts": len(set(tasks)),
        "trajectories_admitted": sum(len(b["uids"]) for b in bs),
        "final_checkpoint_version": final_version(run_dir),
        "last_step_sampled_by": max(last_versions) if last_versions else None,
    }


def reference_run(work: Path, model: Path, sets: dict, cache: dict[str, list[dict]]) -> list[dict]:
    """batches.jsonl of an uninterrupted run with these settings (run once per distinct settings; a completed one
    from an earlier invocation in the same --work dir is reused, so the campaign resumes fault by fault)."""
    key = json.dumps(sets, sort_keys=True, default=str)
    slug = "reference-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    run_dir = work / slug
    if key not in cache and (run_dir / "COMPLETE").exists():
        cache[key] = batches(run_dir)
        REFERENCE_DIRS[id(cache[key])] = run_dir
    if key not in cache:
        shutil.rmtree(run_dir, ignore_errors=True)
        (work / f"{slug}.log").unlink(missing_ok=True)
        print(f"  uninterrupted reference run {slug}: {sets}", flush=True)
        run = start(train_cmd(model, run_dir, sets), work / f"{slug}.log")
        watch(run, run_dir)
        cache[key] = batches(run_dir)
        if run.proc.returncode != 0 or len(cache[key]) != STEPS:
            raise RuntimeError(
                f"the reference run {run_dir} did not complete: {last_error_line(work / f'{slug}.log')}"
            )
        (run_dir / "COMPLETE").write_text(key + "\n")
        REFERENCE_DIRS[id(cache[key])] = run_dir
    return cache[key]


REFERENCE_DIRS: dict[
    int, Path
] = {}  # id(reference batches) -> its run dir (for the final checkpoint version)


@dataclass
class FaultResult:
    fault: str
    repeat: int
    at_step: int
    completed: bool
    exit_code: int | None
    user_saw: str
    recovery_s: float | None
    audit: dict
    note: str = ""


def inject_and_wait(
    name: str,
    repeat: int,
    rng: random.Random,
    work: Path,
    model: Path,
    sets: dict,
    fault: Callable[[Run], str],
    reference: list[dict],
    steps: tuple[int, int] = (2, STEPS - 4),
) -> FaultResult:
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    run_dir = work / f"{slug}-{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = work / f"{slug}-{repeat}.log"
    log.unlink(missing_ok=True)
    at_step = rng.randint(*steps)
    run = start(train_cmd(model, run_dir, sets), log)
    watch(run, run_dir, until=lambda: at_step in run.step_times)
    time.sleep(rng.uniform(0.0, 1.0))  # a random moment within the step
    t_fault, last = time.monotonic(), max(run.step_times)
    note = fault(run) if run.proc.poll() is None else "the run ended before the fault"
    watch(run, run_dir)
    after = [t for s, t in run.step_times.items() if s > last]
    return FaultResult(
        name,
        repeat,
        at_step,
        completed=run.proc.returncode == 0 and len(batches(run_dir)) == STEPS,
        exit_code=run.proc.returncode,
        user_saw=last_error_line(log) if run.proc.returncode else "",
        recovery_s=round(min(after) - t_fault, 2) if after else None,  # fault -> first step past the last one
        audit=audit(run_dir, 2, reference),
        note=note,
    )


def fault_engine_kill(run: Run) -> str:
    servers = engine_servers(run.proc.pid)
    if not servers:
        return "no engine server found"
    os.kill(servers[0], signal.SIGKILL)
    return f"SIGKILL engine server pid {servers[0]} (of {len(servers)})"


def fault_sandbox_kill(run: Run) -> str:
    pids = forkservers(run.proc.pid)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return f"SIGKILL {len(pids)} fork-server(s)"


def fault_sandbox_hang(run: Run) -> str:
    pids = forkservers(run.proc.pid)
    if pids:
        os.kill(pids[0], signal.SIGSTOP)
    return f"SIGSTOP fork-server pid {pids[0] if pids else None} (of {len(pids)})"


# ---- the learner killed, then --resume ---------------------------------------------------------------


def learner_kill(
    repeat: int, rng: random.Random, work: Path, model: Path, reference: list[dict]
) -> FaultResult:
    sets = dict(K0)
    run_dir = work / f"learner_kill-{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = work / f"learner_kill-{repeat}.log"
    log.unlink(missing_ok=True)
    at_step = rng.randint(3, STEPS - 3)
    run = start(train_cmd(model, run_dir, sets), log)
    watch(run, run_dir, until=lambda: at_step in run.step_times)
    time.sleep(rng.uniform(0.0, 1.0))
    t_fault, last = time.monotonic(), max(run.step_times)
    kill_tree(run.proc.pid)
    run.proc.wait()
    resumed = start(train_cmd(model, run_dir, sets, resume=True), log)
    resumed.step_times = {s: t_fault for s in range(last + 1)}  # steps redone after the resume do not count
    watch(resumed, run_dir)
    after = [t for s, t in resumed.step_times.items() if s > last]
    return FaultResult(
        "learner SIGKILL + --resume",
        repeat,
        at_step,
        completed=resumed.proc.returncode == 0 and len(batches(run_dir)) == STEPS,
        exit_code=resumed.proc.returncode,
        user_saw=last_error_line(log) if resumed.proc.returncode else "",
        recovery_s=round(min(after) - t_fault, 2) if after else None,  # fault -> first step past the last one
        audit=audit(run_dir, 2, reference),
        note="whole process tree SIGKILLed; recovery includes the restart",
    )


# ---- the disk fills up under the run -------------------------------------------------------------------


def disk_full(repeat: int, rng: random.Random, work: Path, model: Path, reference: list[dict]) -> FaultResult:
    mnt = work / f"disk-{repeat}"
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["umount", str(mnt)], capture_output=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        return FaultResult(
            "disk full on checkpoint",
            repeat,
            0,
            False,
            None,
            "",
            None,
            {},
            f"skipped: {mount.stderr.strip()}",
        )
    try:
        run_dir = mnt / "run"
        log = work / f"disk_full-{repeat}.log"
        log.unlink(missing_ok=True)
        at_step = rng.randint(2, STEPS - 4)
        run = start(train_cmd(model, run_dir, K0), log)
        watch(run, run_dir, until=lambda: at_step in run.step_times)
        time.sleep(rng.uniform(0.0, 1.0))
        t_fault, last = time.monotonic(), max(run.step_times)
        filler = mnt / "filler"
        free = shutil.disk_usage(mnt).free
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):  # leave 64 KiB: logs go on, the next checkpoint cannot be written
            os.posix_fallocate(fd, 0, max(1, free - (64 << 10)))
        os.close(fd)
        watch(run, run_dir)
        first_rc, first_saw = run.proc.returncode, last_error_line(log)
        filler.unlink()  # the user frees space and resumes
        last = max(last, *run.step_times)
        resumed = start(train_cmd(model, run_dir, K0, resume=True), log)
        resumed.step_times = {s: t_fault for s in range(last + 1)}
        watch(resumed, run_dir)
        after = [t for s, t in resumed.step_times.items() if s > last]
        return FaultResult(
            "disk full on checkpoint",
            repeat,
            at_step,
            completed=resumed.proc.returncode == 0 and len(batches(run_dir)) == STEPS,
            exit_code=first_rc,
            user_saw=first_saw if first_rc else "(the run did not stop)",
            recovery_s=round(min(after) - t_fault, 2)
            if after
            else None,  # fault -> first step past the last one
            audit=audit(run_dir, 2, reference),
            note="tmpfs filled to 64 KiB free mid-run; then freed and --resume (recovery includes the restart)",
        )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ---- the Docker daemon restarted -------------------------------------------------------------------------


class Dockerd:
    def __init__(self, root: Path):
        self.root, self.proc = root, None
        self.host = f"unix://{root / 'docker.sock'}"

    def start(self) -> None:
        import docker

        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none", f"--data-root={self.root / 'data'}",
             f"--exec-root={self.root / 'exec'}", f"--pidfile={self.root / 'dockerd.pid'}", f"-H={self.host}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                docker.DockerClient(base_url=self.host).ping()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("dockerd did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def docker_env(work: Path, host: str, image: str) -> Path:
    text = (ROOT / "envs" / "tiny_arith.yaml").read_text()
    text = text.replace(
        "  backend: local\n  options: {pool_size: 2}",
        f"  backend: docker\n  options: {{pool_size: 2, image: '{image}', docker_host: '{host}'}}",
    )
    assert "backend: docker" in text
    path = work / "tiny_arith_docker.yaml"
    path.write_text(text)
    return path


# ---- load ---------------------------------------------------------------------------------------------------


def load_train(work: Path, model: Path) -> dict:
    run_dir = work / "load-train"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = work / "load-train.log"
    log.unlink(missing_ok=True)
    sets = {
        "rollout.max_concurrent_episodes": 1000,
        "buffer.max_staleness": 4,
        "train.batch_prompts": 25,  # admission: (4 + 1) x 25 groups x 8 = 1,000 episodes in flight
        "placement.topology": "processes",
        "engines.count": 2,
        "engines.weight_sync": "disk",
        "engines.max_batch": 64,
        "checkpoint.every": 0,
        "train.steps": 12,
    }
    cmd = train_cmd(model, run_dir, sets)
    t0 = time.monotonic()
    run = start(cmd, log)
    sampler = MemorySampler(run.proc.pid)
    sampler.start()
    while run.proc.poll() is None and time.monotonic() - t0 < 1500:
        time.sleep(1.0)
    sampler.stop.set()
    if run.proc.poll() is None:
        kill_tree(run.proc.pid)
        run.proc.wait()
    wall = time.monotonic() - t0
    ms = metrics(run_dir)
    out: dict = {"command": " ".join(cmd[1:]), "exit_code": run.proc.returncode, "wall_s": round(wall, 1)}
    if not ms:
        out["error"] = last_error_line(log)
        return out
    last = ms[-1]
    span = ms[-1]["time"] - ms[0]["time"]
    episodes = last.get("rollout/episodes", 0) - ms[0].get("rollout/episodes", 0)
    step_s = [m["perf/step_seconds"] for m in ms[1:]]
    ep_s = [m["rollout/episode_seconds"] for m in ms[1:] if "rollout/episode_seconds" in m]
    rates = [m["rollout/tool_calls_per_episode"] for m in ms[1:] if "rollout/tool_calls_per_episode" in m]
    pss = [p for _, p in sampler.samples]
    third = max(1, len(pss) // 3)
    out.update(
        {
            "steps": len(ms),
            "trajectories_per_step": int(last.get("learner/trajectories", 0)),
            "episodes_per_s": round(episodes / span, 1) if span > 0 else None,
            "tool_calls_per_s": round(episodes / span * statistics.mean(rates), 1)
            if span > 0 and rates
            else None,
            "step_s_p50": round(statistics.median(step_s), 2) if step_s else None,
            "step_s_p99": round(max(step_s), 2) if step_s else None,
            "episode_s_p50_over_steps": round(statistics.median(ep_s), 2) if ep_s else None,
            "episode_s_p99_over_steps": round(max(ep_s), 2) if ep_s else None,
            # admission lets (k+1)·B groups start at once: all of them are in flight before the first step
            "episodes_started_before_step_0": int(ms[0].get("buffer/admitted", 0)) * GROUP,
            "episodes_total": int(last.get("rollout/episodes", 0)),
            "pss_mib_first_third_max": round(max(pss[:third]), 1) if pss else None,
            "pss_mib_last_third_max": round(max(pss[-third:]), 1) if pss else None,
            "pss_mib_peak": round(max(pss), 1) if pss else None,
            "pss_samples": sampler.samples,
            "errors": int(last.get("rollout/errors", 0)),
        }
    )
    return out


def load_serve(work: Path, clients: int, calls_per_client: int) -> dict:
    import asyncio

    import aiohttp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "sandboxes", "serve", "--pool-size", "2", "--port", str(port)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    sampler = MemorySampler(server.pid)
    latencies: list[float] = []
    wrong = http_errors = 0

    async def client(http: aiohttp.ClientSession, i: int) -> None:
        nonlocal wrong, http_errors
        for j in range(calls_per_client):
            t0 = time.perf_counter()
            try:
                async with http.post(
                    f"http://127.0.0.1:{port}/run_code", json={"code": f"print({i} + {j})"}
                ) as r:
                    body = await r.json()
                    if r.status != 200:
                        http_errors += 1
                        continue
            except aiohttp.ClientError:
                http_errors += 1
                continue
            latencies.append(time.perf_counter() - t0)
            wrong += body["run_result"]["stdout"] != f"{i + j}\n"

    async def main() -> float:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
            t0 = time.perf_counter()
            await asyncio.gather(*(client(http, i) for i in range(clients)))
            return time.perf_counter() - t0

    try:
        assert server.stdout is not None and "sandbox service" in server.stdout.readline()
        sampler.start()
        wall = asyncio.run(main())
    finally:
        sampler.stop.set()
        server.terminate()
        server.wait(30)
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    pss = [p for _, p in sampler.samples]
    return {
        "clients": clients,
        "calls": clients * calls_per_client,
        "calls_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(q[49] * 1e3, 1),
        "p99_ms": round(q[98] * 1e3, 1),
        "wrong_answers": wrong,
        "http_errors": http_errors,
        "server_pss_mib_start": pss[0] if pss else None,
        "server_pss_mib_peak": max(pss) if pss else None,
        "server_pss_mib_end": pss[-1] if pss else None,
    }


# ---- report -------------------------------------------------------------------------------------------------


def default_model(work: Path) -> Path:
    """The SFT'd and RL'd tiny model of `make run` when present (it writes code), else a fresh tiny model."""
    from agent_rl import checkpoint

    dest = work / "model"
    if dest.exists():
        return dest
    with contextlib.suppress(FileNotFoundError):
        shutil.copytree(checkpoint.latest(ROOT / "runs" / "tiny_tir" / "rl") / "hf", dest)
        return dest
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    return build_tiny(dest, sample_corpus(), vocab_size=512, seed=0)


def summarize(faults: list[dict]) -> dict:
    """Totals over the fault runs (the README quotes these)."""
    audits = [f["audit"] for f in faults if f["audit"]]
    return {
        "fault_runs": len(faults),
        "completed": sum(bool(f["completed"]) for f in faults),
        "same_prompts_as_uninterrupted": sum(bool(a.get("same_prompts_as_uninterrupted")) for a in audits),
        "prompt_counts_equal": sum(bool(a.get("prompt_counts_equal")) for a in audits),
        "same_trajectory_ids": sum(bool(a.get("same_trajectory_ids")) for a in audits),
        "lost_trajectories": sum(a.get("lost_trajectories", 0) for a in audits),
        "extra_trajectories": sum(a.get("extra_trajectories", 0) for a in audits),
        "duplicated_trajectories": sum(a.get("duplicated_trajectories", 0) for a in audits),
        "episodes_ended_as_error": sum(a.get("episodes_ended_as_error", 0) for a in audits),
    }


def fault_table(report: dict) -> list[str]:
    """The faults section of the report (Markdown lines): one row per fault run, beside its uninterrupted run, and
    the totals; the docs' reliability page shows the same lines (scripts/docs/figures.py)."""
    lines: list[str] = []
    if report.get("faults"):
        lines += [
            "Each fault run is compared with an uninterrupted run of the same config (batches.jsonl): the prompts of "
            "every step, how often each prompt was trained, the trajectory ids, and (step, prompt, member) keys, which "
            "survive a group that was sampled again under a new id after an error.",
            "",
            "Both runs side by side: each `a / b` cell is the fault run / the uninterrupted run (steps trained, "
            "prompts used (all / distinct), trajectories admitted into training, final weights' version: the last "
            "checkpoint's, and the newest version that sampled the last step).",
            "",
            "| fault | run | at step | completed | steps: fault / uninterrupted | prompts used | trajectories admitted | "
            "final checkpoint version | last step sampled by version | steps once, no duplicate | "
            "prompts per step = uninterrupted | prompt counts = uninterrupted | trajectory ids = uninterrupted | "
            "lost / extra trajectories | episodes ended as error | recovery s | what the user saw | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]

        def both(a: dict, key: str) -> str:
            mine, ref = a.get("fault_run") or {}, a.get("uninterrupted") or {}
            if key == "prompts_used":
                return (
                    f"{mine.get(key, '-')} ({mine.get('distinct_prompts', '-')}) / "
                    f"{ref.get(key, '-')} ({ref.get('distinct_prompts', '-')})"
                )
            return f"{mine.get(key, '-')} / {ref.get(key, '-')}"

        def yn(v: object) -> str:
            return "-" if v is None else ("yes" if v else "no")

        for f in report["faults"]:
            a = f["audit"]
            once = yn(
                a
                and a.get("steps_ok")
                and a.get("duplicated_trajectories") == 0
                and a.get("short_batches") == 0
            )
            saw = (f["user_saw"] or "(nothing: the run went on)").replace("|", "\\|")
            earlier = "" if "fault_run" in a else "(an earlier campaign, before the run's key) "
            lines.append(
                f"| {f['fault']} | {f['repeat']} | {f['at_step']} | {yn(f['completed'])} | {both(a, 'steps')} | "
                f"{both(a, 'prompts_used')} | {both(a, 'trajectories_admitted')} | "
                f"{both(a, 'final_checkpoint_version')} | {both(a, 'last_step_sampled_by')} | {once} | "
                f"{yn(a.get('same_prompts_as_uninterrupted'))} | {yn(a.get('prompt_counts_equal'))} | "
                f"{yn(a.get('same_trajectory_ids'))} | {a.get('lost_trajectories', '-')} / {a.get('extra_trajectories', '-')} | "
                f"{a.get('episodes_ended_as_error', '-')} | {f['recovery_s']} | {saw} | {earlier}{f['note']} |"
            )
        lines.append("")
    if report.get("summary", {}).get("fault_runs"):
        t = report["summary"]
        lines += [
            f"Totals over {t['fault_runs']} fault runs: {t['completed']} completed; prompts per step as uninterrupted "
            f"in {t['same_prompts_as_uninterrupted']}, prompt counts equal in {t['prompt_counts_equal']}, trajectory "
            f"ids equal in {t['same_trajectory_ids']}; trajectories lost {t['lost_trajectories']}, extra "
            f"{t['extra_trajectories']}, duplicated {t['duplicated_trajectories']}; episodes ended as error "
            f"{t['episodes_ended_as_error']}. Runs per fault: "
            + ", ".join(f"{name} {n}" for name, n in Counter(f["fault"] for f in report["faults"]).items())
            + ".",
            "",
        ]
    return lines


def markdown(report: dict) -> str:
    when = (f"`{report['command']}` on {report['machine']}, {report['date']}" if "meta" not in report
            else f"`{report['meta']['command']}`, {describe(report['meta'])}")  # fmt: skip
    lines = ["# Reliability: load and faults", "", f"{when}; model: {report['model']}.", ""]
    if "load_train" in report:
        lt = report["load_train"]
        lines += ["## Load: the full loop with up to 1,000 episodes in flight", ""]
        if "error" in lt:
            lines += [f"Did not run: {lt['error']}", ""]
        else:
            lines += [
                "| steps | trajectories/step | episodes in flight at the start / total | episodes/s | tool calls/s | step s p50 / max | "
                "episode s p50 / max (per-step means) | PSS MiB first third / last third / peak | errors |",
                "|---|---|---|---|---|---|---|---|---|",
                f"| {lt['steps']} | {lt['trajectories_per_step']} | {lt['episodes_started_before_step_0']} / {lt['episodes_total']} | "
                f"{lt['episodes_per_s']} | "
                f"{lt['tool_calls_per_s']} | {lt['step_s_p50']} / {lt['step_s_p99']} | {lt['episode_s_p50_over_steps']} / "
                f"{lt['episode_s_p99_over_steps']} | {lt['pss_mib_first_third_max']} / {lt['pss_mib_last_third_max']} / "
                f"{lt['pss_mib_peak']} | {lt['errors']} |",
                "",
            ]
    if "load_serve" in report:
        ls = report["load_serve"]
        lines += [
            "## Load: `agent-rl sandbox serve` (pool_size 2) under concurrent clients",
            "",
            "| clients | calls | calls/s | p50 ms | p99 ms | wrong answers | HTTP errors | server PSS MiB start / peak / end |",
            "|---|---|---|---|---|---|---|---|",
            f"| {ls['clients']} | {ls['calls']} | {ls['calls_per_s']} | {ls['p50_ms']} | {ls['p99_ms']} | {ls['wrong_answers']} | "
            f"{ls['http_errors']} | {ls['server_pss_mib_start']} / {ls['server_pss_mib_peak']} / {ls['server_pss_mib_end']} |",
            "",
        ]
    if report.get("faults"):
        lines += ["## Faults (each injected at a random step and moment; k=0)", ""]
    lines += fault_table(report)
    if report.get("skipped"):
        lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items()), ""]
    return "\n".join(lines) + "\n"


def save(report: dict, out: Path = RESULTS) -> None:
    """reliability.{json,md} in `out` (the summary recomputed from the fault runs)."""
    report["summary"] = summarize(report.get("faults", []))
    write("reliability", json.loads(json.dumps(report, default=str)), out, markdown, quiet=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default="load,serve,faults")
    parser.add_argument(
        "--faults",
        default="engine,sandbox_kill,sandbox_hang,docker,learner,disk,node_engine,node_learner,replica_add,replica_remove",
    )
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--calls-per-client", type=int, default=20)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "reliability")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--merge", action="store_true", help="keep the other sections of results/reliability.json"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite reliability.{json,md} (into --out) from results/reliability.json; run nothing",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results)"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        save(json.loads((RESULTS / "reliability.json").read_text()), args.out)
        return
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = (args.model or default_model(work)).resolve()
    only, wanted = set(args.only.split(",")), set(args.faults.split(","))
    rng = random.Random(args.seed)
    prov = Provenance()
    report: dict = {
        "meta": prov.meta(),
        "model": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model),
        "faults": [],
        "skipped": {},
    }
    out_json = args.out / "reliability.json"
    if args.merge and out_json.exists():  # keep the sections of an earlier run that this one does not redo
        earlier = json.loads(out_json.read_text())
        for key in ("load_serve", "load_train"):
            if key in earlier:
                report[key] = earlier[key]
        report["faults"], report["skipped"] = earlier.get("faults", []), earlier.get("skipped", {})
        earlier_command = earlier.get("meta", earlier).get("command")
        report["meta"]["command"] = f"{earlier_command}; then {report['meta']['command']}"

    def checkpoint() -> None:  # after each part: the results so far, the load and elapsed time as of now
        report["meta"] = prov.meta() | {"command": report["meta"]["command"]}
        save(report, args.out)

    redone: set[str] = set()

    def add(result: FaultResult) -> None:
        if result.fault not in redone:  # --merge: this run's rows of a fault replace the earlier ones
            redone.add(result.fault)
            report["faults"] = [f for f in report["faults"] if f["fault"] != result.fault]
        report["faults"].append(asdict(result))
        print(f"  {result.fault} #{result.repeat}: completed={result.completed} recovery={result.recovery_s} "
              f"audit={result.audit} saw={result.user_saw!r} {result.note}", flush=True)  # fmt: skip
        checkpoint()

    if "serve" in only:
        print(f"load: sandbox serve, {args.clients} clients", flush=True)
        report["load_serve"] = load_serve(work, args.clients, args.calls_per_client)
        print(f"  {report['load_serve']}", flush=True)
        checkpoint()
    if "load" in only:
        print("load: the full loop, 1,000 episodes in flight", flush=True)
        report["load_train"] = load_train(work, model)
        print(f"  { {k: v for k, v in report['load_train'].items() if k != 'pss_samples'} }", flush=True)
        checkpoint()
    if "faults" in only:
        refs: dict[str, list[dict]] = {}
        engines = {**K0, "placement.topology": "processes", "engines.count": 2, "engines.weight_sync": "disk"}
        for repeat in range(args.repeats):
            if "engine" in wanted:
                ref = reference_run(work, model, engines, refs)
                add(
                    inject_and_wait(
                        "engine server SIGKILL", repeat, rng, work, model, engines, fault_engine_kill, ref
                    )
                )
            if "sandbox_kill" in wanted:
                ref = reference_run(work, model, K0, refs)
                add(
                    inject_and_wait(
                        "sandbox fork-servers SIGKILL", repeat, rng, work, model, K0, fault_sandbox_kill, ref
                    )
                )
            if "sandbox_hang" in wanted:
                ref = reference_run(work, model, K0, refs)
                add(
                    inject_and_wait(
                        "sandbox call never returns (SIGSTOP)",
                        repeat,
                        rng,
                        work,
                        model,
                        K0,
                        fault_sandbox_hang,
                        ref,
                    )
                )
        if "learner" in wanted:
            for repeat in range(args.repeats):
                add(learner_kill(repeat, rng, work, model, reference_run(work, model, K0, refs)))
        if "disk" in wanted:
            if os.geteuid() != 0:
                report["skipped"]["disk full"] = "mounting a tmpfs needs root"
            else:
                for repeat in range(args.repeats):
                    add(disk_full(repeat, rng, work, model, reference_run(work, model, K0, refs)))
        if "docker" in wanted:
            docker_faults(report, add, work, model, rng, args.repeats, refs)
        if wanted & {
            "node_engine",
            "node_learner",
            "replica_add",
            "replica_remove",
        }:  # on a multi-node Ray cluster
            sys.path.insert(0, str(ROOT))
            from scripts.reliability_cluster import cluster_faults

            cluster_faults(add, work, model, rng, args.repeats, wanted)
    checkpoint()
    print((args.out / "reliability.md").read_text())


def docker_faults(
    report: dict,
    add: Callable[[FaultResult], None],
    work: Path,
    model: Path,
    rng: random.Random,
    repeats: int,
    refs: dict[str, list[dict]],
) -> None:
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        report["skipped"]["docker restart"] = "needs dockerd (scripts/install_system_deps.sh) and root"
        return
    root = Path(f"/tmp/agent-rl-reliability-dockerd-{os.getpid()}")
    root.mkdir(parents=True, exist_ok=True)
    daemon = Dockerd(root)
    try:
        daemon.start()
        from sandboxes.image import build_image

        image = build_image("agent-rl-sandbox:reliability", docker_host=daemon.host)
        env = docker_env(work, daemon.host, image)

        def restart(run: Run) -> str:
            t0 = time.monotonic()
            daemon.stop()
            stopped = time.monotonic() - t0
            daemon.start()
            return f"dockerd stopped in {stopped:.1f} s and started again in {time.monotonic() - t0 - stopped:.1f} s"

        sets = {**K0, "envs.train": env}
        ref = reference_run(work, model, sets, refs)
        for repeat in range(repeats):
            add(inject_and_wait("Docker daemon restarted", repeat, rng, work, model, sets, restart, ref))
    except Exception as e:  # the engine could not run here: say so in the report
        report["skipped"]["docker restart"] = f"{type(e).__name__}: {e}"
    finally:
        daemon.stop()
        subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True)


if __name__ == "__main__":
    main()
