"""Agent episodes through the gateway: the teacher scores every sampled token and nothing else.

The example agent calls the Python tool between two chat completions, so a trajectory holds sampled
tokens, template glue and a tool observation. The teacher sees the whole token sequence (the
observation is context) and only the sampled positions are targets: each score must equal a
transformers forward over the full sequence at that position, and nothing is kept for environment
tokens. The rewriting agent splits its episode into forks; those are scored too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from teacher_testlib import fp32_tolerance

import envs
from agent_rl.config import BufferConfig, RolloutConfig
from agent_rl.engines.api import EngineOptions
from agent_rl.engines.embedded.engine import EmbeddedEngine
from agent_rl.rollout.workers import PromptSource, Rollouts
from agent_rl.teacher import TeacherBuffer, TeacherScorer
from agent_rl.teacher.scorer import sampled_positions

pytest.importorskip("openai")
AGENTS = Path(__file__).resolve().parents[1] / "gateway" / "data"


async def _rollouts_with_teacher(spec_file: Path, student_dir, teacher_dir, *, groups: int = 1):
    from transformers import AutoTokenizer

    spec = envs.load(spec_file)
    tok = AutoTokenizer.from_pretrained(student_dir)
    student = EmbeddedEngine(student_dir, EngineOptions(max_batch=8, max_seq_len=512), seed=0)
    teacher = EmbeddedEngine(teacher_dir, EngineOptions(max_batch=4, max_seq_len=512), seed=0)
    scorer = TeacherScorer([teacher])
    sandbox = envs.make_sandbox(spec)
    buffer = TeacherBuffer(
        scorer, BufferConfig(max_staleness=2), batch_prompts=groups, group_size=spec.group_size
    )
    rollouts = Rollouts(
        RolloutConfig(temperature=1.0, max_concurrent_episodes=spec.group_size),
        buffer,
        PromptSource(envs.make(spec, tok, sandbox).tasks("train"), seed=0),
        lambda: envs.make(spec, tok, sandbox),
        student,
        max_seq_len=512,
        seed=0,
    )
    rollouts.start()
    try:
        taken = await buffer.take(groups)
        stats = buffer.stats()
    finally:
        await rollouts.stop()
        await scorer.close()
        await sandbox.close()
        await student.close()
        await teacher.close()
    return taken, stats


async def test_agent_episodes_get_teacher_scores_only_on_sampled_tokens(
    tool_model, tiny_model_dir, reference_logprobs
):
    # student: the tool-calling model; teacher: the tiny model it was fine-tuned from (same tokenizer)
    (group,), stats = await _rollouts_with_teacher(AGENTS / "example_agent.yaml", tool_model, tiny_model_dir)
    assert any(
        t.turns and t.turns[0].code_ran for t in group.trajectories
    )  # a tool observation in the context
    for traj in group.trajectories:
        ids = traj.prompt_ids + traj.response_ids
        positions = sampled_positions(traj)
        env_tokens = len(ids) - len(traj.prompt_ids) - len(positions)
        assert env_tokens > 0  # template glue and/or an observation between the calls
        assert traj.teacher_logprobs is not None and len(traj.teacher_logprobs) == len(positions)
        ref32, ref64 = reference_logprobs(ids, 1)  # the teacher's forward over the whole sequence
        at = torch.tensor(positions) - 1
        diff = float((torch.tensor(traj.teacher_logprobs, dtype=torch.float64) - ref64[at]).abs().max())
        assert diff <= fp32_tolerance(ref32[at], ref64[at]), (traj.uid, diff)
        flat = traj.flatten()
        assert flat.teacher_logprobs is not None
        for p, (m, t) in enumerate(zip(flat.loss_mask, flat.teacher_logprobs, strict=True)):
            assert (t == 0.0) if p not in set(positions) else (m == 1)  # no score kept off the sampled tokens
    assert stats["teacher/scored_tokens"] == sum(t.num_sampled for t in group.trajectories)


async def test_the_forks_of_a_split_agent_episode_are_scored_too(tiny_model_dir, monkeypatch):
    monkeypatch.syspath_prepend(
        str(AGENTS.parent)
    )  # the rewriting agent lives in tests/gateway/gateway_agents.py
    (group,), _ = await _rollouts_with_teacher(
        AGENTS / "rewriting_agent.yaml", tiny_model_dir, tiny_model_dir
    )
    forks = [t for t in group.trajectories if "." in t.uid.rsplit("/", 1)[1]]
    assert forks
    for t in group.trajectories:
        assert t.teacher_logprobs is not None and len(t.teacher_logprobs) == t.num_sampled
