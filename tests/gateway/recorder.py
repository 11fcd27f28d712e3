"""An EngineClient around the real embedded engine that remembers every Generation it returned (token identity
checks) and can land a weight update in the middle of a chosen request.

The update is driven by events, not by timing: once the chosen request has sampled `after` tokens the engine
parks (takes no step; commands such as pause still run) until the update is done, so the pause always finds
that request in flight, however fast or loaded the machine is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from agent_rl.engines.embedded.engine import EmbeddedEngine


class Recorder:
    """`when(request_id)` picks the request to interrupt; the update lands after it sampled `after` tokens."""

    def __init__(self, engine: EmbeddedEngine, when: Callable[[str], bool] | None = None, after: int = 4):
        self.engine, self.when, self.after = engine, when, after
        self.returned: dict[str, object] = {}
        self.updated = asyncio.Event()
        self.triggered = False
        self.target: str | None = None  # the request the update lands in
        self.released = False  # the update is done: the engine runs freely again
        sched = engine.scheduler
        has_work = sched.has_work

        def parked_has_work() -> bool:  # engine thread: park once the target request has `after` tokens
            if not self.released and any(
                r.rid == self.target and len(r.tokens) >= after for r in sched.running
            ):
                return False
            return has_work()

        sched.has_work = parked_has_work  # type: ignore[method-assign]

    async def generate(self, input_ids, sampling, *, request_id):
        on_token = None
        if self.when is not None and self.target is None and self.when(request_id):
            self.target, seen = request_id, []

            def on_token(t, lp, v, top):
                seen.append(t)
                if len(seen) == self.after and not self.triggered:
                    self.triggered = True
                    asyncio.get_running_loop().create_task(self._update())

        out = await self.engine.generate_full(input_ids, sampling, request_id=request_id, on_token=on_token)
        self.returned[request_id] = out.generation
        return out.generation

    async def _update(self):
        await self.engine.pause()  # aborts what is in flight: the gateway must continue it
        g = torch.Generator().manual_seed(0)
        w = self.engine.scheduler.model.lm_head.weight
        await self.engine.update_weights(
            version=1, tensors={"lm_head.weight": w + 0.05 * torch.randn(w.shape, generator=g)}
        )
        await self.engine.resume()
        self.released = True
        self.engine.submit(lambda: None)  # wake the parked engine thread
        self.updated.set()

    def per_call(self, session: str) -> list[tuple[list[int], list[float], list[int]]]:
        """What the engine returned for each call of a session, continuations concatenated, in call order."""
        parts: dict[tuple[int, int], list[tuple[int, object]]] = {}
        for rid, gen in self.returned.items():
            sid, _, rest = rid.partition("/")
            if sid != session:
                continue
            call, choice, at = rest.split(".")
            offset, _, retry = at.partition("r")  # "12r1": a call aborted before its first token, sent again
            parts.setdefault((int(call), int(choice)), []).append(((int(offset), int(retry or 0)), gen))
        out = []
        for key in sorted(parts):
            gens = [g for _, g in sorted(parts[key], key=lambda x: x[0])]
            out.append(
                (
                    [t for g in gens for t in g.token_ids],
                    [lp for g in gens for lp in g.logprobs],
                    [v for g in gens for v in g.versions],
                )
            )
        return out

    # the rest of EngineClient
    async def pause(self):
        await self.engine.pause()

    async def resume(self):
        await self.engine.resume()

    async def update_weights(self, **kw):
        await self.engine.update_weights(**kw)

    async def health(self):
        return await self.engine.health()

    async def close(self):
        await self.engine.close()
