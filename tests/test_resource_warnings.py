"""What `make run` and `make run-real` printed at their end, each traced to its cause: an aiohttp session opened
by an episode after the run had closed its engine client ("Unclosed client session", printed when the garbage
collector met it, during the final evaluation), the rollout loop left open at exit ("unclosed event loop"),
and a learner rank process ending with os._exit while tqdm's multiprocessing lock was registered ("leaked
semaphore objects")."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from agent_rl.engines.api import EngineUnavailable, SamplingParams
from agent_rl.engines.client import SGLangClient, VLLMClient
from agent_rl.loop_thread import LoopThread

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", [SGLangClient, VLLMClient])
async def test_a_closed_engine_client_refuses_requests_instead_of_opening_a_session(kind) -> None:
    client = kind("http://127.0.0.1:9")  # never reached: the client is closed before any request
    client.session()  # a session exists, as after the run's first request
    await client.close()
    with pytest.raises(EngineUnavailable, match="closed"):
        await client.generate([1, 2], SamplingParams(max_new_tokens=1), request_id="late")
    with pytest.raises(EngineUnavailable, match="closed"):
        await client.health()
    assert client._session is not None and client._session.closed, "no second session was opened"


def test_the_loop_thread_unwinds_its_tasks_and_closes_its_loop() -> None:
    loop = LoopThread()
    unwound = asyncio.Event()

    async def episode() -> None:
        try:
            await asyncio.Event().wait()  # still running when the run ends
        finally:
            unwound.set()

    async def start() -> None:
        asyncio.get_running_loop().create_task(episode())

    loop.call(start())
    gc.collect()  # what earlier tests in this process left is collected outside the record: only ours is in it
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loop.close()
        inner = loop.loop
        del loop
        gc.collect()
    assert inner.is_closed()
    assert unwound.is_set(), "the running task was cancelled and ran its finally block"
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]


def test_a_learner_rank_process_leaves_no_semaphore_behind(tiny_model_dir: Path) -> None:
    """A rank in a process of its own (placement.topology: processes), built, stepped never, closed: the
    interpreter that started it exits without the resource tracker's leaked-semaphore warning."""
    code = f"""
import warnings
warnings.simplefilter("error", ResourceWarning)
from agent_rl.config import Recipe
from agent_rl.learners import build
recipe = Recipe.model_validate({{
    "name": "sem", "model": {{"path": {str(tiny_model_dir)!r}}}, "envs": {{"train": "tiny_arith.yaml"}},
    "train": {{"steps": 1, "batch_prompts": 1}},
}})
learner = build(recipe.learner_spec, rank_cores=((0,),))
learner.close()
print("closed")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "closed" in out.stdout, out.stderr[-3000:]
    assert "leaked" not in out.stderr and "ResourceWarning" not in out.stderr, out.stderr[-3000:]
