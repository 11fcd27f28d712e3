"""The recording gateway: an OpenAI-compatible chat endpoint per episode, in front of any engine client.

    gw = Gateway(engine_client, tokenizer, max_seq_len=2048)     # embedded, SGLang, vLLM or a pool
    url = await gw.start()                                      # http://127.0.0.1:PORT
    session = gw.open("episode-17", sampling=SamplingParams(temperature=1.0))
    client = openai.AsyncOpenAI(base_url=gw.base_url("episode-17"), api_key=session.token)
    ... the agent calls client.chat.completions.create(...) as it would call OpenAI ...
    calls = gw.close_session("episode-17").calls                 # -> gateway.assemble

Each request's messages are rendered with the model's chat template to token ids by the gateway
itself (prompt.py: the prefix-extension rule), the engines get token ids only, and every choice is
recorded as a `Call` (prompt ids, sampled ids, behaviour log-probs, versions). When a weight update
aborts a request mid-way, the gateway sends the continuation (prompt + tokens so far, remaining
budget) and the agent sees one ordinary response whose tokens carry the versions that sampled them.

Agents in another process or language open sessions over HTTP, or claim a training run's tasks
(external.py: `POST /sessions`, `POST /tasks/claim`, `POST /sessions/{id}/close`). An agent in this
process gets `gw.client(sid)`: the official client over an in-process transport (inprocess.py) that
hands chat requests to the same handler (routes.py `chat_reply`) without a socket.

Who may call what (access.py): the gateway's key (`api_key`, the run's control key) opens every route; a
session's `token`, made when it opens and void when it closes, opens that session's routes only, and is the
api_key every agent is handed; the external agents' key opens `POST /tasks/claim` only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from agent_rl import auth
from agent_rl.engines.api import BadRequest, EngineAuthFailed, EngineClient, SamplingParams
from agent_rl.engines.protocol import stop_tuple
from agent_rl.gateway.access import Access, middleware
from agent_rl.gateway.inprocess import InProcessTransport, session_client
from agent_rl.gateway.listener import Listener
from agent_rl.gateway.prompt import Answered, PromptBuilder
from agent_rl.gateway.record import Call, EngineFailed, SessionLimits, SessionOver
from agent_rl.gateway.routes import GATEWAY, add_routes
from agent_rl.gateway.session import Session
from agent_rl.openai import anthropic_reply, chat, responses, structured
from agent_rl.openai.errors import Invalid, NotFound, errors_to_json
from agent_rl.openai.protocol import ChatReq
from agent_rl.openai.reasoning import get_reasoning_parser
from agent_rl.openai.tool_parsers import get_parser
from agent_rl.types import RoutedExperts
from envs.codec import codec

log = logging.getLogger(__name__)


class Gateway:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Any,
        *,
        max_seq_len: int,
        tool_parser: str = "hermes",
        reasoning_parser: str | None = None,
        model_name: str = "agent-rl-policy",
        host: str = "127.0.0.1",
        port: int = 0,
        max_retries: int = 3,
        api_key: str | None = None,
        external_key: str | None = None,
    ):
        """api_key: the gateway's control key, which opens every route (default: the run's, $AGENT_RL_API_KEY;
        never handed to an agent); external_key: opens POST /tasks/claim only (default
        $AGENT_RL_EXTERNAL_AGENT_KEY). Each session's agent gets a token of its own (Session.token, access.py)."""
        self.engine, self.tok, self.max_seq_len = engine, tokenizer, max_seq_len
        self.parser, self.parser_name = get_parser(tool_parser), tool_parser
        self.reasoning = get_reasoning_parser(reasoning_parser)  # the message gets reasoning_content
        self.model_name, self.host, self.port, self.max_retries = model_name, host, port, max_retries
        self.api_key = api_key or auth.run_key()  # the training side's; agents get their session's token
        self.access = Access(self.api_key, external_key or auth.external_key())
        # the embedded engine resumes a constrained call's grammar after an abort; others restart the call
        self.resumes_constraints = bool(getattr(engine, "resumes_constraints", False))
        self.builder = PromptBuilder(tokenizer)
        self.codec = codec(tokenizer)
        self.sessions: dict[str, Session] = {}
        self.response_stores: dict[str, responses.Store] = {}  # previous_response_id, per session
        from agent_rl.gateway.external import Board

        self.board = Board()  # tasks of `type: external` envs, claimed over HTTP (external.py)
        self.record_path: str | None = (
            None  # `agent-rl gateway --record`: closed sessions appended as JSON lines
        )
        self.url: str | None = None
        self.engine_retries = 0
        self.warned_masked = False  # logged once: constrained calls fell back to masked log-probs
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._transport: Any = None  # inprocess.InProcessTransport, made by the first client()
        self._starting: asyncio.Lock | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application(
            middlewares=[anthropic_reply.compat, middleware(self.access), errors_to_json],
            client_max_size=64 * 1024**2,
        )
        app[GATEWAY] = self
        from agent_rl.gateway.external import add_session_routes

        add_routes(app)
        add_session_routes(app, GATEWAY)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        assert self._runner.server is not None
        self._listener = Listener(self._runner.server)  # not TCPSite: see listener.py (CPython gh-109564)
        self.url = f"http://{self.host}:{self._listener.start(self.host, self.port)}"
        return self.url

    async def close(self) -> None:
        """The run is over: claims waiting for a task are answered 410 (external agents stop), the port closes,
        requests in progress get their answers, and no connection this gateway accepted is left open (listener.py)."""
        self.board.close()
        if self._transport is not None:
            await self._transport.close()
        if self._listener is not None:
            await self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._listener = None

    async def ensure_started(self) -> str:
        """The HTTP server's URL, started now if it is not yet (once, however many callers ask at once)."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            return self.url or await self.start()

    def client(self, sid: str) -> Any:
        """An `openai.AsyncOpenAI` for session `sid` served in this process (inprocess.py); close it after."""
        if self._transport is None:
            self._transport = InProcessTransport(self)
        # a session not open: its client's calls are answered 404 (or 401 if guarded)
        s = self.sessions.get(sid)
        return session_client(self._transport, sid, s.token if s is not None else "")

    def base_url(self, sid: str) -> str:
        if self.url is None:
            raise RuntimeError("Gateway.start() first")
        return f"{self.url}/sessions/{sid}/v1"

    def open(
        self,
        sid: str,
        *,
        sampling: SamplingParams | None = None,
        limits: SessionLimits = SessionLimits(),
        seed: int = 0,
        on_call: Callable[[Call], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Session:
        if sid in self.sessions:
            raise Invalid(f"session {sid!r} is already open", param="session_id")
        if "/" in sid:
            raise Invalid(f"session id {sid!r} must not contain '/'", param="session_id")
        s = Session(sid, sampling, limits, seed, self.access.grant(sid), on_call, should_stop)
        self.sessions[sid] = s
        return s

    def close_session(self, sid: str) -> Session:
        self.response_stores.pop(sid, None)
        self.access.revoke(sid)  # its token opens nothing from now on
        s = self.sessions.pop(sid)
        s.closed = True
        return s

    def session(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            raise NotFound(f"no open session {sid!r} (open one with POST /sessions)", param="session")
        return s

    # -- one chat completion --------------------------------------------------------------
    async def complete(self, s: Session, req: ChatReq) -> dict:
        s.check()
        structure = structured.for_chat(req, self.parser_name)
        if s.limits.max_calls is not None and s.stats.calls >= s.limits.max_calls:
            s.over = f"call budget spent ({s.limits.max_calls} chat completions per episode)"
            raise SessionOver(f"session {s.id}: {s.over}")
        messages = chat.template_messages(req.messages)
        tools = chat.template_tools(req.tools)
        built = self.builder.prepare(messages, tools, req.chat_template_kwargs, s.answered)
        ids, extended = built.ids, built.extended
        if len(ids) >= self.max_seq_len:
            s.over = f"context full (prompt {len(ids)} tokens, context {self.max_seq_len})"
            chat.check_context(len(ids), self.max_seq_len)
        budget = [self.max_seq_len - len(ids)]
        if req.max_tokens is not None:
            budget.append(req.max_tokens)
        if s.limits.max_tokens_per_call is not None:
            budget.append(s.limits.max_tokens_per_call)
        if s.limits.max_sampled_tokens is not None:
            budget.append(s.limits.max_sampled_tokens - s.stats.sampled_tokens)
        if min(budget) < 1:
            s.over = f"token budget spent (prompt {len(ids)} tokens, context {self.max_seq_len})"
            raise SessionOver(f"session {s.id}: {s.over}")
        call_no = s.stats.calls
        s.stats.calls += 1
        s.stats.extended += int(extended)
        s.stats.rerendered += int(not extended)
        base = replace(
            req.to_params(min(budget)),
            constraint=structure.constraint,
            stop=stop_tuple(req.stop) + structure.stop,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
        )
        if s.sampling is not None:
            base = replace(
                base, temperature=s.sampling.temperature, top_p=s.sampling.top_p, top_k=s.sampling.top_k
            )
        t0 = time.monotonic()
        try:
            calls = await asyncio.gather(
                *(self._sample(s, ids, base, f"{s.id}/{call_no}.{i}", extended) for i in range(req.n))
            )
        except (SessionOver, BadRequest):
            raise
        except EngineAuthFailed as e:  # the run's misconfiguration, not the agent's call: it spends no budget
            s.stats.calls -= 1
            s.stats.extended -= int(extended)
            s.stats.rerendered -= int(not extended)
            raise EngineFailed(
                f"session {s.id}: engine failed: {e}", public="the gateway's engines refused its key"
            ) from e
        except Exception as e:  # engines down after retries
            raise EngineFailed(f"session {s.id}: engine failed: {e!r}") from e
        parser = self.parser if req.parse_tools else None
        stops = chat_stops(req)
        choices = []
        for i, c in enumerate(calls):
            c = replace(c, seconds=time.monotonic() - t0)
            text = self.codec.decode(c.token_ids, skip_special_tokens=req.skip_special_tokens)
            if not req.include_stop_str_in_output:
                text = _cut_stop(text, stops)
            lps = (
                chat.logprob_content(self.tok, c.token_ids, c.logprobs, c.top_logprobs)
                if req.logprobs
                else None
            )
            ch = chat.choice(i, text, c.finish_reason, parser, lps, reasoning=self.reasoning)
            s.answered.append(Answered(built.keys, built.context, c.prompt_ids, c.token_ids, ch["message"]))
            s.calls.append(c)
            s.stats.sampled_tokens += len(c.token_ids)
            s.stats.aborts += c.aborts
            s.stats.gen_seconds += c.seconds
            if s.on_call is not None:
                s.on_call(c)
            choices.append(ch)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model or self.model_name,
            "choices": choices,
            "usage": chat.usage(len(ids), sum(len(c.token_ids) for c in calls)),
        }

    async def _sample(
        self, s: Session, ids: list[int], params: SamplingParams, rid: str, extended: bool
    ) -> Call:
        """Sample one choice; continue it after weight-update aborts until it really stops."""
        toks: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        unmasked: list[float] | None = []  # None once a constrained segment came without them (SGLang)
        tops: list = []
        aborts, finish = 0, "length"
        c = params.constraint
        routes: RoutedExperts | None = None  # MoE: as each position was first fed (types.RoutedExperts.then)
        while True:
            s.check()
            room = min(params.max_new_tokens - len(toks), self.max_seq_len - len(ids) - len(toks))
            if room < 1:
                finish = "length"
                break
            p = replace(
                params, max_new_tokens=room, seed=_seed(s.seed, rid, len(toks)), return_routed_experts=True
            )  # MoE engines report routing: replayed by the learner on the turn that fed it (routing_replay.py)
            if c is not None and toks:  # the grammar resumes after the tokens already sampled
                p = replace(p, constraint=replace(c, resume_ids=tuple(toks)))
            gen = await self._generate(
                ids + toks, p, f"{rid}.{len(toks)}" + (f"r{aborts}" if aborts and not toks else "")
            )
            if gen.finish_reason == "abort" and c is not None and not self.resumes_constraints:
                toks, lps, vers, unmasked, tops = [], [], [], [], []  # restart: this engine cannot resume
                aborts += 1
                continue
            toks += gen.token_ids
            lps += gen.logprobs
            if gen.routed_experts is not None:
                routes = gen.routed_experts if routes is None else routes.then(gen.routed_experts)
            vers += gen.versions
            if unmasked is not None and gen.unmasked_logprobs is not None:
                unmasked += gen.unmasked_logprobs
            elif c is not None and gen.token_ids:
                # the engine reports only the masked log-probs (SGLang, vLLM): the learner gets those, counted
                unmasked = None
                if not self.warned_masked:
                    self.warned_masked = True
                    log.warning(
                        "gateway: the engine reports no unmasked log-probs for constrained calls (SGLang and vLLM "
                        "do not); their masked log-probs are the behaviour log-probs "
                        "(rollout/constrained_masked_fallback_tokens counts the tokens)"
                    )
            tops += gen.top_logprobs or []
            finish = gen.finish_reason
            if finish != "abort":
                break
            aborts += 1
        return Call(
            tuple(ids),
            tuple(toks),
            tuple(lps),
            tuple(vers),
            finish,
            aborts,
            extended,
            unmasked_logprobs=tuple(unmasked) if c is not None and unmasked is not None else None,
            top_logprobs=tuple(tuple(t) for t in tops) if params.top_logprobs else None,
            constrained=c is not None,
            routed_experts=routes,
        )

    async def _generate(self, ids: list[int], params: SamplingParams, rid: str):
        for attempt in range(self.max_retries + 1):
            try:
                return await self.engine.generate(ids, params, request_id=rid)
            except (BadRequest, EngineAuthFailed):  # retrying cannot help either
                raise
            except Exception as e:
                if attempt == self.max_retries or not await self.engine.health():
                    raise  # out of retries, or the engine is closed (shutdown): nothing to wait for
                self.engine_retries += 1
                log.warning("gateway: engine request %s failed (%r); retrying", rid, e)
            await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")


def chat_stops(req: ChatReq) -> list[str]:
    return [] if req.stop is None else [req.stop] if isinstance(req.stop, str) else list(req.stop)


def _cut_stop(text: str, stops: list[str]) -> str:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(hits)] if hits else text


def _seed(base: int, rid: str, offset: int) -> int:
    digest = hashlib.blake2b(f"{base}:{rid}:{offset}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
