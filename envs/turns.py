"""What the engine side reads of a token-level episode between turns: stop strings, group size, the next turn's
token budget, the text so far. One copy for every env that steps on sampled ids (envs/env.py's SimpleTIR env,
envs/harbor/env.py's shell agent); they keep `spec`, `_texts`, `_used` and `_done`."""

from __future__ import annotations

from typing import Any


class TurnBudget:
    spec: Any  # envs.spec.EnvSpec
    _texts: list[str]
    _used: int  # response tokens so far: sampled + observation
    _done: bool

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.spec.tool.stop

    @property
    def group_size(self) -> int:
        return self.spec.group_size

    @property
    def max_new_tokens(self) -> int:
        """Budget for the next turn: the per-turn cap, or what is left of the response budget if less."""
        t = self.spec.turns
        return max(0, min(t.max_tokens_per_turn, t.max_response_tokens - self._used))

    @property
    def response_text(self) -> str:
        """The model's turns, decoded (for logging and scoring; never re-encoded)."""
        return "".join(self._texts)

    @property
    def done(self) -> bool:
        return self._done
