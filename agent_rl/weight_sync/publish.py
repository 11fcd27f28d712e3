"""Publishing the learner's weights to the engines: pause, abort in flight, load, resume.

`engines.weight_sync` picks how, once per run (`make`): "memory" hands tensors over (in-process, or
/dev/shm for local servers); "disk" writes a safetensors directory; "nccl" broadcasts from learner
rank 0 (NCCL on GPUs, gloo on CPU) into the engines' processes (broadcast.py). `rollout.fixed_lag`
swaps in the lag-injecting publisher (lagged.py), whose weight history the checkpoint stores opaquely.
A LoRA learner ships its adapter alone (memory: tensors; disk: a PEFT directory), which the engines
load (weights/adapters.py); the lagged publisher keeps adapters in its history the same way.

Requests aborted by the pause return what they sampled so far and are continued by the
rollout workers after the resume, so a sync throws nothing away.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_rl.weight_sync.broadcast import WeightBroadcast
from agent_rl.weights.adapters import Adapter, loader

if TYPE_CHECKING:
    import torch

    from agent_rl.engines.api import EngineClient
    from agent_rl.learners.api import Learner
    from agent_rl.loop_thread import LoopThread


class Publisher:
    """Sends the learner's current weights every `every` versions; `push` returns the seconds spent."""

    def __init__(self, engine: EngineClient, loop: LoopThread, *, mode: str, every: int = 1, scratch: Path):
        self.broadcast = WeightBroadcast(engine, loop) if mode == "nccl" else None
        self.engine, self.loop, self.mode, self.every, self.scratch = engine, loop, mode, every, scratch
        self.engine_version: int | None = None
        self._adapter_dir: Path | None = None  # disk + LoRA: the directory of the adapter the engines hold

    def push(self, learner: Learner) -> float:
        """Send the weights the engines should sample with now; 0.0 if nothing changed."""
        t0 = time.monotonic()
        if self.engine_version is not None and learner.version % self.every:
            return 0.0  # engines.sync_every: not this step
        if self.broadcast is not None:
            if learner.version == self.engine_version:
                return 0.0
            if self.broadcast.meta is None:
                self.broadcast.connect(learner)  # first push: form the group (engines keep serving meanwhile)
            self.loop.call(self.engine.pause())
            try:
                self.broadcast.update(learner, learner.version)
            finally:
                self.loop.call(self.engine.resume())
            self.engine_version = learner.version
            return time.monotonic() - t0
        lora = learner.adapter()  # LoRA: only the adapter's tensors travel
        version, tensors = self.choose(learner.version, lora.tensors if lora else learner.hf_state_dict())
        if version == self.engine_version:
            return 0.0
        adapter = Adapter(tensors, lora.rank, lora.alpha, lora.target_modules) if lora else None
        self.loop.call(self._update(version, tensors, adapter))
        self.engine_version = version
        return time.monotonic() - t0

    def choose(self, version: int, tensors: dict[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
        """The (version, weights) to publish given the learner's; the lagged publisher picks an older one."""
        return version, tensors

    def state(self) -> Any:
        """What a checkpoint keeps of this publisher (opaque to the checkpoint)."""
        return None

    def load_state(self, state: Any, *, shift: int = 0) -> None:
        """Restore `state()`; `shift`: add to every stored version (a rollback republishes as new versions)."""

    def close(self) -> None:
        """Leave the engines' weight group (nccl mode); nothing to do otherwise."""
        if self.broadcast is not None:
            self.broadcast.close()

    async def _update(self, version: int, tensors: dict[str, torch.Tensor], adapter: Adapter | None) -> None:
        await self.engine.pause()
        try:
            if adapter is not None:
                await self._load_adapter(version, adapter)
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

    async def _load_adapter(self, version: int, adapter: Adapter) -> None:
        if self.mode == "memory":
            await loader(self.engine).load_adapter(version=version, adapter=adapter)
            return
        path = adapter.save(self.scratch / f"v{version:06d}")
        await loader(self.engine).load_adapter(version=version, path=str(path))
        if self._adapter_dir is not None:  # the engines hold the new one now
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
        self._adapter_dir = path
