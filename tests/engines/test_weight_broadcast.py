"""Distributed weight update over gloo: our embedded server receives what the torch learner's rank broadcasts.

The server joins the learner's weight group through SGLang's /init_weights_update_group and
receives by /update_weights_from_distributed (agent_rl/weights/group.py); the sender is the real
`TorchRank` (rank 0 of the learner) in this process. NCCL is the same code with GPU tensors.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
import torch
from float_bounds import TINY_LOGPROB_ATOL

from agent_rl.engines.api import BadRequest, EngineError, EngineOptions, SamplingParams
from agent_rl.engines.client import SGLangClient
from agent_rl.engines.launch import EmbeddedServerHandle
from agent_rl.learners._torch_rank import RankSpec, TorchRank
from agent_rl.weights.group import GroupSpec, TensorMeta
from vcpo.step import StepConfig

pytestmark = pytest.mark.usefixtures("ranks_from_a_fork_server")  # tests/conftest.py

PROMPT = [20, 21, 22, 23, 24]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)


@dataclass
class Joined:
    server: EmbeddedServerHandle
    rank: TorchRank
    meta: TensorMeta
    group: str


def _rank(model_dir) -> TorchRank:
    spec = RankSpec(
        model_path=str(model_dir), weights_dtype="float32", compute_dtype="float32", lr=1e-3,
        betas=(0.9, 0.999), weight_decay=0.0, lr_schedule="constant", warmup_steps=0, total_steps=1,
        gradient_checkpointing=False, step=StepConfig(), seed=0,
    )  # fmt: skip
    return TorchRank(spec)


@pytest.fixture(scope="module")
def joined(tiny_model_dir) -> Iterator[Joined]:
    """A fresh server (its weights change here) that has joined a learner rank's group: world 2, engine rank 1."""
    from agent_rl.engines.launch import launch_embedded

    server = launch_embedded(str(tiny_model_dir), EngineOptions(max_batch=4, max_seq_len=128), threads=1)
    rank = _rank(tiny_model_dir)
    group = f"test-{uuid.uuid4().hex[:8]}"

    async def join() -> TensorMeta:
        client = server.client()
        try:
            assert await client.weight_group_size() == 1
            spec = GroupSpec(rank.weight_endpoint(client.host()), 2, group)
            assert spec.endpoint.backend == "gloo"
            _, meta = await asyncio.gather(
                client.init_weights_update_group(spec, 1), asyncio.to_thread(rank.join_weight_group, spec)
            )
            return meta
        finally:
            await client.close()

    try:
        yield Joined(server, rank, asyncio.run(join()), group)
    finally:
        server.stop()


async def _push(j: Joined, client: SGLangClient, version: int, meta: TensorMeta | None = None) -> None:
    await asyncio.gather(
        client.update_weights_from_distributed(meta or j.meta, version=version, group_name=j.group),
        asyncio.to_thread(j.rank.broadcast_weights),
    )


async def _version(j: Joined) -> str:
    async with aiohttp.ClientSession() as s, s.get(j.server.url + "/get_weight_version") as r:
        return (await r.json())["weight_version"]


def _hf_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp.gather(-1, torch.tensor(output)[:, None])[:, 0]


def test_announced_tensors_are_the_learners_hf_weights_in_its_order(joined):
    params = joined.rank.model.state_dict()
    assert joined.meta.names == tuple(params)
    assert joined.meta.shapes == tuple(tuple(t.shape) for t in params.values())
    assert set(joined.meta.dtypes) == {"float32"}


async def test_broadcast_update_loads_the_learners_weights_as_the_new_version(joined):
    client = joined.server.client()
    try:
        before = await client.generate(PROMPT, GREEDY, request_id="before")
        with torch.no_grad():  # a different policy: the learner's weights after "training"
            gen = torch.Generator().manual_seed(1)
            for p in joined.rank.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp_min(0.02))
        await client.pause()
        await _push(joined, client, version=7)
        await client.resume()
        after = await client.generate(PROMPT, GREEDY, request_id="after")
        assert await _version(joined) == "7"
    finally:
        await client.close()
    assert after.versions == [7] * len(after.token_ids)
    assert after.token_ids != before.token_ids  # greedy generation follows the new weights
    # the engine's log-probs are those of the sent weights: a transformers forward with them
    ref = _hf_logprobs(joined.rank.model.eval(), PROMPT, after.token_ids)
    assert torch.allclose(torch.tensor(after.logprobs), ref, atol=TINY_LOGPROB_ATOL), (after.logprobs, ref)


async def test_tensor_the_model_lacks_is_received_then_refused_and_the_group_still_works(joined):
    """Nothing is loaded, the 400 names the tensor, and the collective completed: the next update goes through."""
    client = joined.server.client()
    name, shape = joined.meta.names[0], joined.meta.shapes[0]
    bad = TensorMeta(("not.a.parameter",), ("float32",), (shape,))
    try:
        await client.pause()
        with pytest.raises(BadRequest, match="not.a.parameter"):
            await asyncio.gather(
                client.update_weights_from_distributed(bad, version=8, group_name=joined.group),
                asyncio.to_thread(_send_one, joined, joined.rank.model.state_dict()[name]),
            )
        assert await _version(joined) == "7"
        await _push(joined, client, version=9)
        await client.resume()
        assert (await client.generate(PROMPT, GREEDY, request_id="v9")).versions[0] == 9
    finally:
        await client.close()


def _send_one(j: Joined, tensor: torch.Tensor) -> None:
    from agent_rl.weights import group as weight_group

    assert j.rank._weight_group is not None
    weight_group.send([tensor], *j.rank._weight_group)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                        "world_size": 2, "backend": "nccl"}, "backend"),
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 2,
                                        "world_size": 2, "backend": "gloo"}, "rank_offset"),
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                        "world_size": 2, "backend": "gloo", "bogus": 1}, "bogus"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": [], "shapes": [[1]]}, "dtypes"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float99"], "shapes": [[1]]}, "float99"),
        ("/update_weights_from_distributed", {"names": ["a", "a"], "dtypes": ["float32"] * 2,
                                              "shapes": [[1], [1]]}, "duplicates"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]],
                                              "group_name": "nobody"}, "group_name"),
        ("/destroy_weights_update_group", {"group_name": "nobody"}, "nobody"),
    ],
)  # fmt: skip
async def test_bad_weight_group_requests_get_400_naming_the_field(server, path, body, field):
    async with aiohttp.ClientSession() as s, s.post(server.url + path, json=body) as r:
        text = await r.text()
        assert r.status == 400, text
    assert field in text


async def test_update_outside_a_weight_update_session_is_refused(joined):
    body = SGLangClient.distributed_update_body(joined.meta, 10, joined.group)
    async with (
        aiohttp.ClientSession() as s,
        s.post(joined.server.url + "/update_weights_from_distributed", json=body) as r,
    ):
        assert r.status == 400
        assert "begin_weight_update" in (await r.json())["message"]


async def test_in_process_engine_is_refused_for_broadcast_sync(tiny_model_dir):
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.loop_thread import LoopThread
    from agent_rl.weight_sync.broadcast import WeightBroadcast

    loop = LoopThread()
    try:
        engine = EmbeddedEngine(
            tiny_model_dir,
            EngineOptions(max_batch=1, max_seq_len=32),
        )
        with pytest.raises(EngineError, match="weight_sync: memory"):
            WeightBroadcast(engine, loop)
        await engine.close()
    finally:
        loop.close()


# ---- the learners' side through the Learner protocol: rank 0 in a worker process, collectives around it ----

TINY = dict(vocab_size=320, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)  # tp=2 divides it


def _learner(kind: str, model_dir):
    if kind == "megatron_tp2":
        pytest.importorskip("megatron.core", reason="megatron-core not installed")
        from agent_rl.learners import build

        return build(_recipe(model_dir, backend="megatron", tp=2).learner_spec, pool="processes")
    from agent_rl.learners import build

    return build(_recipe(model_dir, dp=2).learner_spec)


def _recipe(model_dir, **learner):
    from agent_rl.config import Recipe

    return Recipe.model_validate(
        {
            "name": "broadcast-test",
            "model": {"path": str(model_dir)},
            "envs": {"train": "unused.yaml"},
            "train": {"steps": 1, "batch_prompts": 2},
            "learner": learner,
        }
    )


@pytest.mark.parametrize("kind", ["torch_dp2", pytest.param("megatron_tp2", marks=pytest.mark.megatron)])
def test_learner_rank0_broadcast_replaces_a_different_engines_weights(kind, tmp_path):
    """The engine starts from other random weights; after one broadcast its log-probs are the learner's."""
    from transformers import AutoModelForCausalLM

    from agent_rl.engines.launch import launch_embedded
    from agent_rl.tools.tiny import build_tiny, sample_corpus

    learner_dir = build_tiny(tmp_path / "learner", sample_corpus(), seed=0, **TINY)
    engine_dir = build_tiny(tmp_path / "engine", sample_corpus(), seed=1, **TINY)
    learner = _learner(kind, learner_dir)
    try:
        with launch_embedded(
            str(engine_dir), EngineOptions(max_batch=2, max_seq_len=64), threads=1
        ) as server:
            after = asyncio.run(_join_and_push(learner, server.client()))
    finally:
        learner.close()
    assert after.versions == [1] * len(after.token_ids)
    reference = AutoModelForCausalLM.from_pretrained(learner_dir, dtype=torch.float32).eval()  # not stepped
    ref = _hf_logprobs(reference, PROMPT, after.token_ids)
    assert torch.allclose(torch.tensor(after.logprobs), ref, atol=TINY_LOGPROB_ATOL), (after.logprobs, ref)


async def _join_and_push(learner, client: SGLangClient):
    try:
        spec = GroupSpec(learner.weight_endpoint(client.host()), 1 + await client.weight_group_size(), "g")
        _, meta = await asyncio.gather(
            client.init_weights_update_group(spec, 1), asyncio.to_thread(learner.join_weight_group, spec)
        )
        await asyncio.gather(
            client.update_weights_from_distributed(meta, version=1, group_name="g"),
            asyncio.to_thread(learner.broadcast_weights),
        )
        return await client.generate(PROMPT, GREEDY, request_id="after")
    finally:
        await client.close()


# ---- the pool and the client's view of SGLang's sizes, against fakes at the HTTP / protocol boundary ----


class FakeSGLangGroupMember:
    """An SGLang server as `EnginePool` sees it through `WeightGroupMember`: a tp size, joins recorded."""

    def __init__(self, tp: int, healthy: bool = True) -> None:
        self.tp, self.healthy = tp, healthy
        self.joined: list[tuple[int, int]] = []  # (rank_offset, world_size)

    def host(self) -> str:
        return "10.0.0.7"

    async def weight_group_size(self) -> int:
        return self.tp

    async def init_weights_update_group(self, spec: GroupSpec, rank_offset: int) -> None:
        self.joined.append((rank_offset, spec.world_size))

    async def update_weights_from_distributed(self, meta, *, version, group_name) -> None: ...

    async def destroy_weights_update_group(self, group_name: str) -> None: ...

    async def health(self) -> bool:
        return self.healthy

    async def close(self) -> None: ...


async def test_pool_gives_each_fake_sglang_engine_consecutive_ranks_by_tp_size():
    from agent_rl.engines.pool import EnginePool
    from agent_rl.weights.group import Endpoint

    engines = [FakeSGLangGroupMember(2), FakeSGLangGroupMember(4), FakeSGLangGroupMember(1)]
    pool = EnginePool(engines)
    world = 1 + await pool.weight_group_size()
    await pool.init_weights_update_group(GroupSpec(Endpoint("10.0.0.1", 1, "nccl"), world, "g"), 1)
    assert world == 8 and pool.host() == "10.0.0.7"
    assert [e.joined for e in engines] == [[(1, 8)], [(3, 8)], [(7, 8)]]


async def test_pool_with_a_lost_fake_sglang_engine_asks_for_a_new_group_and_takes_it_back_through_one():
    from agent_rl.engines.pool import EnginePool
    from agent_rl.weights.group import Endpoint

    engines = [FakeSGLangGroupMember(1), FakeSGLangGroupMember(1, healthy=False)]
    pool = EnginePool(engines)
    await pool.init_weights_update_group(GroupSpec(Endpoint("10.0.0.1", 1, "nccl"), 3, "g"), 1)
    assert not pool.needs_regroup
    await pool.check_health()
    assert pool.alive == [True, False] and pool.needs_regroup  # the group lost a member
    meta = TensorMeta(("w",), ("float32",), ((1,),))
    with pytest.raises(EngineError, match="form a new group first"):
        await pool.update_weights_from_distributed(meta, version=1, group_name="g")
    engines[1].healthy = True
    await pool.check_health()  # answers again: it joins, but takes no work before it holds the weights
    assert pool.stats().states == ["live", "joining"] and pool.needs_regroup
    await pool.destroy_weights_update_group("g")
    await pool.init_weights_update_group(GroupSpec(Endpoint("10.0.0.1", 2, "nccl"), 3, "g2"), 1)
    assert engines[1].joined[-1] == (2, 3) and not pool.needs_regroup
    await pool.update_weights_from_distributed(meta, version=1, group_name="g2")
    assert pool.alive == [True, True]


@pytest.mark.parametrize(
    ("info", "expected"), [({"tp_size": 4, "dp_size": 1}, 4), ({"tp_size": 2, "dp_size": 2}, None)]
)
async def test_client_reads_the_group_size_from_a_fake_sglang_server_info(info, expected):
    """tp ranks join; SGLang refuses update_weights_from_distributed with dp_size > 1, so the client does first."""
    from aiohttp import web

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({**info, "pp_size": 1})

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = SGLangClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        if expected is None:
            with pytest.raises(EngineError, match="dp_size=2"):
                await client.weight_group_size()
        else:
            assert await client.weight_group_size() == expected
    finally:
        await client.close()
        await runner.cleanup()


def test_a_lost_learner_rank_is_raised_before_the_engines_failure_it_caused():
    """The engines' side of a push fails first (their peer, the learner rank, reset the connection: a 500),
    then the learner's side finds its rank gone: the rank's one-line error (a UserError) is what is raised, not
    the 500, which a push takes for a lost engine and regroups over (found under load in test_multinode)."""
    import threading

    from agent_rl.engines.api import EngineUnavailable
    from agent_rl.learners._pool import RankLost
    from agent_rl.loop_thread import LoopThread
    from agent_rl.weight_sync.broadcast import together

    engines_failed = threading.Event()

    async def engines() -> None:
        engines_failed.set()
        raise EngineUnavailable("POST /update_weights_from_distributed -> 500: connection reset by peer")

    def learner() -> None:
        assert engines_failed.wait(60)
        raise RankLost("learner rank 0 is gone (its node or process died): continue with --resume RUN_DIR")

    loop = LoopThread()
    try:
        with pytest.raises(RankLost, match="is gone"):
            together(loop, engines(), learner, settle_s=60.0)
    finally:
        loop.close()
