"""benchmarks/_core_profile.py: a process tree's CPU time by the role owning each thread, read from /proc.

The roles (pure functions) and the per-step window are checked on data; the sampler on a real child process
that burns CPU in a thread named as agent-rl's engine thread and in its main thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _core_profile import TICK, CpuSampler, process_role, thread_role  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")


def test_process_roles_of_both_systems() -> None:
    assert process_role("python benchmarks/trl_run.py --model M", None, True) == "trl"
    assert process_role("/usr/bin/bwrap --unshare-all -- python3", "driver", False) == "tools"
    assert process_role("python3 -c fork-server", "tools", False) == "tools"  # what runs in a sandbox
    assert process_role("python -m agent_rl.engines.embedded.server M --port 1", "driver", False) == "engine"
    spawn = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"
    assert process_role(spawn, "driver", False) == "learner"
    assert process_role("python -m agent_rl.cli train recipes/agent_arith.yaml", None, True) == "driver"


def test_thread_roles_split_the_driver_by_thread_name() -> None:
    assert thread_role("driver", "agent-rl-engine", inprocess=True) == "engine"
    assert thread_role("driver", "rollouts", inprocess=True) == "driver"
    assert thread_role("driver", "python", inprocess=True) == "learner"  # main thread: trainer + learner
    assert thread_role("driver", "python", inprocess=False) == "driver"  # the learner has its own process
    assert thread_role("engine", "rollouts", inprocess=False) == "engine"  # other processes: theirs


def test_per_step_leaves_out_start_up_and_the_first_step() -> None:
    s = CpuSampler(0)
    s.marks = {0: (0.0, {"driver": 5.0}), 1: (10.0, {"driver": 6.0, "engine": 1.0}),
               4: (16.0, {"driver": 9.0, "engine": 4.0, "learner": 1.5})}  # fmt: skip
    got = s.per_step()
    assert got == {"engine": 1.0, "learner": 0.5, "driver": 1.0, "wall": 2.0, "steps": 3}
    s.marks = {0: (0.0, {}), 1: (1.0, {})}
    assert s.per_step() is None  # one step after the first is not a window


CHILD = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {root!r})
    from agent_rl.thread_names import name_this_thread

    def burn(seconds):
        t0 = time.thread_time()
        while time.thread_time() - t0 < seconds:
            pass

    burned, leave = threading.Event(), threading.Event()

    def engine():
        name_this_thread("agent-rl-engine")
        burn(0.4)
        burned.set()
        leave.wait()  # alive (and so seen by the sampler) until the test has sampled

    t = threading.Thread(target=engine)
    t.start()
    burned.wait()
    burn(0.2)  # the main thread: the learner's, in-process
    print("done", flush=True)
    sys.stdin.readline()
    leave.set()
    t.join()
    """
)


def test_the_sampler_counts_a_real_process_threads_to_their_roles() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(root=str(ROOT))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "done"
        s = CpuSampler(proc.pid, inprocess=True)
        s.sample()
        roles = s.by_role()
    finally:
        proc.stdin.close()
        proc.wait()
    # the named thread's 0.4 s to the engine, the main thread's 0.2 s (plus start-up) to the learner; the
    # kernel counts CPU time in ticks of 1/TICK s (one tick of rounding per thread)
    assert roles["engine"] >= 0.4 - 1 / TICK
    assert roles["learner"] >= 0.2 - 1 / TICK
    assert set(roles) == {"engine", "learner"}
