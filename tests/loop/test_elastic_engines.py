"""`agent-rl engines add|remove|list RUN_DIR` against a job's engines on one machine (local server processes,
no Ray): the request goes through the run dir, the job's watcher applies it, the answer comes back."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from agent_rl import hosts, placement
from agent_rl.cli import main
from agent_rl.engines import elastic
from agent_rl.engines.api import SamplingParams
from agent_rl.loop_thread import LoopThread

ROOT = Path(__file__).resolve().parents[2]


def test_a_request_with_no_job_running_says_so_in_one_line(tmp_path, capsys):
    assert main(["engines", "add", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no running job serves engine requests here" in err[0]


def test_replicas_are_added_listed_and_removed_through_the_run_dir(smoke_recipe, tmp_path, capsys):
    recipe = smoke_recipe("placement.topology=processes", "engines.count=1", "engines.weight_sync=disk",
                          "engines.max_batch=4")  # fmt: skip
    plan = placement.plan(recipe.engines, recipe.learner, recipe.placement)
    loop = LoopThread()
    run = tmp_path / "run"
    engines = loop.call(hosts.start_engines(plan, recipe.engines, recipe.model, seed=0, run_dir=run))
    try:
        before = [m["name"] for m in json.loads((run / "engines" / "members.json").read_text())["members"]]
        answers: dict[str, tuple[bool, str]] = {}
        t = threading.Thread(
            target=lambda: answers.update(add=elastic.request(run, {"op": "add"}, timeout_s=300))
        )
        t.start()
        t.join()
        ok, message = answers["add"]
        assert ok and message.startswith("added http://127.0.0.1:"), message
        new = message.split()[1]
        assert [m.name for m in engines.pool.members] == [*before, new]
        gen = loop.call(engines.client.generate([5, 6], SamplingParams(max_new_tokens=3), request_id="r"))
        assert len(gen.token_ids) == 3
        assert main(["engines", "remove", str(run), before[0], "--drain-s", "0", "--timeout", "300"]) == 0
        assert capsys.readouterr().out.startswith(f"removed {before[0]} (0 turn(s) aborted")
        assert [m.name for m in engines.pool.members] == [new]
        assert main(["engines", "remove", str(run), "http://nowhere:1"]) == 2
        assert "no engine 'http://nowhere:1' in this job" in capsys.readouterr().out
        assert main(["engines", "list", str(run)]) == 0
        listed = capsys.readouterr().out.splitlines()
        assert [ln.split()[1] for ln in listed] == [new]
    finally:
        loop.call(engines.close())
        loop.close()
    assert all(h.process.poll() is not None for h in engines.handles)  # what the job started is stopped
