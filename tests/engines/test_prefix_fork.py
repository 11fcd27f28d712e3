"""The embedded engine copies a running request's prompt keys into a new request that shares the prompt (a GRPO
group's other members, a common system prompt) instead of prefilling them again (`prefixes.PrefixIndex`,
`KVCache.fork`), and what it then computes is what a plain transformers forward computes.

The scheduler is stepped by hand (no engine thread, no timing), so which requests arrive in one step is fixed.
Log-probs are compared with a plain forward within tests/float_bounds.py's TINY_LOGPROB_ATOL (fp32, two code
paths); wrong keys (another prompt's, or none) move them by far more on the tiny random model."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from float_bounds import TINY_LOGPROB_ATOL

from agent_rl.engines.api import EngineOptions, SamplingParams
from agent_rl.engines.embedded.prefixes import BLOCK, PrefixIndex, block_keys
from agent_rl.engines.embedded.scheduler import Output, Request, Scheduler

PROMPT = [(7 * i + 3) % 500 + 5 for i in range(2 * BLOCK + 9)]  # two full blocks and part of a third


class Stepper:
    def __init__(self, model_dir: Path, **opts) -> None:
        self.sched = Scheduler(
            model_dir, EngineOptions(**({"max_batch": 8, "max_seq_len": 256} | opts)), seed=0
        )
        self.done: dict[str, Output] = {}

    def add(self, rid: str, prompt: list[int], *, seed: int = 0, tokens: int = 6) -> None:
        sp = SamplingParams(max_new_tokens=tokens, seed=seed, ignore_eos=True)
        self.sched.add(Request(rid, list(prompt), sp, self.record))

    def record(self, out: Output) -> None:
        self.done[out.rid] = out

    def step(self) -> None:
        self.sched.step()

    def finish(self) -> dict[str, Output]:
        while self.sched.has_work():
            self.sched.step()
        return self.done


def _close_to_forward(hf_logprobs, prompt: list[int], out: Output) -> float:
    g = out.generation
    return (hf_logprobs(prompt, g.token_ids) - torch.tensor(g.logprobs)).abs().max().item()


def test_group_members_admitted_together_copy_the_first_members_prompt(tiny_model_dir, hf_logprobs) -> None:
    s = Stepper(tiny_model_dir)
    for i in range(4):  # one step admits all four: the first is prefilled, the others copy its keys
        s.add(f"m{i}", PROMPT, seed=i)
    s.add("other", [9, 10, 11, 12], seed=9)  # shares nothing: prefilled with the first
    done = s.finish()
    assert done["m0"].cached_tokens == 0 and done["other"].cached_tokens == 0
    for i in range(1, 4):  # every prompt token but the last (its logits are needed) came from m0's slot
        assert done[f"m{i}"].cached_tokens == len(PROMPT) - 1
    for rid, out in done.items():
        prompt = PROMPT if rid != "other" else [9, 10, 11, 12]
        assert _close_to_forward(hf_logprobs, prompt, out) <= TINY_LOGPROB_ATOL, rid
    assert len({tuple(done[f"m{i}"].generation.token_ids) for i in range(4)}) > 1  # their own samples


def test_a_request_copies_the_prefix_it_shares_with_a_running_one(tiny_model_dir, hf_logprobs) -> None:
    s = Stepper(tiny_model_dir)
    s.add("long", PROMPT + [300, 301], tokens=30)
    s.step()  # prefilled; it runs on
    other = PROMPT[: BLOCK + 5] + [380, 381, 382]  # one full block and 5 more tokens in common
    s.add("other", other, seed=1)
    done = s.finish()
    assert done["other"].cached_tokens == BLOCK + 5
    assert _close_to_forward(hf_logprobs, other, done["other"]) <= TINY_LOGPROB_ATOL
    assert _close_to_forward(hf_logprobs, PROMPT + [300, 301], done["long"]) <= TINY_LOGPROB_ATOL


def test_nothing_is_copied_from_keys_of_older_weights(tiny_model_dir) -> None:
    s = Stepper(tiny_model_dir)
    s.add("before", PROMPT, tokens=30)
    s.step()
    s.sched.weights_changed(1)  # an in-flight update: "before" runs on with keys of version 0
    s.add("after", PROMPT)
    done = s.finish()
    assert done["after"].cached_tokens == 0


def test_a_finished_source_is_no_longer_copied_from_its_running_slot(tiny_model_dir) -> None:
    s = Stepper(tiny_model_dir)
    s.add("a", PROMPT, tokens=1)
    s.finish()
    assert len(s.sched.prefixes) == 0  # its blocks left the index with it
    s.add("b", PROMPT)  # its free slot still holds the keys: reused the usual way
    assert s.finish()["b"].cached_tokens == len(PROMPT) - 1


def test_scoring_requests_copy_their_groups_prompt_and_score_as_a_forward(tiny_model_dir, hf_model) -> None:
    s = Stepper(tiny_model_dir)
    answers = [[20, 21, 22], [23, 24], [25, 26, 27, 28]]
    for i, a in enumerate(answers):
        s.sched.add(Request(f"s{i}", PROMPT + a, SamplingParams(), s.record, score_from=len(PROMPT)))
    done = s.finish()
    assert [done[f"s{i}"].cached_tokens for i in range(3)] == [0, len(PROMPT) - 1, len(PROMPT) - 1]
    for i, a in enumerate(answers):
        with torch.no_grad():
            logits = hf_model(torch.tensor([PROMPT + a])).logits[0].float()
        ref = torch.log_softmax(logits[len(PROMPT) - 1 : -1], -1).gather(-1, torch.tensor(a)[:, None])[:, 0]
        assert (ref - torch.tensor(done[f"s{i}"].prompt_logprobs)).abs().max().item() <= TINY_LOGPROB_ATOL


def test_the_index_checks_tokens_behind_a_hash_collision() -> None:
    index = PrefixIndex()
    a = Request("a", PROMPT, SamplingParams(), lambda o: None)
    a.blocks = block_keys(PROMPT)
    index.add(a)
    assert index.find(PROMPT, block_keys(PROMPT)) == (a, len(PROMPT))
    other = [t + 1 for t in PROMPT]
    assert index.find(other, block_keys(PROMPT)) == (None, 0)  # the keys collide, the tokens differ
    index.remove(a)
    assert len(index) == 0 and index.find(PROMPT, block_keys(PROMPT)) == (None, 0)


def test_moe_routes_of_a_copied_prompt_are_the_sources(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))
    from sparse_models import sparse_model

    s = Stepper(sparse_model("qwen3_moe", tmp_path / "moe"), max_batch=4)
    for i in range(2):
        sp = SamplingParams(max_new_tokens=4, seed=i, ignore_eos=True)
        s.sched.add(Request(f"m{i}", list(PROMPT), sp, s.record, routed_experts=True))
    done = s.finish()
    assert done["m1"].cached_tokens == len(PROMPT) - 1
    first, second = (done[f"m{i}"].generation.routed_experts for i in range(2))
    n = len(PROMPT) * first.width  # the prompt's positions: the copy's routes are the source's
    assert list(second.ids[:n]) == list(first.ids[:n]) and max(second.ids[:n]) >= 0


def test_a_cache_with_recurrent_state_does_not_copy(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))
    from sparse_models import sparse_model

    s = Stepper(sparse_model("qwen3_next", tmp_path / "hybrid"), max_batch=4)
    assert s.sched.prefixes is None
    s.add("a", PROMPT)
    s.add("b", PROMPT)
    done = s.finish()
    assert done["b"].cached_tokens == 0
