"""`agent-rl serve` and `agent-rl train` on Mixture-of-Experts and hybrid checkpoints; what the config refuses.

serve: SGLang's `/generate` with `return_routed_experts` answers the routing as SGLang does (base64
int32 in meta_info), and our SGLangClient reads it back to what the in-process engine reports.
train: the CLI runs the tiny_arith smoke recipe on a tiny Qwen3-MoE and Qwen3-Next (their tokenizer
is the tiny BPE one) with routing replay on, and logs the routing agreement beside the mismatch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sparse_models import sparse_model

from agent_rl.config import ConfigError, load_recipe
from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.client import SGLangClient
from agent_rl.engines.embedded.engine import EmbeddedEngine

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "tiny_tir_smoke.yaml"
MEGATRON = [
    "learner.backend=megatron",
    "algorithm.opob_mode=exact",
]  # the smoke recipe's proxy OPOB is the torch learner's


@pytest.fixture(scope="module")
def chat_dir(tiny_model_dir, tmp_path_factory):
    """arch -> a tiny random checkpoint with the tiny BPE tokenizer (what a recipe's model.path needs)."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = sparse_model(
                arch, tmp_path_factory.mktemp(f"{arch}_tok"), tokenizer_dir=tiny_model_dir
            )
        return made[arch]

    return get


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
async def test_serve_answers_routed_experts_as_sglang_does(arch, sparse_dir):
    from agent_rl.engines.launch import launch_embedded

    model_dir = sparse_dir(arch)
    prompt = [11, 873, 42, 1999, 7, 3051, 260]
    sp = SamplingParams(max_new_tokens=6, ignore_eos=True, seed=3, return_routed_experts=True)
    local = EmbeddedEngine(model_dir, EngineOptions(max_batch=2, max_seq_len=64))
    try:
        want = await local.generate(prompt, sp, request_id="a")
    finally:
        await local.close()
    handle = launch_embedded(str(model_dir), EngineOptions(max_batch=2, max_seq_len=64), threads=1)
    client = SGLangClient(handle.url)
    try:
        got = await client.generate(prompt, sp, request_id="b")
        plain = await client.request(
            "POST", "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}}
        )
    finally:
        await client.close()
        handle.stop()
    assert got.token_ids == want.token_ids
    assert got.routed_experts is not None and want.routed_experts is not None
    assert got.routed_experts == want.routed_experts  # width and every id, through base64 int32
    assert got.routed_experts.positions == len(prompt) + len(got.token_ids) - 1
    assert "routed_experts" not in plain["meta_info"]  # only when asked, as SGLang


def test_dense_hybrid_model_reports_no_routing(sparse_dir):
    import asyncio

    async def run():
        eng = EmbeddedEngine(sparse_dir("qwen3_5"), EngineOptions(max_batch=1, max_seq_len=64))
        try:
            return await eng.generate(
                [5, 6, 7], SamplingParams(max_new_tokens=2, return_routed_experts=True), request_id="x"
            )
        finally:
            await eng.close()

    assert asyncio.run(run()).routed_experts is None


def _train(model_dir: Path, run_dir: Path, *sets: str) -> list[dict]:
    cmd = [
        sys.executable, "-m", "agent_rl.cli", "train", str(SMOKE), "--set", f"model.path={model_dir}",
        "--set", f"logging.run_dir={run_dir}", "--set", "train.steps=2", "--set", "checkpoint.every=0",
        "--set", "buffer.max_staleness=0", *(x for s in sets for x in ("--set", s)),
    ]  # fmt: skip
    res = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
def test_train_runs_with_routing_replay_and_logs_agreement(arch, chat_dir, tmp_path):
    records = _train(chat_dir(arch), tmp_path / "run", "algorithm.routing_replay=rollout")
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert 0.0 <= r["rollout/routing_agreement"] <= 1.0 and r["rollout/routing_agreement_tokens"] > 0
        assert r["rollout/logprob_mismatch_max"] <= 1e-4  # fp32, k=0, routing replayed
        assert r["learner/moe_aux_loss"] > 0


def test_megatron_refuses_hybrid_models_and_moe_beyond_tp1_at_config_load(chat_dir):
    """Qwen3-MoE builds at tp = cp = 1 (tests/megatron/test_moe_megatron.py); hybrid models and MoE under tensor or
    context parallelism are refused in one line."""
    load_recipe(SMOKE, [f"model.path={chat_dir('qwen3_moe')}", *MEGATRON], check_model=True)
    for arch in ("qwen3_next", "qwen3_5"):
        with pytest.raises(
            ConfigError, match=r"--set learner.backend=megatron: learner.backend: megatron does not build"
        ):
            load_recipe(SMOKE, [f"model.path={chat_dir(arch)}", *MEGATRON], check_model=True)
    with pytest.raises(
        ConfigError, match=r"megatron builds Qwen3MoeForCausalLM at tp = cp = 1 only .* got tp=2"
    ):
        load_recipe(SMOKE, [f"model.path={chat_dir('qwen3_moe')}", *MEGATRON, "learner.tp=2"],
                    check_model=True)  # fmt: skip


def test_routing_replay_needs_a_model_with_experts(chat_dir, tiny_model_dir):
    with pytest.raises(
        ConfigError, match=r"routing_replay: rollout replays the experts .* has none: set it to off"
    ):
        load_recipe(
            SMOKE, [f"model.path={tiny_model_dir}", "algorithm.routing_replay=rollout"], check_model=True
        )
    with pytest.raises(
        ConfigError, match=r"routing_replay: rollout in the Megatron learner is built for tp = cp = 1"
    ):
        load_recipe(SMOKE, [f"model.path={chat_dir('qwen3_moe')}", "algorithm.routing_replay=rollout",
                            *MEGATRON, "learner.tp=2"])  # fmt: skip
    load_recipe(SMOKE, [f"model.path={chat_dir('qwen3_moe')}", "algorithm.routing_replay=rollout",
                        *MEGATRON], check_model=True)  # fmt: skip


def test_routing_replay_is_refused_with_vllm_engines(chat_dir):
    """VLLMClient does not read vLLM's routed experts: replay would fail at the first step, so config load says so."""
    sets = [f"model.path={chat_dir('qwen3_moe')}", "algorithm.routing_replay=rollout", "engines.type=vllm",
            "engines.urls=[http://127.0.0.1:9]"]  # fmt: skip
    with pytest.raises(
        ConfigError,
        match=r"routing_replay: rollout needs the engines' routed experts, which VLLMClient does not read",
    ):
        load_recipe(SMOKE, sets)
    load_recipe(SMOKE, sets[:2] + ["engines.type=sglang", "engines.urls=[http://127.0.0.1:9]"])
