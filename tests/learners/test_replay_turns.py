"""Routing replay on the right turn (issue 61, item 3) and replay that must change the learner (issue 60, item 4).

A 3-turn episode of a tiny random Qwen3-MoE (tests/formats/sparse_models.py: layers 0 and 2 sparse, top-2 of
8) is sampled turn by turn by the embedded engine, with tool output between the turns, and assembled as the
SimpleTIR loop does (rollout/episodes.py: append the turn, add the call's routing record, append the tool
output) and as the gateway does (gateway/assemble.py over recorded Calls). Each call's record is then edited
by its own rotation of the expert ids (call t: e -> e + t mod 8), standing for an engine whose routing differs
from call to call (a weight update between turns re-routes the prefix; a near-tie): only then does the turn a
position's routing came from show in the log-probs (in fp32 the learner's own routing is the engine's).

The learner with `routing_replay: rollout` must give, at every position, the log-prob of a forward whose
routers use the experts of the call that first fed that position (the turn that sampled it; for a turn's last
token and the tool output after it, the next turn's prefill), computed here by a separate router patch. The
tolerance is the fp32 parity bound of test_moe_parity.py (1e-4). Routes shifted by one turn, the newest record
on every turn, or no replay at all each move the log-probs by far more (asserted, so the test can fail).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))
from sparse_models import sparse_model  # noqa: E402

from agent_rl.config import Recipe  # noqa: E402
from agent_rl.engines.api import EngineOptions, SamplingParams  # noqa: E402
from agent_rl.engines.embedded.engine import EmbeddedEngine  # noqa: E402
from agent_rl.gateway.assemble import Assembler  # noqa: E402
from agent_rl.gateway.record import Call  # noqa: E402
from agent_rl.learners import build as build_learner  # noqa: E402
from agent_rl.learners.routing_replay import RouteBatch, RoutingReplay, routers_of  # noqa: E402
from agent_rl.types import Group, RoutedExperts, Trajectory  # noqa: E402

FP32_TOLERANCE = 1e-4  # the fp32 learner-engine parity bound (tests/formats/test_moe_parity.py)
SEPARATION = 1e-2  # a wrong routing on a few positions of this random model moves log-probs by >= this
EXPERTS, LAYERS, TOP_K = 8, 3, 2
PROMPT = [11, 873, 42, 1999, 7, 3051, 260, 18]
TOOL_OUTPUT = ([5, 77, 901, 4], [300, 12])  # tool output after turns 1 and 2 (prefilled by turns 2 and 3)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return sparse_model("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


@pytest.fixture(scope="module")
def calls(moe_dir) -> list[Call]:
    """Three engine calls of one episode (fp32, T=1), each prompt the previous history plus the tool output,
    each with its routing record as the engine reported it."""

    async def run() -> list[Call]:
        eng = EmbeddedEngine(moe_dir, EngineOptions(max_batch=1, max_seq_len=128, dtype="float32"))
        out, history = [], list(PROMPT)
        try:
            for turn in range(3):
                sp = SamplingParams(max_new_tokens=5, ignore_eos=True, seed=turn, return_routed_experts=True)
                g = await eng.generate(history, sp, request_id=f"turn{turn}")
                assert g.routed_experts is not None and g.routed_experts.positions == len(history) + 4
                out.append(Call(tuple(history), tuple(g.token_ids), tuple(g.logprobs), tuple(g.versions),
                                g.finish_reason, routed_experts=g.routed_experts))  # fmt: skip
                history += g.token_ids + (list(TOOL_OUTPUT[turn]) if turn < 2 else [])
        finally:
            await eng.close()
        return out

    return asyncio.run(run())


def rotated(routes: RoutedExperts, by: int) -> RoutedExperts:
    """Every recorded expert id moved by `by` (mod 8); -1 (a dense layer) stays."""
    ids = torch.tensor(routes.ids, dtype=torch.long)
    ids = torch.where(ids >= 0, (ids + by) % EXPERTS, ids)
    return RoutedExperts.from_ints(ids.tolist(), routes.width)


def edited(calls: list[Call]) -> list[Call]:
    """Call t's record rotated by t + 1: each turn's routing is its own."""
    return [Call(c.prompt_ids, c.token_ids, c.logprobs, c.versions, c.finish_reason,
                 routed_experts=rotated(c.routed_experts, t + 1)) for t, c in enumerate(calls)]  # fmt: skip


def simpletir_trajectory(calls: list[Call], uid: str = "tir/0") -> Trajectory:
    """What rollout/episodes.py builds: per turn, the sampled tokens, the call's routing, the tool output."""
    t = Trajectory(uid=uid, group_id=uid.split("/")[0], prompt_ids=list(PROMPT), reward=1.0)
    for turn, c in enumerate(calls):
        t.append_sampled(list(c.token_ids), list(c.logprobs), list(c.versions))
        t.set_routed_experts(c.routed_experts)
        if turn < 2:
            t.append_env(list(TOOL_OUTPUT[turn]))
    return t


def gateway_trajectory(calls: list[Call], uid: str = "gw/0") -> Trajectory:
    """What gateway/assemble.py builds from the session's recorded calls."""
    first = Trajectory(uid=uid, group_id=uid.split("/")[0], prompt_ids=[])
    asm = Assembler(first, fork=lambda: pytest.fail("a 3-turn episode that extends its prompt never splits"))
    for c in calls:
        asm.add(c)
    first.reward = 1.0
    return first


def per_turn_routes(calls: list[Call], shift: int = 0) -> torch.Tensor:
    """[positions, layers, top_k]: each position with the experts of the call that first fed it (shift=1: of
    the call one turn later, as a replay attached to the wrong turn would give it)."""
    n = calls[-1].routed_experts.positions
    out = torch.full((n, LAYERS, TOP_K), -1, dtype=torch.long)
    start = 0
    for t, c in enumerate(calls):
        src = calls[min(t + shift, len(calls) - 1)].routed_experts
        ids = torch.tensor(src.ids, dtype=torch.long).view(src.positions, LAYERS, TOP_K)
        end = c.routed_experts.positions
        out[start:end] = ids[start:end]
        start = end
    return out


def forced_logprobs(model: torch.nn.Module, ids: list[int], experts: torch.Tensor | None) -> torch.Tensor:
    """[T] log-probs of `ids` (0 at position 0) with every router using `experts` [T', layers, k] where recorded
    (None: the model's own routing): a router patch of its own, not the learner's hook."""
    saved = {}
    if experts is not None:
        for layer, r in routers_of(model).items():

            def forward(h, r=r, layer=layer):
                h = h.reshape(-1, r.hidden_dim)
                logits = F.linear(h, r.weight)
                probs = logits.float().softmax(-1)
                rec = torch.full((h.shape[0], TOP_K), -1, dtype=torch.long)
                rec[: experts.shape[0]] = experts[:, layer]
                use = torch.where((rec >= 0).all(-1, keepdim=True), rec, probs.topk(TOP_K, -1).indices)
                w = probs.gather(-1, use)
                return logits, (w / w.sum(-1, keepdim=True)).to(logits.dtype), use

            saved[r] = r.forward
            r.forward = forward
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    finally:
        for r, f in saved.items():
            r.forward = f
    lp = torch.zeros(len(ids))
    lp[1:] = logits[:-1].log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return lp


def learner_logprobs(model_dir, trajs: list[Trajectory], *, replay: str, pack: bool) -> tuple[dict, dict]:
    """(metrics, uid -> the learner's log-probs [T]) of one step on `trajs` (one group, lr tiny)."""
    recipe = Recipe.model_validate(
        {
            "name": "turns", "model": {"path": str(model_dir), "dtype": "float32"}, "envs": {"train": "tiny_arith.yaml"},
            "train": {"steps": 1, "batch_prompts": 1},
            "learner": {"lr": 1e-6, "dtype": "float32", "micro_batch_size": 8, "pack_sequences": pack},
            "algorithm": {"opob_mode": "proxy", "routing_replay": replay},
        }
    )  # fmt: skip
    learner = build_learner(recipe.learner_spec)
    try:
        m = dict(learner.step([Group("g", trajs)]))
        return m, {u: r.logprobs for u, r in learner.trained_rows().items()}
    finally:
        learner.close()


def loss_positions(t: Trajectory) -> torch.Tensor:
    return torch.tensor(t.flatten().loss_mask, dtype=torch.bool)


def test_both_assemblies_keep_each_turns_routing_on_its_own_positions(calls):
    """SimpleTIR's and the gateway's trajectory carry the same record: position p from the call that fed p first."""
    ed = edited(calls)
    for t in (simpletir_trajectory(ed), gateway_trajectory(ed)):
        got = torch.tensor(t.routed_experts.ids, dtype=torch.long).view(-1, LAYERS, TOP_K)
        assert torch.equal(got, per_turn_routes(ed)), t.uid
        assert not torch.equal(got, per_turn_routes(ed, shift=1))


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_three_turn_episode_is_replayed_turn_by_turn(moe_dir, calls, pack, hf_model):
    """The learner's log-probs are those of the per-turn routing, on packed and on padded rows (two
    trajectories of different lengths in one micro-batch), and every fed (token, layer) pair was replayed."""
    ed = edited(calls)
    short = simpletir_trajectory(ed[:2], uid="g/1")  # two turns: shorter, padded beside the others
    short.segments.pop()  # its trailing tool output: a trajectory ends on a sampled token
    trajs = [simpletir_trajectory(ed, "g/0"), short, gateway_trajectory(ed, "g/2")]
    m, lps = learner_logprobs(moe_dir, trajs, replay="rollout", pack=pack)
    assert m["rollout/routing_replayed_fraction"] == 1.0
    for t in trajs:
        ids = t.prompt_ids + t.response_ids
        cut = [c for c in ed if len(c.prompt_ids) < len(ids)]
        want = forced_logprobs(hf_model, ids, per_turn_routes(cut))
        shifted = forced_logprobs(hf_model, ids, per_turn_routes(cut, shift=1))
        own = forced_logprobs(hf_model, ids, None)
        newest = torch.tensor(cut[-1].routed_experts.ids, dtype=torch.long).view(-1, LAYERS, TOP_K)
        last_everywhere = forced_logprobs(hf_model, ids, newest)
        mask = loss_positions(t)
        got = lps[t.uid][: len(ids)]
        assert (got - want)[mask].abs().max() <= FP32_TOLERANCE, t.uid
        # the test can fail: each wrong routing moves the loss tokens' log-probs by far more than the bound
        for name, wrong in (
            ("no replay", own),
            ("shifted a turn", shifted),
            ("newest record", last_everywhere),
        ):
            if name != "shifted a turn" or len(cut) > 1:
                assert (wrong - want)[mask].abs().max() > SEPARATION, (t.uid, name)


def test_replay_off_leaves_the_learner_its_own_routing_and_reports_zero_replayed(moe_dir, calls, hf_model):
    """Issue 60's mutant (replay=False in the torch learner) seen at the learner: with edited routes the
    replayed log-probs differ from the learner's own, and with replay off the fraction is 0."""
    t = simpletir_trajectory(edited(calls), "g/0")
    m, lps = learner_logprobs(moe_dir, [t], replay="off", pack=True)
    ids = t.prompt_ids + t.response_ids
    mask = loss_positions(t)
    assert m["rollout/routing_replayed_fraction"] == 0.0
    assert (lps[t.uid][: len(ids)] - forced_logprobs(hf_model, ids, None))[mask].abs().max() <= FP32_TOLERANCE
    assert m["rollout/routing_agreement"] < 1.0  # the edited records are not the learner's routing


def test_a_padded_row_without_its_record_is_an_error_under_replay(hf_model, calls):
    """A forward row that matches none of the step's trajectories must not silently keep its own routing."""
    replay = RoutingReplay.attach(hf_model, replay=True)
    try:
        t = simpletir_trajectory(calls)
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        am = torch.ones_like(ids)
        rec = torch.tensor(t.routed_experts.ids, dtype=torch.int16).view(1, -1, LAYERS * TOP_K)
        routes = RouteBatch(F.pad(rec, (0, 0, 0, 1), value=-1), am.bool())
        other = torch.cat([ids[:, :-3], torch.zeros(1, 3, dtype=ids.dtype)], 1)  # another row, padded
        other_am = torch.cat([am[:, :-3], torch.zeros(1, 3, dtype=am.dtype)], 1)
        with replay.step(ids, am, routes):
            with replay.rows(ids, am), torch.no_grad():
                hf_model(input_ids=ids, attention_mask=am)
            rows = replay.rows(torch.cat([ids, other]), torch.cat([am, other_am]))
            with pytest.raises(ValueError, match="matches none of the step's 1 trajectories"), rows:
                pass
        stats = replay.pop_stats()
        assert stats["routing/replayed"] == stats["routing/fed"] == 2 * (ids.shape[1] - 1)  # 2 sparse layers
    finally:
        replay.close()


@pytest.fixture(scope="module")
def hf_model(moe_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
