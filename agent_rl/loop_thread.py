"""The rollout side's event loop in a daemon thread: engines, buffer, sandbox and episodes live on it, and
the training loop (main thread) submits coroutines to it and waits on their results."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from agent_rl.thread_names import name_this_thread

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; the training loop submits coroutines and waits on results."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rollouts", daemon=True)
        self._thread.start()
        self.loop.call_soon_threadsafe(name_this_thread, "rollouts")  # the OS name too (a /proc profile)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop and return at once; its result (or exception) comes through the future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is still running on the loop and let it unwind (its `finally` blocks and `async with`
        exits close connections), then stop and close the loop: a loop left open, or a task dropped mid-way,
        is a ResourceWarning at exit (an unclosed loop, an unclosed client session)."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # closing: what the tasks raise while unwinding is moot
                asyncio.run_coroutine_threadsafe(_cancel_pending(), self.loop).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():  # a loop stuck in a blocking call cannot be closed; leave it to exit
            self.loop.close()


async def _cancel_pending() -> None:
    loop = asyncio.get_running_loop()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
