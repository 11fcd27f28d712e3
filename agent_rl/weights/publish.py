"""Publishing the learner's weights to the engines: pause, abort in flight, load, resume.

mode "memory": tensors handed over (in-process, or /dev/shm for local servers); "disk": a
safetensors directory; "nccl": a torch.distributed broadcast from learner rank 0 (NCCL on GPUs,
gloo on CPU) into the engines' processes (weight_broadcast.py). A LoRA learner ships its adapter
alone (memory: tensors; disk: a PEFT directory), which the engines load (weights/adapters.py).

Requests aborted by the pause return what they sampled so far and are continued by the
rollout workers after the resume, so a sync throws nothing away. `lag` implements the
`rollout.fixed_lag` research switch: the engines get the weights of `lag` versions ago.
"""

from __future__ import annotations

import shutil
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from agent_rl.engines.api import EngineClient
from agent_rl.learners.api import Learner
from agent_rl.loop_thread import LoopThread
from agent_rl.weights.adapters import Adapter, loader
from agent_rl.weights.broadcast import WeightBroadcast

if TYPE_CHECKING:
    import torch


class WeightSync:
    def __init__(
        self,
        engine: EngineClient,
        loop: LoopThread,
        *,
        mode: str,
        lag: int = 0,
        every: int = 1,
        scratch: Path,
    ):
        if mode == "nccl" and lag:
            raise ValueError(
                f"rollout.fixed_lag={lag} cannot run with engines.weight_sync: nccl: the lagged weights are "
                "copies held by the driver, while a broadcast sends learner rank 0's current weights; "
                "use weight_sync: memory or disk for fixed-lag runs"
            )
        self.broadcast = WeightBroadcast(engine, loop) if mode == "nccl" else None
        self.engine, self.loop, self.mode, self.lag, self.every, self.scratch = (
            engine,
            loop,
            mode,
            lag,
            every,
            scratch,
        )
        self.engine_version: int | None = None
        self._adapter_dir: Path | None = None  # disk + LoRA: the directory of the adapter the engines hold
        self.history: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=lag + 1)

    def push(self, learner: Learner) -> float:
        """Send the weights the engines should sample with now; returns seconds spent (0 if unchanged)."""
        t0 = time.monotonic()
        version = learner.version
        if self.engine_version is not None and version % self.every:
            return 0.0  # engines.sync_every: not this step
        if self.broadcast is not None:
            if version == self.engine_version:
                return 0.0
            if self.broadcast.meta is None:
                self.broadcast.connect(learner)  # first push: form the group (engines keep serving meanwhile)
            self.loop.call(self.engine.pause())
            try:
                self.broadcast.update(learner, version)
            finally:
                self.loop.call(self.engine.resume())
            self.engine_version = version
            return time.monotonic() - t0
        lora = learner.adapter()  # LoRA: only the adapter's tensors travel
        tensors = lora.tensors if lora is not None else learner.hf_state_dict()
        if self.lag:
            if not self.history or self.history[-1][0] != version:  # a resumed run re-pushes its last version
                self.history.append((version, {k: v.detach().clone() for k, v in tensors.items()}))
            target = max(0, version - self.lag)
            version, tensors = next((v, t) for v, t in self.history if v >= target)
        if version == self.engine_version:
            return 0.0
        if lora is not None:
            lora = Adapter(tensors, lora.rank, lora.alpha, lora.target_modules)
        self.loop.call(self._update(version, tensors, lora))
        self.engine_version = version
        return time.monotonic() - t0

    def close(self) -> None:
        """Leave the engines' weight group (nccl mode); nothing to do otherwise."""
        if self.broadcast is not None:
            self.broadcast.close()

    async def _update(self, version: int, tensors: dict[str, torch.Tensor], lora: Adapter | None) -> None:
        await self.engine.pause()
        try:
            if lora is not None:
                if self.mode == "memory":
                    await loader(self.engine).load_adapter(version=version, adapter=lora)
                else:
                    path = lora.save(self.scratch / f"v{version:06d}")
                    await loader(self.engine).load_adapter(version=version, path=str(path))
                    if self._adapter_dir is not None:  # the engines hold the new one now
                        shutil.rmtree(self._adapter_dir, ignore_errors=True)
                    self._adapter_dir = path
            elif self.mode == "memory":
                await self.engine.update_weights(version=version, tensors=tensors)
            else:
                from safetensors.torch import save_file

                path = self.scratch / f"v{version:06d}"
                path.mkdir(parents=True, exist_ok=True)
                save_file(
                    {k: v.contiguous().cpu() for k, v in tensors.items()}, str(path / "model.safetensors")
                )
                await self.engine.update_weights(version=version, path=str(path))
        finally:
            await self.engine.resume()
