"""Several Ray nodes on one machine (ray.cluster_utils.Cluster: a raylet per node, each with its own CPUs and
node-kind resource): `agent-rl train --address` places engines on `engines` nodes and learner ranks on the
`trainer` node, weights go by broadcast from the trainer node's rank 0 into the engine nodes' servers (gloo
here, NCCL on GPUs), and nodes are lost, added and drained mid-run.

Each test starts its own cluster and stops only it. They wait for events (a step logged, a file answered),
never for a fixed time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ray = pytest.importorskip("ray")
from scripts.cluster import LocalCluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINES_ON_A = (
    "placement.engine={node: engines, cpus: 1}",
    "engines.weight_sync=nccl",
    "engines.max_batch=8",
)


def train(
    cluster: LocalCluster, model: Path, run_dir: Path, *sets: str, resume: bool = False
) -> subprocess.Popen:
    base = [
        f"model.path={model}",
        f"logging.run_dir={run_dir}",
        "buffer.max_staleness=0",
        "placement.timeout_s=300",
    ]
    cmd = [sys.executable, "-m", "agent_rl.cli", "train", str(ROOT / "recipes" / "tiny_tir_smoke.yaml")]
    cmd += [a for s in (*base, *sets) for a in ("--set", s)] + ["--address", cluster.address]
    if resume:
        cmd = [
            sys.executable,
            "-m",
            "agent_rl.cli",
            "train",
            "--resume",
            str(run_dir),
            "--address",
            cluster.address,
        ]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_stops
    )


def _ctrl_c_stops() -> None:
    """The run starts with SIGINT at its default, so that Python turns the test's Ctrl-C into KeyboardInterrupt:
    a pytest started in the background by a script (`make test-heavy &`) inherits SIGINT ignored, and so would
    the run, which then trained on past the test's Ctrl-C to its 600 s limit (seen 2026-11-28)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def post_status(url: str, body: dict) -> int:
    """The HTTP status of a POST without credentials."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def batches(run_dir: Path) -> list[dict]:
    path = run_dir / "batches.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def wait_for(what: str, cond, proc: subprocess.Popen, timeout_s: float = 600.0):
    """Poll `cond()` until it is truthy (the event happened); fail if the run ends first or never gets there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := cond():
            return value
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{err[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {what} within {timeout_s:.0f} s")


def finish(proc: subprocess.Popen, timeout_s: float = 600.0) -> str:
    _, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]
    return err


def placed(run_dir: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in json.loads((run_dir / "placement.json").read_text())["processes"]:
        out.setdefault(p["role"], []).append(p["node"])
    return out


def members(run_dir: Path) -> list[dict]:
    path = run_dir / "engines" / "members.json"
    return json.loads(path.read_text())["members"] if path.exists() else []


def assert_every_token_is_its_steps_version(bs: list[dict]) -> None:
    """k=0: every token trained at step s was sampled by policy version s (weights reached the engines)."""
    assert [b["step"] for b in bs] == list(range(len(bs)))
    for b in bs:
        for runs in b["versions"]:
            assert {v for v, _ in runs} == {b["step"]}, (b["step"], runs)


@pytest.fixture
def cluster():
    """A cluster of its own, for a test that kills or adds nodes."""
    with LocalCluster({"a1": ("engines", 1), "a2": ("engines", 1), "b": ("trainer", 2)}) as c:
        yield c


@pytest.fixture(scope="module")
def stable_cluster():
    """Shared by the tests that leave every node up; the trainer node also hosts the sandbox service."""
    with LocalCluster({"a1": ("engines", 1), "a2": ("engines", 1), "b": ("trainer", 3)}) as c:
        yield c


NODES = "placement.nodes={engines: {count: 2, cpus: 1}, trainer: {cpus: 2}}"


def test_torch_ranks_on_the_trainer_node_broadcast_to_engines_on_two_engine_nodes(
    stable_cluster, tiny_model_dir, tmp_path
):
    c, run = stable_cluster, tmp_path / "run"
    proc = train(
        c, tiny_model_dir, run, "placement.nodes={engines: {count: 2, cpus: 1}, trainer: {cpus: 3}}", *ENGINES_ON_A,
        "engines.count=2", "learner.dp=2", "placement.learner={node: trainer, cpus: 1}",
        "placement.sandbox={node: trainer, cpus: 1}", "train.steps=3", "checkpoint.every=0",
    )  # fmt: skip
    ms = wait_for("both replicas up", lambda: m if len(m := members(run)) == 2 else None, proc)
    # each engine server listens on its own node's address and wants the run's key, which the driver's clients
    # (and their weight pushes) carry: without it, 401
    assert {m["node"]: urlsplit(m["name"]).hostname for m in ms} == {
        c.node_id("a1"): c.ips["a1"],
        c.node_id("a2"): c.ips["a2"],
    } and {c.ips["a1"], c.ips["a2"]} <= {"127.0.0.2", "127.0.0.3", "127.0.0.4"}
    assert [post_status(m["name"] + "/generate", {"input_ids": [1]}) for m in ms] == [401, 401]
    finish(proc)
    where = placed(run)
    assert sorted(where["engine"]) == sorted([c.node_id("a1"), c.node_id("a2")])
    assert where["learner"] == [c.node_id("b")] * 2 and where["sandbox"] == [c.node_id("b")]
    assert_every_token_is_its_steps_version(batches(run))
    assert len(batches(run)) == 3


def test_a_driver_started_on_a_node_of_the_wrong_kind_is_refused_in_one_line(
    stable_cluster, tiny_model_dir, tmp_path
):
    proc = train(stable_cluster, tiny_model_dir, tmp_path / "run", NODES, "placement.rollout={node: engines}")
    _, err = proc.communicate(timeout=600)
    lines = [ln for ln in err.splitlines() if ln.startswith("agent-rl:")]
    assert proc.returncode == 2 and len(lines) == 1, err[-2000:]
    assert (
        "placement.rollout.node is 'engines', but this driver runs on a node without that resource"
        in lines[0]
    )
    assert "--entrypoint-resources" in lines[0]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy
def test_megatron_tp2_ranks_share_the_trainer_node_and_train_over_gloo(cluster, tiny_model_dir, tmp_path):
    pytest.importorskip("megatron.core")
    run = tmp_path / "run"
    proc = train(
        cluster, tiny_model_dir, run, NODES, *ENGINES_ON_A, "engines.count=1", "learner.backend=megatron",
        "learner.tp=2", "placement.learner={node: trainer, cpus: 1}", "train.steps=3", "checkpoint.every=0",
        "algorithm.opob_mode=exact",
    )  # fmt: skip
    finish(proc)
    assert placed(run)["learner"] == [cluster.node_id("b")] * 2  # the TP group on one node
    assert placed(run)["engine"][0] in (cluster.node_id("a1"), cluster.node_id("a2"))
    assert_every_token_is_its_steps_version(batches(run))
    assert len(batches(run)) == 3


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy
def test_engines_lost_grown_into_a_new_node_drained_and_added_by_hand_while_training(
    cluster, tiny_model_dir, tmp_path
):
    """An engine node is lost (routed around, dropped from the weight group); a node joins and the job grows into
    it (engines.max_count); `agent-rl engines remove` drains a replica, `agent-rl engines add` starts one in the
    room it left; every trained token is still its step's version and no trajectory is lost or trained twice.
    The run has more steps than the test needs and is stopped (Ctrl-C) once the last change has served."""
    run = tmp_path / "run"
    proc = train(
        cluster, tiny_model_dir, run, NODES, *ENGINES_ON_A, "engines.count=2", "engines.max_count=2",
        "placement.learner={node: trainer, cpus: 2}", "train.steps=1000", "checkpoint.every=0",
    )  # fmt: skip
    wait_for("step 1", lambda: len(batches(run)) >= 2, proc)
    urls = {m["node"]: m["name"] for m in members(run)}
    cluster.kill("a2")  # the engine node is lost mid-run
    lost = urls[cluster.node_id("a2")]
    wait_for(
        "the lost replica dead or dropped",
        lambda: all(m["name"] != lost or m["state"] == "dead" for m in members(run)),
        proc,
    )
    lost_at = len(batches(run))
    wait_for("two steps without it", lambda: len(batches(run)) >= lost_at + 2, proc)
    cluster.add("a3", "engines", 1)  # the cluster grows (an autoscaler would do this): the job fills it
    a3 = cluster.node_id("a3")
    grown = wait_for("a replica on the new node", lambda: [m for m in members(run) if m["node"] == a3], proc)
    wait_for(
        "the new replica serving", lambda: any(m["node"] == a3 and m["served"] for m in members(run)), proc
    )
    gone = engines_cli("remove", str(run), urls[cluster.node_id("a1")], "--drain-s", "5")
    assert gone.returncode == 0 and gone.stdout.startswith("removed "), gone.stdout + gone.stderr
    assert urls[cluster.node_id("a1")] not in [m["name"] for m in members(run)]
    added = engines_cli("add", str(run))
    assert added.returncode == 0 and added.stdout.startswith(f"added http://{cluster.ips['a1']}:"), (
        added.stdout + added.stderr
    )
    new_url = added.stdout.split()[1]
    wait_for(
        "the added replica serving",
        lambda: any(m["name"] == new_url and m["served"] for m in members(run)),
        proc,
    )
    steps = len(batches(run))
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=600)
    by_name = {m["name"]: m for m in members(run)}
    assert by_name[grown[0]["name"]]["state"] == "live" and by_name[new_url]["node"] == cluster.node_id("a1")
    bs = batches(run)[:steps]
    assert_every_token_is_its_steps_version(bs)
    uids = [u for b in bs for u in b["uids"]]
    assert len(uids) == len(set(uids)) == steps * 2 * 8  # 2 groups of 8 per step, none twice
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[steps - 1])
    assert last["buffer/dropped_stale"] == 0  # no replica ever sampled with old weights under k=0


def engines_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent_rl.cli", "engines", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy
def test_losing_the_learner_node_stops_in_one_line_and_resume_uses_every_prompt_as_often(
    cluster, tiny_model_dir, tmp_path
):
    sets = (NODES, *ENGINES_ON_A, "engines.count=2", "learner.dp=2", "placement.learner={node: trainer, cpus: 1}",
            "train.steps=6", "checkpoint.every=2")  # fmt: skip
    reference = tmp_path / "uninterrupted"
    finish(train(cluster, tiny_model_dir, reference, *sets))
    run = tmp_path / "run"
    proc = train(cluster, tiny_model_dir, run, *sets)
    wait_for("a checkpoint and step 3", lambda: len(batches(run)) >= 4, proc)
    cluster.kill("b")
    _, err = proc.communicate(timeout=600)
    lines = [ln for ln in err.splitlines() if ln.startswith("agent-rl:")]
    assert proc.returncode == 2 and len(lines) == 1, err[-3000:]
    assert "learner rank" in lines[0] and "is gone" in lines[0] and "--resume" in lines[0]
    cluster.add("b2", "trainer", 2)  # the replacement node
    finish(train(cluster, tiny_model_dir, run, resume=True))
    done, ref = batches(run), batches(reference)
    assert [b["step"] for b in done] == list(range(6))
    assert Counter(t for b in done for t in b["tasks"]) == Counter(t for b in ref for t in b["tasks"])
    assert [sorted(b["tasks"]) for b in done] == [sorted(b["tasks"]) for b in ref]
    assert placed(run)["learner"][-2:] == [cluster.node_id("b2")] * 2
