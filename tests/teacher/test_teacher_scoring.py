"""The teacher's call: log-probs of given tokens, from the embedded engine in-process and over SGLang's /generate."""

from __future__ import annotations

import asyncio

import pytest
import torch
from aiohttp.test_utils import TestServer
from teacher_testlib import fp32_tolerance

from agent_rl.engines.api import BadRequest, EngineOptions, SamplingParams
from agent_rl.engines.client import SGLangClient
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.engines.embedded.server import build_app

PREFIX = [5, 17, 33, 8, 91, 12, 40, 7, 64, 3, 250, 19]
SEQS = [  # (ids, first scored position): short and long, a shared prefix, the smallest start
    (PREFIX + [44, 2, 100, 101, 9, 77], len(PREFIX)),
    (PREFIX + [45, 46, 47], len(PREFIX)),
    ([11, 12], 1),
    (list(range(30, 130)), 20),
    (PREFIX, 1),
]


@pytest.fixture
async def engine(tiny_model_dir):
    eng = EmbeddedEngine(tiny_model_dir, EngineOptions(max_batch=3, max_seq_len=256), seed=0)
    yield eng
    await eng.close()


def _check(got: list[float], ids: list[int], start: int, reference_logprobs) -> None:
    ref32, ref64 = reference_logprobs(ids, start)
    assert len(got) == len(ids) - start
    diff = float((torch.tensor(got, dtype=torch.float64) - ref64).abs().max())
    assert diff <= fp32_tolerance(ref32, ref64), (ids[:4], start, diff)


async def test_teacher_logprobs_for_given_tokens_equal_a_hugging_face_forward(engine, reference_logprobs):
    # five requests on three cache slots: batched prefills, a queue, and the shared prefix found in a finished
    # slot; then the same sequences again, now mostly cached
    for round_ in range(2):
        got = await asyncio.gather(
            *(engine.score(ids, start=s, request_id=f"s{round_}.{i}") for i, (ids, s) in enumerate(SEQS))
        )
        for (ids, start), lp in zip(SEQS, got, strict=True):
            _check(lp, ids, start, reference_logprobs)


async def test_scoring_shares_a_batched_prefill_with_generation(engine, reference_logprobs):
    # admitted together: one prefill forward samples the generations' first tokens and scores the other
    sampling = SamplingParams(max_new_tokens=12, ignore_eos=True, seed=3)
    gen_a, scored, gen_b = await asyncio.gather(
        engine.generate([7, 8, 9], sampling, request_id="g1"),
        engine.score(SEQS[0][0], start=SEQS[0][1], request_id="s"),
        engine.generate([70, 80], sampling, request_id="g2"),
    )
    _check(scored, *SEQS[0], reference_logprobs)
    for prompt, gen in (([7, 8, 9], gen_a), ([70, 80], gen_b)):
        assert len(gen.token_ids) == 12
        _check(gen.logprobs, prompt + gen.token_ids, len(prompt), reference_logprobs)


@pytest.mark.parametrize(
    ("ids", "start", "match"),
    [
        ([1, 2, 3], 0, "1 <= start < 3"),
        ([1, 2, 3], 3, "1 <= start < 3"),
        (list(range(257)), 1, "max_seq_len=256"),
    ],
)
async def test_a_scoring_request_outside_the_sequence_or_the_context_is_refused(engine, ids, start, match):
    with pytest.raises(BadRequest, match=match):
        await engine.score(ids, start=start, request_id="bad")


async def test_sglang_generate_with_max_new_tokens_0_answers_input_token_logprobs_as_sglang_does(
    engine, tiny_model_dir, reference_logprobs
):
    server = TestServer(build_app(engine, str(tiny_model_dir)))
    await server.start_server()
    client = SGLangClient(str(server.make_url("")))
    try:
        ids, start = SEQS[0]
        raw = await client.request("POST", "/generate", SGLangClient.score_body(ids, start, "raw"))
        entries = raw["meta_info"]["input_token_logprobs"]
        # SGLang: logprob_start_len L = start - 1; entry i pairs token L + i with its log-prob, entry 0 with None
        assert [e[1] for e in entries] == ids[start - 1 :] and entries[0][0] is None
        assert raw["output_ids"] == [] and raw["meta_info"]["completion_tokens"] == 0
        _check(await client.score(ids, start=start, request_id="c"), ids, start, reference_logprobs)
        bad = dict(SGLangClient.score_body(ids, start, "x"), logprob_start_len=-1)  # max_new_tokens 0 alone
        with pytest.raises(BadRequest, match="scoring request"):
            await client.request("POST", "/generate", bad)
    finally:
        await client.close()
        await server.close()
