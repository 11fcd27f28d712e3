"""Pause/abort/resume, continuations with prefix reuse, weight updates with versions, stop conditions."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from agent_rl.engines.api import BadRequest, EngineOptions, SamplingParams
from agent_rl.engines.embedded.engine import EmbeddedEngine

PROMPT = [7, 8, 9, 10, 11, 12, 13]
GREEDY = SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True)


async def wait_for_tokens(engine: EmbeddedEngine, rid: str, n: int) -> None:
    """Park the engine once request `rid` has produced n tokens, and wait for that. Parked, the engine takes
    no step (commands such as pause and abort still run) until `rid` leaves it, so the test's next pause,
    abort or cancel finds it in flight with exactly n tokens, however fast or loaded the machine is."""
    sched = engine.scheduler
    has_work = type(sched).has_work

    def reached() -> bool:
        return any(r.rid == rid and len(r.tokens) >= n for r in list(sched.running))

    hit = []

    def parked_has_work() -> bool:  # engine thread
        if reached():
            hit.append(True)
            return False
        if hit:  # `rid` left the engine: unpark for good
            sched.__dict__.pop("has_work", None)
        return has_work(sched)

    sched.has_work = parked_has_work  # type: ignore[method-assign]
    deadline = time.monotonic() + 600  # a guard for a hung test, not a speed limit
    while not reached():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rid} never reached {n} tokens")
        await asyncio.sleep(0.001)


async def test_paused_and_resumed_greedy_generation_is_token_identical_to_uninterrupted(engine):
    full = await engine.generate(PROMPT, GREEDY, request_id="full")

    task = asyncio.create_task(engine.generate_full(PROMPT, GREEDY, request_id="part"))
    await wait_for_tokens(engine, "part", 5)
    await engine.pause()
    first = await task
    k = len(first.generation.token_ids)
    assert first.generation.finish_reason == "abort" and 5 <= k < 60
    await engine.resume()

    rest = SamplingParams(temperature=0, max_new_tokens=60 - k, ignore_eos=True)
    second = await engine.generate_full(PROMPT + first.generation.token_ids, rest, request_id="cont")
    assert first.generation.token_ids + second.generation.token_ids == full.token_ids
    # The continuation reused the aborted request's cache slot: only its last token was prefilled.
    assert second.cached_tokens == len(PROMPT) + k - 1


async def test_requests_sent_while_paused_wait_for_resume(engine):
    await engine.pause()
    task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=3), request_id="w"))
    await asyncio.sleep(0.2)
    assert not task.done()
    await engine.resume()
    assert len((await task).token_ids) >= 1


async def test_tokens_after_a_weight_update_carry_the_new_version_and_new_weights(
    engine, hf_model, hf_logprobs
):
    task = asyncio.create_task(engine.generate(PROMPT, GREEDY, request_id="v"))
    await wait_for_tokens(engine, "v", 4)
    await engine.pause()
    before = await task
    new = {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in hf_model.named_parameters()}
    await engine.update_weights(version=1, tensors=new)
    await engine.resume()
    after = await engine.generate(
        PROMPT + before.token_ids, SamplingParams(max_new_tokens=10, ignore_eos=True), request_id="v2"
    )

    assert set(before.versions) == {0} and after.versions == [1] * 10
    updated = type(hf_model)(hf_model.config).eval()
    updated.load_state_dict(new, strict=False)
    diff = (
        hf_logprobs(PROMPT + before.token_ids, after.token_ids, model=updated) - torch.tensor(after.logprobs)
    ).abs()
    assert diff.max().item() <= 1e-4


async def test_update_from_safetensors_dir_matches_a_fresh_load_of_that_checkpoint(
    engine, hf_model, tmp_path
):
    torch.manual_seed(0)
    perturbed = type(hf_model)(hf_model.config)
    perturbed.load_state_dict({n: p + 0.1 * torch.randn_like(p) for n, p in hf_model.state_dict().items()})
    perturbed.save_pretrained(tmp_path)
    await engine.update_weights(version=7, path=str(tmp_path))
    got = await engine.generate(PROMPT, GREEDY, request_id="d")
    ref = perturbed.generate(torch.tensor([PROMPT]), max_new_tokens=60, do_sample=False, eos_token_id=None)
    assert got.token_ids == ref[0, len(PROMPT) :].tolist() and set(got.versions) == {7}


async def test_bad_weight_update_is_refused_and_leaves_weights_untouched(engine):
    ref = await engine.generate(PROMPT, GREEDY, request_id="r")
    with pytest.raises(BadRequest, match="unknown parameters"):  # the caller's mistake (a 400 over HTTP)
        await engine.update_weights(version=1, tensors={"model.nope.weight": torch.zeros(2)})
    params = dict(engine.scheduler.model.named_parameters())
    good = {"model.norm.weight": torch.ones_like(params["model.norm.weight"])}
    with pytest.raises(BadRequest, match="NaN"):
        await engine.update_weights(
            version=1, tensors={**good, "lm_head.weight": params["lm_head.weight"] * float("nan")}
        )
    again = await engine.generate(PROMPT, GREEDY, request_id="r2")
    assert again.token_ids == ref.token_ids and engine.version == 0


async def test_stop_string_ends_generation_and_its_tokens_are_in_the_output(engine):
    tok = engine.scheduler.tokenizer
    free = await engine.generate(PROMPT, GREEDY, request_id="s0")
    # Pick a stop string the greedy continuation produces at token 8 and not before.
    i = next(
        i
        for i in range(8, 60)
        if (s := tok.decode(free.token_ids[i : i + 1])).strip() and s not in tok.decode(free.token_ids[:i])
    )
    stop = tok.decode(free.token_ids[i : i + 1])
    g = await engine.generate(
        PROMPT,
        SamplingParams(temperature=0, max_new_tokens=60, stop=(stop,), ignore_eos=True),
        request_id="s",
    )
    assert g.finish_reason == "stop" and g.token_ids == free.token_ids[: i + 1]
    assert tok.decode(g.token_ids).endswith(stop)


async def test_stop_token_id_and_eos_end_generation(engine):
    free = await engine.generate(PROMPT, GREEDY, request_id="t0")
    t = free.token_ids[5]
    first = free.token_ids.index(t)
    g = await engine.generate(
        PROMPT, SamplingParams(temperature=0, max_new_tokens=60, stop_token_ids=(t,)), request_id="t"
    )
    assert g.finish_reason == "stop" and g.token_ids == free.token_ids[: first + 1]


async def test_max_new_tokens_and_full_context_finish_with_length(tiny_model_dir):
    eng = EmbeddedEngine(
        tiny_model_dir,
        EngineOptions(max_batch=2, max_seq_len=32),
    )
    try:
        a = await eng.generate(PROMPT, SamplingParams(max_new_tokens=5, ignore_eos=True), request_id="a")
        b = await eng.generate(PROMPT, SamplingParams(max_new_tokens=100, ignore_eos=True), request_id="b")
        with pytest.raises(BadRequest, match="does not fit the context"):
            await eng.generate(list(range(1, 33)), SamplingParams(), request_id="c")
    finally:
        await eng.close()
    assert (a.finish_reason, len(a.token_ids)) == ("length", 5)
    assert (b.finish_reason, len(PROMPT) + len(b.token_ids)) == ("length", 32)


async def test_abort_one_request_returns_its_partial_output_and_others_continue(engine):
    long = SamplingParams(max_new_tokens=200, ignore_eos=True)
    victim = asyncio.create_task(engine.generate(PROMPT, long, request_id="victim"))
    other = asyncio.create_task(
        engine.generate(PROMPT, SamplingParams(max_new_tokens=30, ignore_eos=True), request_id="other")
    )
    await wait_for_tokens(engine, "victim", 3)
    assert await engine.abort("victim") == 1
    v, o = await victim, await other
    assert v.finish_reason == "abort" and 3 <= len(v.token_ids) < 200
    assert len(v.logprobs) == len(v.versions) == len(v.token_ids)
    assert o.finish_reason == "length" and len(o.token_ids) == 30


async def test_cancelled_caller_frees_its_slot(engine):
    task = asyncio.create_task(
        engine.generate(PROMPT, SamplingParams(max_new_tokens=200, ignore_eos=True), request_id="c")
    )
    await wait_for_tokens(engine, "c", 2)
    task.cancel()
    deadline = time.monotonic() + 600  # a guard for a hung test, not a speed limit
    while engine.load and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert engine.load == 0


async def test_duplicate_rid_in_flight_is_refused(engine):
    task = asyncio.create_task(
        engine.generate(PROMPT, SamplingParams(max_new_tokens=100, ignore_eos=True), request_id="dup")
    )
    await wait_for_tokens(engine, "dup", 1)
    with pytest.raises(BadRequest, match="already in flight"):
        await engine.generate(PROMPT, SamplingParams(), request_id="dup")
    await engine.abort("dup")
    await task
