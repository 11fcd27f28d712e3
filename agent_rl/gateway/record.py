"""What the gateway records per episode: one `Call` per sampled choice, in the order they were answered."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_rl.types import RoutedExperts


class SessionOver(RuntimeError):
    """The episode may not sample any more (budget spent, or its group went over the staleness bound)."""


class EngineFailed(RuntimeError):
    """The engines failed a call after retries (answered 502; never the agent's fault). The message, with the
    engine's URL and error, is the run's (the session's errors, the log); the agent is answered `public`, which
    names no upstream."""

    def __init__(self, message: str, public: str = "the engines failed after retries") -> None:
        super().__init__(message)
        self.public = f"{message.split(':', 1)[0]}: {public} (the run records the cause)"


@dataclass(frozen=True)
class Call:
    """One choice of one chat completion: the prompt ids the gateway built, and what the engines sampled.

    token_ids / logprobs / versions are exactly the engines' output (continuations after a weight-update
    abort concatenated); `aborts` counts those interruptions; `extended` says the prompt was built as the
    previous call's ids + the rendered suffix (the prefix-extension rule), not by a full re-render."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: str  # "stop" | "length" (after continuations, never "abort")
    aborts: int = 0
    extended: bool = False
    seconds: float = 0.0
    # constrained calls: the same tokens without the mask; None when the engine did not report them (SGLang, vLLM)
    unmasked_logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None  # when the agent asked for them
    constrained: bool = False  # sampled under a grammar (response_format, tool_choice, strict tools)
    # MoE: the engines' routing of every fed position, each as first fed (continuations add only their tail)
    routed_experts: RoutedExperts | None = None

    def behaviour(self, constrained: str = "unmasked") -> tuple[float, ...]:
        """The log-probs the learner takes as log mu: under a constraint, `unmasked` (the default) gives the
        full-vocabulary policy's log-prob of each token (the mask counts as part of the environment), `masked`
        the log-prob of the masked distribution sampled from (docs/guides/openai-gateway.md, "Constrained decoding"). An engine that
        reports no unmasked log-probs (`masked_fallback`) gets the masked ones under either setting."""
        if constrained == "masked" or self.unmasked_logprobs is None:
            return self.logprobs
        return self.unmasked_logprobs

    @property
    def masked_fallback(self) -> int:
        """Tokens of a constrained call whose behaviour log-prob is the masked one because the engine reported
        no unmasked ones (counted in `rollout/constrained_masked_fallback_tokens`)."""
        return len(self.token_ids) if self.constrained and self.unmasked_logprobs is None else 0


@dataclass
class SessionStats:
    calls: int = 0
    sampled_tokens: int = 0
    aborts: int = 0
    extended: int = 0  # prompts built by the prefix-extension rule
    rerendered: int = 0  # prompts rendered in full (first call, or the agent did not only append)
    gen_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # engine failures (502): infrastructure
    client_errors: list[str] = field(default_factory=list)  # requests answered 4xx: the agent's mistakes


@dataclass(frozen=True)
class SessionLimits:
    """Budgets of one episode; None = no limit beyond the engine's context."""

    max_calls: int | None = None  # chat completion requests
    max_tokens_per_call: int | None = None
    max_sampled_tokens: int | None = None  # all calls together
