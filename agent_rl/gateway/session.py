"""One episode's session on the gateway, and the gateway as its route handlers see it.

server.py opens and closes `Session`s and answers their chat completions; routes.py (the HTTP face, which
inprocess.py calls too) answers for them through a `SessionHost`, the part of `server.Gateway` it needs. Both
live here, below both, so that imports go one way: server -> inprocess -> routes -> session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from agent_rl.engines.api import SamplingParams
from agent_rl.gateway.prompt import Answered, PromptBuilder
from agent_rl.gateway.record import Call, SessionLimits, SessionOver, SessionStats
from agent_rl.openai import responses
from agent_rl.openai.protocol import ChatReq
from envs.codec import Codec


@dataclass
class Session:
    id: str
    sampling: SamplingParams | None  # forced temperature / top-p / top-k (the agent's are ignored), or None
    limits: SessionLimits
    seed: int
    token: str = ""  # the agent's key to this session's routes (access.py); void once the session closes
    on_call: Callable[[Call], None] | None = None
    should_stop: Callable[[], bool] | None = None
    answered: list[Answered] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    stats: SessionStats = field(default_factory=SessionStats)
    over: str | None = None  # why the episode may not sample any more
    closed: bool = False

    def check(self) -> None:
        if self.closed:
            raise SessionOver(f"session {self.id} is closed")
        if self.should_stop is not None and self.should_stop():
            self.over = (
                self.over or "stopped by the trainer (the episode's group went over the staleness bound)"
            )
        if self.over:
            raise SessionOver(f"session {self.id}: {self.over}")


class SessionHost(Protocol):
    """What the route handlers (routes.py) use of the gateway that holds the sessions (`server.Gateway`)."""

    model_name: str
    max_seq_len: int
    codec: Codec
    builder: PromptBuilder
    response_stores: dict[str, responses.Store]  # previous_response_id, per session

    def session(self, sid: str) -> Session: ...

    async def complete(self, s: Session, req: ChatReq) -> dict: ...
