"""A scripted policy drives every shipped env end to end through the real local sandbox.

The "engine" here is a script of turn texts encoded with the test tokenizer; everything
after it (parsing, code execution in bubblewrap, observations, rewards, budgets) is real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import envs
from envs.env import Env
from envs.types import StepResult

ENV_DIR = Path(__file__).resolve().parents[2] / "envs"
pytestmark = pytest.mark.asyncio(loop_scope="module")  # one loop for the module-wide sandbox


class Episode:
    def __init__(self, prompt: list[int]):
        self.prompt = prompt
        self.ids, self.mask = list(prompt), [0] * len(prompt)
        self.sampled: list[list[int]] = []
        self.results: list[StepResult] = []

    @property
    def last(self) -> StepResult:
        return self.results[-1]


async def play(env: Env, task, turns, tok, eos_last: bool = True) -> Episode:
    """Feed scripted turns (text or ids) as if sampled; cut each at the env's budget like an engine would."""
    ep = Episode(env.reset(task))
    for i, turn in enumerate(turns):
        ids = tok.encode(turn, add_special_tokens=False) if isinstance(turn, str) else list(turn)
        if eos_last and i == len(turns) - 1:
            ids.append(tok.eos_token_id)
        budget = env.max_new_tokens
        truncated = len(ids) > budget
        ids = ids[:budget]
        res = await env.step(ids, truncated=truncated)
        ep.sampled.append(ids)
        ep.results.append(res)
        ep.ids += ids + res.observation_ids
        ep.mask += [1] * len(ids) + [0] * len(res.observation_ids)
        if res.done:
            return ep
    return ep


def code(body: str) -> str:
    return f"Let me compute.\n```python\n{body}\n```\n"


# Per shipped env: (split, row, code that prints the right value, correct final text, wrong final text).
CASES = {
    "tiny_arith": ("test", 5, None, None, None),
    "simpletir_dapo": ("train", 0, "print(34)", r"The answer is \boxed{34}.", r"The answer is \boxed{35}."),
    "simpletir_math": (
        "test",
        0,
        "import math\nprint((3, math.pi / 2))",
        r"So the answer is \boxed{(3, \frac{\pi}{2})}.",
        r"So the answer is \boxed{(3, \pi)}.",
    ),
    "gsm8k_tool": ("test", 0, "print(16 - 3 - 4) ; print((16 - 3 - 4) * 2)", r"\boxed{18}", r"\boxed{9}"),
    "countdown_tool": (
        "test",
        0,
        "print(((76 - 47) + 55) - 60)",
        r"\boxed{((76 - 47) + 55) - 60}",
        r"\boxed{(76 - 47) + 55 + 60}",
    ),
}


def _case(name: str, spec: envs.EnvSpec, tok, sandbox):
    env = envs.make(spec, tok, sandbox=sandbox)
    split, row, body, right, wrong = CASES[name]
    task = env.tasks(split)[row]
    if name == "tiny_arith":
        expr = task.problem.removeprefix("What is ").removesuffix("?")
        body, right, wrong = (
            f"print({expr})",
            rf"\boxed{{{task.answer}}}",
            rf"\boxed{{{int(task.answer) + 1}}}",
        )
    return env, task, body, right, wrong


@pytest.mark.parametrize("name", sorted(CASES))
async def test_correct_code_then_answer_scores_one_and_wrong_answer_zero(name, tok, sandbox, shared_data):
    spec = envs.load(ENV_DIR / f"{name}.yaml")
    for final, reward in ((1, 1.0), (2, 0.0)):
        env, task, body, right, wrong = _case(name, spec, tok, sandbox)
        ep = await play(env, task, [code(body), right if final == 1 else wrong], tok)
        first, last = ep.results
        assert not first.done and first.info.code_ran and first.info.exit_code == 0, first
        assert first.observation_ids, "the tool output comes back as env tokens"
        assert last.done and last.reward == reward and last.info.finish == "answer" and not last.info.masked


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_void_turn_ends_and_masks_the_episode(name, tok, sandbox, shared_data):
    spec = envs.load(ENV_DIR / f"{name}.yaml")
    env, task, *_ = _case(name, spec, tok, sandbox)
    ep = await play(env, task, ["I think I need to look at this differently."], tok)
    (res,) = ep.results
    assert res.done and res.info.finish == "void" and res.info.masked and res.reward == 0.0


async def test_failing_code_shows_the_error_and_the_episode_goes_on(tok, sandbox):
    env = envs.make(envs.load(ENV_DIR / "tiny_arith.yaml"), tok, sandbox=sandbox)
    task = env.tasks("test")[5]
    ep = await play(env, task, [code("print(1 / 0)"), rf"\boxed{{{task.answer}}}"], tok)
    first = ep.results[0]
    assert first.info.code_ran and first.info.exit_code != 0
    assert "ZeroDivisionError: division by zero" in tok.decode(first.observation_ids)
    assert ep.last.done and ep.last.reward == 1.0


@pytest.mark.parametrize("name", sorted(CASES))
async def test_turn_limit_ends_the_episode_without_running_more_code(name, tok, sandbox, shared_data):
    spec = envs.load(ENV_DIR / f"{name}.yaml")
    env, task, *_ = _case(name, spec, tok, sandbox)
    n = spec.turns.max_turns
    ep = await play(env, task, [code(f"print({i})") for i in range(n + 1)], tok, eos_last=False)
    assert len(ep.results) == n
    assert all(r.info.code_ran and not r.done for r in ep.results[:-1])
    assert ep.last.done and ep.last.info.finish == "max_turns" and not ep.last.info.code_ran
    assert ep.last.reward == 0.0 and not ep.last.info.masked


@pytest.mark.parametrize("name", sorted(CASES))
async def test_per_turn_and_total_token_budgets_hold(name, tok, sandbox, shared_data):
    spec = envs.load(ENV_DIR / f"{name}.yaml")
    env, task, *_ = _case(name, spec, tok, sandbox)
    env.reset(task)
    t = spec.turns
    assert env.max_new_tokens == min(t.max_tokens_per_turn, t.max_response_tokens)
    turn = tok.encode(code("print(12345678)"), add_special_tokens=False)
    res = await env.step(turn)
    left = t.max_response_tokens - len(turn) - len(res.observation_ids)
    assert env.max_new_tokens == min(t.max_tokens_per_turn, left)
    # A turn the engine cut at max_new_tokens, with no answer in it, ends the episode as "length".
    rambling = tok.encode("hmm " * (env.max_new_tokens + 10), add_special_tokens=False)[: env.max_new_tokens]
    res = await env.step(rambling, truncated=True)
    assert res.done and res.info.finish == "length" and res.reward == 0.0 and not res.info.masked


async def test_an_observation_that_exhausts_the_response_budget_ends_the_episode(tok, sandbox):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    small = spec.model_copy(update={"turns": spec.turns.model_copy(update={"max_response_tokens": 40})})
    env = envs.make(small, tok, sandbox=sandbox)
    ep = await play(env, env.tasks("test")[5], [code("print('x' * 5000)"), "unused"], tok)
    assert len(ep.results) == 1 and ep.last.done and ep.last.info.finish == "length" and ep.last.info.code_ran
    assert sum(len(s) for s in ep.sampled) <= 40


async def test_tokens_are_prompt_plus_sampled_plus_observation_and_only_sampled_train(tok, sandbox):
    from agent_rl.types import Trajectory

    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    env = envs.make(spec, tok, sandbox=sandbox)
    task = next(t for t in env.tasks("test") if "*" in t.problem)
    expr = task.problem.removeprefix("What is ").removesuffix("?")
    ep = await play(env, task, [f"```python\nprint({expr})\n```\n", rf"\boxed{{{task.answer}}}"], tok)
    assert ep.prompt == tok.encode(task.problem + "\n", add_special_tokens=False)
    obs = ep.results[0].observation_ids
    assert obs == (
        tok.encode("```output\n", add_special_tokens=False)
        + tok.encode(task.answer, add_special_tokens=False)
        + tok.encode("\n```\n", add_special_tokens=False)
    )
    traj = Trajectory(uid="u", group_id="g", prompt_ids=ep.prompt)
    for sampled, res in zip(ep.sampled, ep.results, strict=True):
        traj.append_sampled(sampled, [-0.5] * len(sampled), 0)  # the engine's own tokens, untouched
        traj.append_env(res.observation_ids)
    flat = traj.flatten()
    assert flat.input_ids == ep.prompt + ep.sampled[0] + obs + ep.sampled[1]
    assert flat.loss_mask == [0] * len(ep.prompt) + [1] * len(ep.sampled[0]) + [0] * len(obs) + [1] * len(
        ep.sampled[1]
    )
    assert ep.last.reward == 1.0


async def test_unterminated_fence_is_void_or_length_never_run(tok, sandbox):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    env = envs.make(spec, tok, sandbox=sandbox)
    ep = await play(env, env.tasks("test")[5], ["```python\nprint(1)\n"], tok)
    assert ep.last.info.finish == "void" and not ep.last.info.code_ran
    env = envs.make(spec, tok, sandbox=sandbox)
    ep = await play(
        env, env.tasks("test")[5], ["```python\nprint(1)\n" + "x = 1\n" * 40], tok, eos_last=False
    )
    assert ep.last.info.finish == "length" and not ep.last.info.code_ran


async def test_a_one_megabyte_code_block_runs_without_crashing(tok, sandbox):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    big = spec.model_copy(
        update={
            "turns": spec.turns.model_copy(
                update={"max_tokens_per_turn": 10**7, "max_response_tokens": 10**7}
            )
        }
    )
    env = envs.make(big, tok, sandbox=sandbox)
    body = "s = 0\n" + "s += 1\n" * 150_000 + "print(s)"
    assert len(body) > 1_000_000
    ep = await play(env, env.tasks("test")[5], [code(body)], tok, eos_last=False)
    res = ep.last
    assert res.info.code_ran and not res.done
    shown = tok.decode(res.observation_ids)
    assert "150000" in shown or "Error" in shown  # ran, or failed cleanly inside the sandbox


async def test_non_utf8_byte_tokens_are_handled(tok, sandbox):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    bad = tok.convert_tokens_to_ids(
        ["¿", "ÿ", "Ā"]
    )  # lone continuation byte 0xBF, 0xFF, 0x00 (byte-level BPE)
    assert None not in bad and tok.unk_token_id not in bad
    env = envs.make(spec, tok, sandbox=sandbox)
    ids = (
        tok.encode("```python\nprint(1)", add_special_tokens=False)
        + bad
        + tok.encode("\n```\n", add_special_tokens=False)
    )
    env.reset(env.tasks("test")[5])
    res = await env.step(ids)
    assert res.info.code_ran and res.info.exit_code != 0  # a syntax error in the sandbox, not a crash here
    env = envs.make(spec, tok, sandbox=sandbox)
    env.reset(env.tasks("test")[5])
    res = await env.step(bad * 3)
    assert res.done and res.info.finish == "void"


async def test_session_mode_keeps_variables_across_turns(tok, sandbox):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    spec = spec.model_copy(
        update={
            "tool": spec.tool.model_copy(update={"session": True}),
            "turns": spec.turns.model_copy(update={"max_turns": 3}),
        }
    )
    env = envs.make(spec, tok, sandbox=sandbox)
    task = env.tasks("test")[5]
    ep = await play(env, task, [code("x = 41"), code("print(x + 1)"), rf"\boxed{{{task.answer}}}"], tok)
    assert "42" in tok.decode(ep.results[1].observation_ids)
    assert ep.last.done and ep.last.reward == 1.0
    # Without session mode every block runs in a fresh process: x is gone.
    env = envs.make(envs.load(ENV_DIR / "tiny_arith.yaml"), tok, sandbox=sandbox)
    ep = await play(env, task, [code("x = 41"), code("print(x + 1)")], tok, eos_last=False)
    assert ep.results[0].info.code_ran and ep.last.info.finish == "max_turns"


async def test_session_state_does_not_leak_into_the_next_episode(tok, sandbox):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    spec = spec.model_copy(
        update={
            "tool": spec.tool.model_copy(update={"session": True}),
            "turns": spec.turns.model_copy(update={"max_turns": 3}),
        }
    )
    task = envs.make(spec, tok).tasks("test")[5]
    await play(envs.make(spec, tok, sandbox=sandbox), task, [code("y = 7"), r"\boxed{1}"], tok)
    ep = await play(envs.make(spec, tok, sandbox=sandbox), task, [code("print(y)"), r"\boxed{1}"], tok)
    assert "NameError" in tok.decode(ep.results[0].observation_ids)


async def test_envs_made_per_episode_share_their_data(tok):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    a, b = envs.make(spec, tok), envs.make(spec, tok)
    assert a.tasks("train") is b.tasks("train")
    assert a.group_size == spec.group_size and a.stop_strings == ("\n```\n",)
    with pytest.raises(envs.EnvError, match="no split 'validation'"):
        a.tasks("validation")


async def test_a_callable_reward_is_called_with_its_kwargs_and_nan_is_refused(tok, tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        "def score(text, task, bonus=0.0):\n    return (1.0 if task.answer in text else 0.0) + bonus\n\n"
        "def broken(text, task):\n    return float('nan')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    base = envs.load(ENV_DIR / "tiny_arith.yaml")
    for import_path, kwargs in (("my_reward:score", {"bonus": 0.5}), ("my_reward:broken", {})):
        reward = base.reward.model_copy(
            update={"type": "callable", "import_path": import_path, "kwargs": kwargs}
        )
        env = envs.make(base.model_copy(update={"reward": reward}), tok)
        task = env.tasks("test")[5]
        env.reset(task)
        answer = tok.encode(rf"\boxed{{{task.answer}}}", add_special_tokens=False)
        if import_path.endswith("score"):
            assert (await env.step(answer)).reward == 1.5
        else:
            with pytest.raises(envs.EnvError, match="must be finite"):
                await env.step(answer)


async def test_envs_made_without_a_sandbox_share_one_per_event_loop(tok):
    spec = envs.load(ENV_DIR / "tiny_arith.yaml")
    a, b = envs.make(spec, tok), envs.make(spec, tok)
    task = a.tasks("test")[5]
    for env in (a, b):
        ep = await play(env, task, [code("print(6 * 7)")], tok, eos_last=False)
        assert "42" in tok.decode(ep.last.observation_ids)
    assert a._sandbox is b._sandbox is not None
    await envs.close_shared_sandboxes()
