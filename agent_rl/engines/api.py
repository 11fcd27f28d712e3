"""The engine interface rollout workers code against: sampling settings in, tokens + log-probs + versions out.

Every backend (the embedded engine in-process or over HTTP, SGLang, vLLM, a pool of them) is an
`EngineClient`. Token ids in, token ids out: text is never re-tokenized between turns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from agent_rl.types import RoutedExperts
    from agent_rl.weights.group import GroupSpec, TensorMeta

FinishReason = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """An engine failed a request; the message says which request and why."""


class EngineUnavailable(EngineError):
    """The engine could not be reached (connection refused or reset, timeout, 5xx); a pool retries elsewhere."""


class BadRequest(EngineError, ValueError):
    """The request itself is wrong (too long, bad ids, duplicate rid); servers answer it with a 4xx."""


class EngineAuthFailed(EngineError):
    """The engine refused the client's key (401): the run's configuration, not the request; never retried."""


@dataclass(frozen=True)
class EngineOptions:
    """What an embedded engine is built with (in-process, `agent-rl serve`, a launched server). The one place
    these defaults live: `engines:` in a recipe (config.EngineConfig) and `serve`'s flags read them from here."""

    max_batch: int = 64
    """Requests decoded together (KV-cache slots)."""
    max_seq_len: int = 2048
    """Prompt + output tokens per request."""
    dtype: str = "float32"
    """Weights and KV cache: float32, bfloat16 or float16."""
    lm_head_fp32: bool = False
    """The final norm's output and the LM head's matmul in fp32 (config.ModelConfig.lm_head_fp32)."""
    copy_prefixes: bool = True
    """A new prompt that shares a prefix with a running request's prompt copies those keys from its slot instead
    of prefilling them (vLLM's prefix caching, over running requests; engines/embedded/prefixes.py)."""


@dataclass(frozen=True)
class Constraint:
    """What the sampled text must match, named as SGLang's sampling_params name it: `json_schema` (a JSON
    schema as a string), `ebnf` (a grammar in xgrammar's EBNF) or `structural_tag` (free text in which a
    trigger opens a tag whose body must match a schema; SGLang's JSON form). Built from OpenAI requests by
    agent_rl/openai/structured.py. `resume_ids`: tokens already sampled under it (a continuation after a
    weight-update abort), which the matcher accepts before sampling goes on (the embedded engine only)."""

    kind: Literal["json_schema", "ebnf", "structural_tag"]
    value: str
    resume_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one continuation. temperature 0 = greedy; top_k -1 = off; seed None = engine's stream."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # keep going past the model's EOS (benchmarks, fixed-length probes)
    top_logprobs: int = 0  # also return this many alternatives per sampled token (Generation.top_logprobs)
    constraint: Constraint | None = None  # grammar-constrained sampling
    return_routed_experts: bool = (
        False  # MoE: also return the experts every fed position went to (SGLang's R3)
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs!r}")
        if self.constraint is not None and self.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with a constraint (the grammar ends at EOS)")


@dataclass
class Generation:
    """One continuation. token_ids, logprobs and versions have one entry per output token.

    finish_reason "stop": EOS, a stop token or a stop string matched (the output INCLUDES the stop
    tokens: the SimpleTIR env needs the closing fence); "length": max_new_tokens or the context is
    full; "abort": paused or aborted, the tokens so far are returned and a continuation may follow.
    Under a constraint, `logprobs` are of the masked distribution sampled from and `unmasked_logprobs`
    of the same token under the same settings without the mask (None when unconstrained); their
    difference is minus the log of the probability mass the mask kept.
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    unmasked_logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None  # when SamplingParams.top_logprobs > 0
    routed_experts: RoutedExperts | None = (
        None  # MoE, when asked and the engine records it: prompt + output - 1 rows
    )

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise EngineError(
                f"{n} token ids but {len(self.logprobs)} logprobs and {len(self.versions)} versions"
            )
        if self.unmasked_logprobs is not None and len(self.unmasked_logprobs) != n:
            raise EngineError(f"{n} token ids but {len(self.unmasked_logprobs)} unmasked logprobs")


@runtime_checkable
class EngineClient(Protocol):
    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str
    ) -> Generation: ...

    async def pause(self) -> None:
        """Stop scheduling; in-flight requests return finish_reason="abort" with what they have."""

    async def resume(self) -> None: ...

    async def update_weights(
        self, *, version: int, path: str | None = None, tensors: Mapping[str, torch.Tensor] | None = None
    ) -> None: ...

    async def health(self) -> bool: ...

    async def close(self) -> None: ...


@runtime_checkable
class WeightGroupMember(Protocol):
    """An engine (or pool) that receives weights by broadcast from learner rank 0 (agent_rl/weights/group.py)."""

    def host(self) -> str:
        """Host its server listens at: learner rank 0 offers the group on the interface that routes there."""

    async def weight_group_size(self) -> int:
        """How many ranks it takes in the group (its tensor-parallel size)."""

    async def init_weights_update_group(self, spec: GroupSpec, rank_offset: int) -> None:
        """Join as ranks rank_offset ...; returns once the whole group has formed."""

    async def update_weights_from_distributed(
        self, meta: TensorMeta, *, version: int, group_name: str
    ) -> None:
        """Receive the tensors `meta` announces (rank 0 broadcasts them concurrently); load them as `version`."""

    async def destroy_weights_update_group(self, group_name: str) -> None: ...
