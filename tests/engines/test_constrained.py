"""Grammar-constrained sampling in the embedded engine (xgrammar): the output matches the constraint, the
returned log-probs are those of the masked distribution sampled from, the unmasked ones those of the model's
full distribution (checked against a forward pass), and a continuation after an abort resumes the grammar."""

from __future__ import annotations

import json

import pytest
import torch

from agent_rl.engines.api import BadRequest, Constraint, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
}


def prompt(tok) -> list[int]:
    return tok("Is 3 * 4 = 12? Reply in JSON.", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("temperature", [1.0, 0.0])
async def test_json_schema_output_parses_and_masked_logprobs_renormalise_the_models(
    engine, hf_logprobs, temperature
):
    tok = engine.scheduler.tokenizer
    ids = prompt(tok)
    c = Constraint("json_schema", json.dumps(SCHEMA))
    for seed in range(3):
        gen = await engine.generate(
            ids,
            SamplingParams(temperature=temperature, max_new_tokens=40, seed=seed, constraint=c),
            request_id=f"c{seed}",
        )
        assert gen.finish_reason == "stop"
        text = tok.decode(gen.token_ids, skip_special_tokens=True)
        obj = json.loads(text)
        assert obj["answer"] in ("yes", "no") and isinstance(obj["sure"], bool)
        # unmasked: the model's own log-softmax of each token (T=1, no filters) == a plain forward pass
        ref = hf_logprobs(ids, gen.token_ids)
        torch.testing.assert_close(torch.tensor(gen.unmasked_logprobs), ref, atol=2e-4, rtol=0)
        # masked: renormalised over the allowed tokens, so never below the unmasked log-prob; a forced
        # token (only one allowed) has masked log-prob 0
        gaps = [m - u for m, u in zip(gen.logprobs, gen.unmasked_logprobs, strict=True)]
        assert min(gaps) >= -1e-5 and max(gaps) > 0.1
        if temperature == 1.0:
            assert sum(1 for lp in gen.logprobs if abs(lp) < 1e-6) >= 5  # `{"answer": "` is forced


async def test_unconstrained_requests_report_no_unmasked_logprobs_beside_constrained_ones(engine):
    tok = engine.scheduler.tokenizer
    c = Constraint("json_schema", json.dumps(SCHEMA))
    import asyncio

    free, guided = await asyncio.gather(
        engine.generate(prompt(tok), SamplingParams(max_new_tokens=8, seed=1), request_id="free"),
        engine.generate(prompt(tok), SamplingParams(max_new_tokens=40, seed=1, constraint=c), request_id="g"),
    )
    assert free.unmasked_logprobs is None and len(guided.unmasked_logprobs) == len(guided.token_ids)
    json.loads(tok.decode(guided.token_ids, skip_special_tokens=True))


async def test_a_continuation_resumes_the_grammar_after_the_tokens_already_sampled(engine):
    tok = engine.scheduler.tokenizer
    ids = prompt(tok)
    c = Constraint("json_schema", json.dumps(SCHEMA))
    first = await engine.generate(ids, SamplingParams(max_new_tokens=4, seed=3, constraint=c), request_id="a")
    assert first.finish_reason == "length"
    rest = await engine.generate(
        ids + first.token_ids,
        SamplingParams(
            max_new_tokens=40, seed=4, constraint=Constraint(c.kind, c.value, tuple(first.token_ids))
        ),
        request_id="b",
    )
    json.loads(tok.decode(first.token_ids + rest.token_ids, skip_special_tokens=True))


async def test_ebnf_and_bad_constraints(engine):
    tok = engine.scheduler.tokenizer
    gen = await engine.generate(
        prompt(tok),
        SamplingParams(max_new_tokens=20, constraint=Constraint("ebnf", 'root ::= "ok" | "no"')),
        request_id="e",
    )
    assert tok.decode(gen.token_ids, skip_special_tokens=True) in ("ok", "no")
    with pytest.raises(BadRequest, match="does not compile"):
        await engine.generate(
            prompt(tok), SamplingParams(constraint=Constraint("ebnf", "root ::= (")), request_id="bad"
        )
    with pytest.raises(BadRequest, match="resumed token"):
        bad = Constraint(
            "json_schema", json.dumps(SCHEMA), tuple(tok("zz", add_special_tokens=False)["input_ids"])
        )
        await engine.generate(prompt(tok), SamplingParams(constraint=bad), request_id="bad2")
