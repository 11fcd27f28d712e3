"""The HTTP server: SGLang-native shapes, the official openai client, bad requests, concurrency, weight pushes."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch
from float_bounds import TINY_LOGPROB_ATOL

from agent_rl.engines.api import BadRequest, EngineClient, SamplingParams
from agent_rl.engines.client import SGLangClient

PROMPT = [20, 21, 22, 23]


async def post(url: str, body, *, raw: bytes | None = None) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, json=None if raw is not None else body, data=raw) as r,
    ):
        return r.status, await r.json()


async def test_generate_answers_with_sglang_field_names(server):
    body = {
        "input_ids": PROMPT,
        "rid": "native-1",
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.8, "ignore_eos": True, "sampling_seed": 5},
    }
    status, r = await post(server.url + "/generate", body)
    assert status == 200
    meta = r["meta_info"]
    assert meta["id"] == "native-1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 6
    assert [t for _, t, _ in meta["output_token_logprobs"]] == r["output_ids"]
    assert all(lp < 0 for lp, _, _ in meta["output_token_logprobs"])
    assert meta["output_token_versions"] == [0] * 6 and meta["weight_version"] == "0"


@pytest.mark.parametrize(
    ("body", "raw", "message"),
    [
        ({"input_ids": [1, 2], "bogus": 1}, None, "bogus"),
        ({"input_ids": "not a list"}, None, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, None, "temperature must be"),
        ({"input_ids": [1], "sampling_params": {"min_p": 0.1}}, None, "min_p=0.1 is not supported"),
        ({"input_ids": list(range(1, 100)) * 6}, None, "does not fit the context"),
        ({"input_ids": [100_000]}, None, "outside the vocabulary"),
        (None, b"{not json", "malformed JSON"),
    ],
)
async def test_bad_generate_requests_get_400_with_a_message(server, body, raw, message):
    status, r = await post(server.url + "/generate", body, raw=raw)
    assert status == 400 and message in r["error"]["message"]


async def test_official_openai_client_gets_completions_and_chat_completions(server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")
    try:
        model = (
            (await client.models.list()).data[0].id
        )  # another name is a 404 (tests/engines/test_openai_api.py)
        c = await client.completions.create(
            model=model, prompt="Compute 3 * 4", max_tokens=8, logprobs=0, seed=1
        )
        chat = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Compute 3 * 4"}], max_tokens=8, logprobs=True
        )
    finally:
        await client.close()
    choice = c.choices[0]
    assert choice.finish_reason in ("stop", "length") and c.usage.completion_tokens == len(
        choice.logprobs.token_logprobs
    )
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    msg = chat.choices[0]
    assert msg.message.role == "assistant" and isinstance(msg.message.content, str)
    assert len(msg.logprobs.content) == chat.usage.completion_tokens >= 1


async def test_completions_with_token_ids_return_ids_as_tokens(server):
    status, r = await post(
        server.url + "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 5,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "ignore_eos": True,
        },
    )
    assert status == 200
    assert all(t.startswith("token_id:") for t in r["choices"][0]["logprobs"]["tokens"])
    status, r = await post(server.url + "/v1/completions", {"prompt": PROMPT, "logprobs": 21})
    assert status == 400 and r["error"]["param"] == "logprobs"


async def test_256_concurrent_requests_complete_with_correct_independent_outputs(server, hf_model):
    client = SGLangClient(server.url)
    prompts = [[1 + (i * 7 + j) % 300 for j in range(3 + i % 9)] for i in range(256)]
    lengths = [4 + i % 13 for i in range(256)]
    try:
        gens = await asyncio.gather(
            *(
                client.generate(
                    p, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True), request_id=f"c{i}"
                )
                for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
            )
        )
    finally:
        await client.close()
    # One padded HF forward checks every sequence: each token is the argmax of its own prefix, with its log-prob.
    seqs = [p + g.token_ids for p, g in zip(prompts, gens, strict=True)]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(ids, attention_mask=mask).logits.float(), -1)
    for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
        assert len(g.token_ids) == lengths[i] and g.finish_reason == "length"
        rows = lp[i, len(p) - 1 : len(p) - 1 + lengths[i]]
        chosen = rows.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert (chosen - torch.tensor(g.logprobs)).abs().max().item() <= TINY_LOGPROB_ATOL
        # greedy: nothing beats the chosen token by more than rounding (a near tie may go either way)
        assert (rows.max(-1).values - chosen).max().item() <= TINY_LOGPROB_ATOL


async def test_client_disconnect_drops_the_request(server):
    # Paused, the request waits in the queue for as long as we like; the client then gives up.
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}}
    async with aiohttp.ClientSession() as s:
        await s.post(server.url + "/pause_generation", json={})
        try:
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(
                    server.url + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=0.5)
                ):
                    pass
            for _ in range(12_000):  # until the server drops it; 600 s guards a hung test, not a speed limit
                async with s.get(server.url + "/get_load") as r:
                    load = await r.json()
                if load["num_waiting_reqs"] == 0:
                    break
                await asyncio.sleep(0.05)
        finally:
            await s.post(server.url + "/continue_generation", json={})
    assert load == {"num_running_reqs": 0, "num_waiting_reqs": 0}


async def test_sglang_client_pause_update_from_tensors_resume_over_http(server, hf_model):
    client = SGLangClient(server.url)
    assert isinstance(client, EngineClient) and await client.health()
    long = SamplingParams(max_new_tokens=500, ignore_eos=True)
    try:
        task = asyncio.create_task(client.generate(PROMPT, long, request_id="http-pause"))
        while (await client.request("GET", "/get_load"))["num_running_reqs"] == 0:
            await asyncio.sleep(0.002)
        await client.pause()
        cut = await task
        assert cut.finish_reason == "abort" and len(cut.token_ids) < 500
        tensors = {n: p.detach().clone() for n, p in hf_model.named_parameters()}  # same weights, new version
        await client.update_weights(version=3, tensors=tensors)
        await client.resume()
        g = await client.generate(
            PROMPT + cut.token_ids, SamplingParams(max_new_tokens=4), request_id="http-after"
        )
        assert g.versions == [3] * len(g.token_ids)
        info = await client.request("GET", "/get_model_info")
        assert info["weight_version"] == "3"
        with pytest.raises(BadRequest, match="does not exist"):
            await client.update_weights(version=4, path="/nonexistent/checkpoint")
        await client.update_weights(version=0, tensors=tensors)  # leave the session server as found
    finally:
        await client.resume()
        await client.close()


def test_launch_reports_why_the_server_did_not_start(tmp_path):
    from agent_rl.engines.launch import launch_embedded

    with pytest.raises(RuntimeError, match="config.json not found"):
        launch_embedded(str(tmp_path / "no-model-here"))
