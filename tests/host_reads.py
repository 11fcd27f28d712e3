"""Counting, on any device, the calls that on a GPU make the host wait for the device to finish its queue.

A read of a tensor's value (`.item()`, `bool()`, `int()`, `float()`, `.tolist()`, `torch.equal`), a copy to the
host (`.cpu()`), and an op whose output size depends on the values (`nonzero`, `unique`, `masked_select`,
indexing with a boolean mask, `repeat_interleave` without `output_size`, one-argument `torch.where`) each wait
for every kernel queued before them; between two of them the GPU idles while the host launches the next ones.
On the CPU nothing waits, so the CPU suite counts the calls instead (a `TorchFunctionMode` sees every one of
them), which tells a planning step that reads Python ints from one that reads tensors. Not counted: `.to("cpu")`
(the same call moves a tensor to the device the test runs on); code that wants a copy on the host writes
`.cpu()`. On CUDA, `torch.cuda.set_sync_debug_mode` counts the real waits (`cuda_syncs`).
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "nonzero", "argwhere",
         "unique", "unique_consecutive", "masked_select", "equal", "allclose"}  # fmt: skip


def _has_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


class HostReads(TorchFunctionMode):
    """`with HostReads() as reads:` ... `reads.count`, `reads.where` ("package/file:line function" of each call),
    `reads.functions` (the set of those functions)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []
        self.paused = False

    @property
    def count(self) -> int:
        return len(self.where)

    @property
    def functions(self) -> set[str]:
        return {w.rsplit(" ", 1)[-1] for w in self.where}

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Calls made inside are not counted (a function whose reads another test counts)."""
        self.paused, was = True, self.paused
        try:
            yield
        finally:
            self.paused = was

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if not self.paused and self._reads(func, args, kwargs):
            self.where.append(_site())
        return func(*args, **kwargs)

    @staticmethod
    def _reads(func: Any, args: tuple, kwargs: dict) -> bool:
        name = getattr(func, "__name__", "")
        if name in READS:
            return True
        if name in ("__getitem__", "__setitem__"):
            return len(args) > 1 and _has_mask(args[1])
        if name == "repeat_interleave":
            return "output_size" not in kwargs and len(args) > 1 and isinstance(args[1], torch.Tensor)
        return name == "where" and len(args) + len(kwargs) == 1


def _site() -> str:
    """'package/file.py:line function' of the call (its innermost Python frame)."""
    frame = traceback.extract_stack()[-3]
    return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"


@contextlib.contextmanager
def cuda_syncs() -> Iterator[list[str]]:
    """The synchronizing CUDA calls made inside (torch's sync debug mode warns on each), as their messages."""
    got: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield got
        finally:
            torch.cuda.set_sync_debug_mode("default")
    got.extend(str(w.message) for w in caught if "synchroniz" in str(w.message))
