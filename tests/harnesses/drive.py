"""Drive a real harness against the recording gateway in front of the embedded engine (tests/harnesses/).

An `Exchange` says what the harness is asked and what the over-fitted model answers at each call. `learn` builds
that model in rounds (harness_model.py); `Scenario.run` runs the harness once, then continues its session
(`resume`), both through ONE gateway session, and returns what the gateway recorded and what the engine returned.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_model import Capture, build, chat_of, overfit, redrawn, render_ids, train_tokenizer

from envs.harness import PRESETS, HarnessFailed, HarnessResult, Session, run_harness

CONTEXT = (
    4096  # max_position_embeddings and the engine's max_seq_len: above the prompts measured (tests assert)
)
TIMEOUT_S = 240.0  # one harness run; a hang fails the test (HarnessFailed) instead of the suite's timeout


@dataclass(frozen=True)
class Exchange:
    harness: str  # envs.harness preset
    api: str  # the route its model calls take ("/responses", "/chat/completions", "/messages")
    prompt: str
    resume_prompt: str | None
    answers: tuple[str, ...]  # the model's answer to each call of the scenario, in order
    # Regexes whose group is text the harness draws anew on every run (Codex's Chunk ID of a tool's output, its
    # wall time): each row holding one is also learnt with REDRAWS other draws, so that the model cannot tell
    # its calls apart by them (the rows of two calls come from two rounds' runs, with two different draws).
    volatile: tuple[str, ...] = ()

    @property
    def first_run_calls(self) -> int:
        return len(self.answers) - (1 if self.resume_prompt is not None else 0)


class Recording:
    """An engine client that keeps every Generation the embedded engine returned, by request id."""

    def __init__(self, engine: Any):
        self.engine, self.returned = engine, {}

    async def generate(self, input_ids, sampling, *, request_id):
        gen = await self.engine.generate(input_ids, sampling, request_id=request_id)
        self.returned[request_id] = gen
        return gen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class Tap:
    """A pass-through HTTP proxy in front of the gateway that keeps each answer's bytes (what the harness read)."""

    def __init__(self, target: str):
        self.target, self.answers, self.url, self._runner = target, [], None, None

    async def start(self) -> str:
        import aiohttp
        from aiohttp import web

        async def forward(request: web.Request) -> web.Response:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
            }
            async with (
                aiohttp.ClientSession() as http,
                http.request(
                    request.method,
                    self.target + request.rel_url.path_qs,
                    headers=headers,
                    data=await request.read(),
                ) as r,
            ):
                body = await r.read()
                self.answers.append((request.path, r.status, body))
                return web.Response(status=r.status, body=body, content_type=r.content_type)

        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        await self._runner.cleanup()


@dataclass
class Outcome:
    calls: list[Any]  # gateway.record.Call, in order, over both runs
    returned: dict[str, Any]  # request id -> the engine's Generation
    answers: list[tuple[str, int, bytes]] = field(
        default_factory=list
    )  # (path, status, body) the harness read
    results: list[HarnessResult | HarnessFailed] = field(default_factory=list)
    workdir: Path | None = None
    answer: str | None = None  # answer.txt the harness's tool wrote


def dirs(base: Path) -> tuple[Path, Path]:
    """The harness's working directory and HOME: the same paths every round (they are in its prompt), emptied."""
    workdir, home = base / "work", base / "home"
    for d in (workdir, home):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    return workdir, home


async def run_once(ex: Exchange, s: Session, workdir: Path, home: Path, prompt: str, resume: bool = False):
    launch = PRESETS[ex.harness](s, prompt, workdir, home, None, resume=resume)
    try:
        return await run_harness(
            launch, workdir, home, home / "logs" / ("resume" if resume else "first"), TIMEOUT_S
        )
    except HarnessFailed as e:
        return e


async def scenario(ex: Exchange, model_dir: Path, base: Path, *, calls: int | None = None) -> Outcome:
    """Run the harness (and its resume) against a fresh gateway session on `model_dir`; at most `calls` calls."""
    from transformers import AutoTokenizer

    from agent_rl.engines.api import EngineOptions, SamplingParams
    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.gateway.server import Gateway, SessionLimits

    workdir, home = dirs(base)
    engine = EmbeddedEngine(model_dir, EngineOptions(max_batch=2, max_seq_len=CONTEXT), seed=0)
    rec = Recording(engine)
    gw = Gateway(
        rec, AutoTokenizer.from_pretrained(model_dir), max_seq_len=CONTEXT, api_key="harness-test-key"
    )
    tap = None
    try:
        tap = Tap(await gw.start())
        await tap.start()
        gw.open(
            "ep",
            sampling=SamplingParams(temperature=0.0),
            limits=SessionLimits(max_calls=calls or len(ex.answers), max_tokens_per_call=64),
        )
        s = Session(f"{tap.url}/sessions/ep/v1", gw.api_key)
        out = Outcome([], rec.returned, tap.answers, workdir=workdir)
        out.results.append(await run_once(ex, s, workdir, home, ex.prompt))
        answer = workdir / "answer.txt"
        out.answer = answer.read_text().strip() if answer.exists() else None
        if ex.resume_prompt is not None and (calls is None or calls > ex.first_run_calls):
            out.results.append(await run_once(ex, s, workdir, home, ex.resume_prompt, resume=True))
        out.calls = list(gw.close_session("ep").calls)
        return out
    finally:
        if tap is not None and tap.url is not None:
            await tap.close()
        await gw.close()
        await engine.close()


async def learn(ex: Exchange, model_dir: Path, base: Path) -> Path:
    """Build the model that answers `ex.answers` to the harness's calls (harness_model.py: rounds)."""
    workdir, home = dirs(base)
    cap = Capture()
    url = await cap.start()
    try:
        await run_once(ex, Session(url + "/v1", "capture-key"), workdir, home, ex.prompt)
    finally:
        await cap.close()
    firsts = [(p, b) for p, b in cap.bodies if p.endswith(ex.api) and b.get("tools")]
    if not firsts:
        raise RuntimeError(
            f"{ex.harness} sent no {ex.api} request with tools; it sent {[p for p, _ in cap.bodies]}"
        )
    messages, tools = chat_of(*firsts[0])
    from agent_rl.openai import chat

    text = chat.render_text(train_tokenizer(["x"], 300), messages, tools, add_generation_prompt=True)
    tok = build(model_dir, [text], list(ex.answers), context=CONTEXT)
    rows = [(render_ids(tok, messages, tools), ex.answers[0])]
    overfit(model_dir, rows)
    for k in range(1, len(ex.answers)):  # round k+1: the harness's call k, with the model that answers 0..k-1
        out = await scenario(ex, model_dir, base, calls=k + 1)
        if len(out.calls) <= k:
            raise RuntimeError(
                f"{ex.harness} made {len(out.calls)} calls, expected a call {k + 1}: {out.results}"
            )
        ids = list(out.calls[k].prompt_ids)
        rows += [(v, ex.answers[k]) for v in [ids, *redrawn(tok, ids, ex.volatile, seed=k)]]
        overfit(model_dir, rows)
    return model_dir
