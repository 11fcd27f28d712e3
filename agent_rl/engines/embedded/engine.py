"""The embedded engine as an in-process `EngineClient`: the scheduler on its own thread, asyncio in front.

The engine thread owns the model, the cache and the scheduler. Every call from the event loop
becomes a command that the thread runs between two steps (torch releases the GIL inside its
kernels, so the event loop stays responsive while a step runs). A weight update is therefore
applied between decode steps, in place, with nothing else touching the parameters.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from agent_rl.engines.api import BadRequest, EngineError, EngineOptions, Generation, SamplingParams
from agent_rl.engines.embedded.lora import MergedAdapter
from agent_rl.engines.embedded.sampling import TopList
from agent_rl.engines.embedded.scheduler import Output, Request, Scheduler
from agent_rl.thread_names import name_this_thread
from agent_rl.weights.adapters import Adapter
from agent_rl.weights.tensors import WeightsRejected, read_safetensors_dir

log = logging.getLogger(__name__)


class EmbeddedEngine:
    """Implements `EngineClient` in-process. `generate_full` also returns the meta data the server reports."""

    resumes_constraints = True  # a constrained request continued after an abort resumes its grammar

    def __init__(self, model_dir: str | Path, opts: EngineOptions = EngineOptions(), *, seed: int = 0):
        self.scheduler = Scheduler(model_dir, opts, seed=seed)
        self.lora = MergedAdapter()  # touched on the engine thread only
        self._cv = threading.Condition()
        self._commands: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="agent-rl-engine", daemon=True)
        self._thread.start()

    # ---- EngineClient ----

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation:
        out = await self.generate_full(
            input_ids, sampling, request_id=request_id, top_logprobs=sampling.top_logprobs
        )
        if out.top_logprobs is not None:
            out.generation.top_logprobs = out.top_logprobs
        return out.generation

    async def pause(self) -> None:
        await self.call(self.scheduler.pause)

    async def resume(self) -> None:
        await self.call(self.scheduler.resume)

    async def update_weights(
        self, *, version: int, path: str | None = None, tensors: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        if (path is None) == (tensors is None):
            raise BadRequest("update_weights needs exactly one of path= or tensors=")

        def run() -> None:
            new = read_safetensors_dir(path) if path is not None else tensors
            self.scheduler.update_weights(version, tensors=new)
            self.lora.rebase(self.scheduler.model, new)  # full weights: the new base of any adapter

        await self._checked(run)

    async def load_adapter(
        self, *, version: int, adapter: Adapter | None = None, path: str | None = None, name: str = ""
    ) -> None:
        """LoRA: merge `adapter` (or the PEFT directory `path`) into the weights (embedded/lora.py)."""
        if (path is None) == (adapter is None):
            raise BadRequest("load_adapter needs exactly one of adapter= or path=")
        try:
            loaded = adapter if adapter is not None else Adapter.load(path)  # type: ignore[arg-type]
        except (FileNotFoundError, ValueError) as e:  # Adapter.load reads and checks the directory only
            raise BadRequest(f"adapter {path}: {e}") from None

        def run() -> None:
            self.lora.apply(self.scheduler.model, loaded, name or f"v{version}")
            self.scheduler.weights_changed(version)

        await self._checked(run)

    async def _checked(self, run: Callable[[], None]) -> None:
        """Run a weight change on the engine thread; weights that do not fit the model are the caller's BadRequest."""
        try:
            await self.call(run)
        except (WeightsRejected, FileNotFoundError) as e:  # bad or corrupt tensors, a folder with none
            raise BadRequest(str(e)) from None

    async def unload_adapter(self) -> None:
        await self.call(
            lambda: (self.lora.unload(self.scheduler.model), self.scheduler.weights_changed(self.version))
        )

    @property
    def adapter_name(self) -> str | None:
        return self.lora.name

    async def health(self) -> bool:
        return self._thread.is_alive() and not self._closed

    async def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        await asyncio.to_thread(self._thread.join)

    # ---- more than the protocol ----

    async def generate_full(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str,
        top_logprobs: int = 0,
        on_token: Callable[[int, float, int, TopList | None], None] | None = None,
    ) -> Output:
        """Generate; `top_logprobs` > 0 also reports that many alternatives per token (Output.top_logprobs);
        `on_token(token, logprob, version, top)` is called on the caller's event loop as each token is sampled."""
        loop = asyncio.get_running_loop()

        def token_cb(t: int, lp: float, v: int, top: TopList | None) -> None:  # engine thread
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(on_token, t, lp, v, top)

        req = Request(
            rid=request_id,
            prompt=list(input_ids),
            sampling=sampling,
            on_finish=lambda out: None,
            top_n=top_logprobs,
            on_token=None if on_token is None else token_cb,
            routed_experts=sampling.return_routed_experts,
        )
        return await self._request(req)

    async def score(self, input_ids: list[int], *, start: int, request_id: str) -> list[float]:
        """log p(input_ids[t] | input_ids[:t]) for t = start..len-1, from one prefill: nothing is sampled
        (a distillation teacher's call, batched with whatever else the engine is running)."""
        req = Request(request_id, list(input_ids), SamplingParams(), lambda out: None, score_from=start)
        out = await self._request(req)
        if out.prompt_logprobs is None:  # aborted (pause_generation, abort_request) before its prefill
            raise EngineError(f"scoring request {request_id} was aborted before it ran")
        return out.prompt_logprobs

    async def _request(self, req: Request) -> Output:
        """Queue `req` on the engine thread and wait for its Output (an engine failure raises)."""
        loop, request_id = asyncio.get_running_loop(), req.rid
        done: asyncio.Future[Output] = loop.create_future()

        def on_finish(out: Output) -> None:  # runs on the engine thread
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(_resolve, done, out)

        req.on_finish = on_finish
        await self.call(lambda: self.scheduler.add(req))
        try:
            out = await asyncio.shield(done)
        except asyncio.CancelledError:  # the caller went away (e.g. HTTP client disconnected): free the slot
            self.submit(lambda: self.scheduler.abort(request_id))
            raise
        if out.error:
            raise EngineError(f"request {request_id}: {out.error}")
        return out

    async def abort(self, rid: str | None = None) -> int:
        return await self.call(lambda: self.scheduler.abort(rid))

    @property
    def version(self) -> int:
        return self.scheduler.version

    @property
    def load(self) -> int:
        return self.scheduler.load

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Queue `fn` to run on the engine thread between two steps."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise EngineError("engine is closed")
            self._commands.append((fn, fut))
            self._cv.notify()
        return fut

    async def call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.submit(fn))

    # ---- engine thread ----

    def _run(self) -> None:
        name_this_thread(self._thread.name)  # the OS sees it too: a /proc profile tells engine from learner
        sched = self.scheduler
        while True:
            with self._cv:
                while not self._commands and not sched.has_work() and not self._closed:
                    self._cv.wait()
                commands, self._commands = self._commands, []
                closed = self._closed
            for fn, fut in commands:
                if not fut.set_running_or_notify_cancel():
                    continue  # its caller was cancelled while it queued (setting a result would kill this thread)
                try:
                    fut.set_result(fn())
                except Exception as e:  # a bad command fails its caller, not the engine
                    fut.set_exception(e)
            if closed:
                sched.abort()
                return
            if sched.has_work():
                try:
                    sched.step()
                except Exception as e:
                    log.exception("engine step failed")
                    sched.fail_all(e)


def _resolve(fut: asyncio.Future, value: Output) -> None:
    if not fut.done():
        fut.set_result(value)
