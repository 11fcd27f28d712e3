"""LoRA end to end on the tiny model: only adapters train, exports (merged hf/ + PEFT hf_adapter/), resume,
and adapter-only pushes that the embedded engine applies exactly (in-process and over HTTP)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from learner_helpers import CPU, make_groups, recipe_for

from agent_rl import checkpoint
from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.learners import build
from agent_rl.learners.facade import RankLearner
from agent_rl.weights.adapters import Adapter

LORA = {"rank": 4, "alpha": 8.0}


def _lora_learner(model_dir: Path, **algorithm) -> RankLearner:
    # CPU: these tests compare the learner with CPU references (the embedded engine, exports reloaded here)
    return build(
        recipe_for(model_dir, learner={"lora": LORA, **CPU}, algorithm=algorithm or None).learner_spec
    )


def _state(learner: RankLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.local.model.state_dict().items()}


@pytest.mark.parametrize("opob_mode", ["exact", "proxy"])
def test_lora_step_changes_only_adapter_weights(tiny_model_dir: Path, opob_mode: str) -> None:
    learner = _lora_learner(tiny_model_dir, opob_mode=opob_mode)
    before = _state(learner)
    trainable = [n for n, p in learner.local.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    m = learner.step(make_groups(tiny_model_dir, n_groups=2, n=2))
    after = _state(learner)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed), sorted(changed)[:5]
    assert any(".lora_B." in k for k in changed)  # B starts at 0: the first step moves it
    assert all(math.isfinite(v) for v in m.values())
    if opob_mode == "exact":  # per-trajectory gradient norms over the adapter parameters
        assert m["vcpo/traj_grad_norm_mean"] > 0
    assert (
        m["weights/push_mib"]
        < 0.1 * sum(t.numel() * 4 for k, t in before.items() if "lora_" not in k) / 2**20
    )


def test_lora_exports_merged_hf_and_peft_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = _lora_learner(tiny_model_dir)
    learner.step(make_groups(tiny_model_dir, n_groups=2, n=2))
    ckpt = checkpoint.save(
        tmp_path, learner, checkpoint.LoopState(1, {}, {}), model_dir=tiny_model_dir, keep=1
    )
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        want = learner.local.model(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(ckpt / "hf", dtype=torch.float32)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        base_logits = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, ckpt / "hf_adapter")(ids).logits
    assert torch.allclose(merged, want, atol=1e-5) and torch.allclose(peft_logits, want, atol=1e-5)
    moved = float((merged - base_logits).abs().max())
    assert moved > 1e-5, moved  # the adapter is in the export


def test_lora_resume_restores_adapter_and_optimizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    groups = make_groups(tiny_model_dir, n_groups=2, n=2)
    a = _lora_learner(tiny_model_dir)
    a.step(groups)
    a.save(tmp_path / "learner")
    assert not (tmp_path / "learner" / "model.safetensors").exists()  # the adapter, not the base
    b = _lora_learner(tiny_model_dir)
    b.load(tmp_path / "learner")
    assert b.version == 1
    a.step(groups), b.step(groups)
    sa, sb = _state(a), _state(b)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _engine_logprobs(engine, prompt: list[int], n: int = 12) -> tuple[list[int], list[float]]:
    out = asyncio.run(
        engine.generate(prompt, SamplingParams(max_new_tokens=n, seed=1, ignore_eos=True), request_id="p")
    )
    return out.token_ids, out.logprobs


def _learner_logprobs(learner: RankLearner, prompt: list[int], tokens: list[int]) -> list[float]:
    from vcpo.logprobs import logprobs_of

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        return logprobs_of(learner.local.model, ids, torch.ones_like(ids))[0, len(prompt) :].tolist()


def test_embedded_engine_follows_every_adapter_push_exactly(tiny_model_dir: Path) -> None:
    """The verl#7495 trap: after each push the engine's log-probs move and equal the learner's (k=0)."""
    from agent_rl.engines.embedded.engine import EmbeddedEngine

    learner = _lora_learner(tiny_model_dir)
    engine = EmbeddedEngine(
        tiny_model_dir,
        EngineOptions(max_batch=2, max_seq_len=128),
    )
    prompt = [5, 17, 42, 7]
    try:
        base_params = {k: v.clone() for k, v in engine.scheduler.model.named_parameters()}
        seen: list[list[float]] = []
        first: Adapter | None = None
        for v in range(1, 4):
            learner.step(make_groups(tiny_model_dir, n_groups=2, n=2, seed=v))
            adapter = learner.adapter()
            assert adapter is not None
            first = first or adapter.clone()
            asyncio.run(engine.load_adapter(version=learner.version, adapter=adapter))
            tokens, lps = _engine_logprobs(engine, prompt)
            assert engine.version == v
            assert lps == pytest.approx(_learner_logprobs(learner, prompt, tokens), abs=2e-5)
            seen.append(lps)
        assert all(a != b for a, b in zip(seen, seen[1:], strict=False))  # every push changed the policy
        # weights depend on the base and the adapter alone: re-applying v1 after v3 gives v1's weights exactly
        asyncio.run(engine.load_adapter(version=9, adapter=first))
        params = dict(engine.scheduler.model.named_parameters())
        for w, (a, b) in first.pairs().items():  # type: ignore[union-attr]
            assert torch.equal(params[w], base_params[w] + first.scale * (b @ a))  # type: ignore[union-attr]
        asyncio.run(engine.unload_adapter())
        assert all(torch.equal(p, base_params[k]) for k, p in engine.scheduler.model.named_parameters())
    finally:
        asyncio.run(engine.close())


def test_adapter_over_http_sglang_endpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    """SGLangClient against `agent-rl serve`: /load_lora_adapter by path, /update_weight_version, lora_path on
    /generate; the served log-probs are the learner's, and a request naming another adapter is refused."""
    from agent_rl.engines.api import BadRequest
    from agent_rl.engines.launch import launch_embedded

    learner = _lora_learner(tiny_model_dir)
    learner.step(make_groups(tiny_model_dir, n_groups=2, n=2))
    adapter = learner.adapter()
    assert adapter is not None
    server = launch_embedded(str(tiny_model_dir), EngineOptions(max_batch=2, max_seq_len=128), threads=1)
    client = server.client()
    prompt = [5, 17, 42, 7]

    async def run() -> tuple[list[int], list[float], list[int]]:
        await client.load_adapter(version=1, path=str(adapter.save(tmp_path / "v1")))
        await client.load_adapter(
            version=2, adapter=adapter
        )  # in memory: a PEFT dir in /dev/shm, then unload v1
        sp = SamplingParams(max_new_tokens=8, seed=3, ignore_eos=True)
        out = await client.generate(prompt, sp, request_id="a")
        client.lora_name = "someone-else"
        with pytest.raises(BadRequest, match="not the loaded adapter"):
            await client.generate(prompt, sp, request_id="b")
        await client.close()
        return out.token_ids, out.logprobs, out.versions

    try:
        tokens, lps, versions = asyncio.run(run())
    finally:
        server.stop()
    assert versions == [2] * len(tokens)
    assert lps == pytest.approx(_learner_logprobs(learner, prompt, tokens), abs=2e-5)
