"""Request bodies of the HTTP API, as pydantic models that reject unknown fields and wrong types.

Field names follow SGLang (`GenerateReqInput`, its `sampling_params`, `AbortReq`,
`PauseGenerationReqInput`, `UpdateWeightFromDiskReqInput`, `InitWeightsUpdateGroupReqInput`,
`UpdateWeightsFromDistributedReqInput`, `Begin/EndWeightUpdateReqInput` in
sglang/srt/managers/io_struct.py) and OpenAI (+ vLLM's extensions `top_k`, `stop_token_ids`, `ignore_eos`,
`include_stop_str_in_output`, `return_tokens_as_token_ids`). Options the embedded engine cannot
honour are accepted only at their neutral value, so a request never silently means something else.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.engines.api import SamplingParams


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _neutral(model: BaseModel, **neutral) -> None:
    for name, value in neutral.items():
        got = getattr(model, name)
        if got != value:
            raise ValueError(f"{name}={got!r} is not supported by the embedded engine (only {value!r})")


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)


# ---- SGLang native ----


class SGLangSampling(Strict):
    max_new_tokens: int = 128  # SGLang's default
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    min_new_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    n: int = 1

    @model_validator(mode="after")
    def _supported(self):
        _neutral(
            self,
            min_p=0.0,
            min_new_tokens=0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            repetition_penalty=1.0,
            n=1,
        )
        return self

    def to_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop=_stops(self.stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=self.sampling_seed,
            ignore_eos=self.ignore_eos,
        )


class GenerateReq(Strict):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError(
                "give exactly one of text or input_ids (a single prompt; batches are not supported)"
            )
        _neutral(self, logprob_start_len=-1, top_logprobs_num=0, stream=False)
        return self


class AbortReq(Strict):
    rid: str = ""
    abort_all: bool = False


class PauseReq(Strict):
    mode: Literal["abort"] = "abort"  # "retract" / "in_place" are not implemented


class ContinueReq(Strict):
    torch_empty_cache: bool = True  # meaningless on CPU; accepted for SGLang clients


class UpdateFromDiskReq(Strict):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    keep_pause: bool = False


class InitWeightsUpdateGroupReq(Strict):
    """SGLang's InitWeightsUpdateGroupReqInput: join the trainer's weight group (agent_rl/weight_group.py)."""

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str = Field("weight_update_group", min_length=1)
    backend: str = "nccl"  # SGLang's default; the embedded engine (CPU) accepts only "gloo"

    @model_validator(mode="after")
    def _rank_in_world(self):
        if self.rank_offset >= self.world_size:
            raise ValueError(
                f"rank_offset={self.rank_offset} must be < world_size={self.world_size} (rank 0 is the trainer)"
            )
        if self.backend != "gloo":
            raise ValueError(
                f"backend={self.backend!r}: the embedded engine runs on CPU, so it receives by 'gloo' only "
                "(a learner without a GPU picks gloo; with GPUs use SGLang servers or weight_sync: memory/disk)"
            )
        return self


class UpdateWeightsFromDistributedReq(Strict):
    """SGLang's UpdateWeightsFromDistributedReqInput: receive these tensors by broadcast from rank 0."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True  # the engine always drops prefixes cached under the old weights
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    selector: Literal["target", "all"] = "all"  # no draft model here: both mean the one model
    torch_empty_cache: bool = False  # meaningless on CPU

    @model_validator(mode="after")
    def _consistent(self):
        from agent_rl.weight_group import parse_dtype

        n = len(self.names)
        if len(self.dtypes) != n or len(self.shapes) != n:
            raise ValueError(
                f"names, dtypes and shapes must have one entry per tensor: got {n}, {len(self.dtypes)}, "
                f"{len(self.shapes)}"
            )
        if len(set(self.names)) != n:
            raise ValueError(
                f"names: duplicates {sorted({x for x in self.names if self.names.count(x) > 1})[:5]}"
            )
        for d in self.dtypes:
            parse_dtype(d)
        bad = [s for s in self.shapes if any(x < 0 for x in s)]
        if bad:
            raise ValueError(f"shapes: negative sizes in {bad[:3]}")
        _neutral(self, load_format=None)
        return self


class DestroyWeightsUpdateGroupReq(Strict):
    group_name: str = "weight_update_group"


class BeginWeightUpdateReq(Strict):
    selector: Literal["target", "all"] = "all"


class EndWeightUpdateReq(Strict):
    pass


# ---- OpenAI-compatible ----


class OpenAISampling(Strict):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM extensions
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _supported(self):
        _neutral(self, n=1, stream=False, presence_penalty=0.0, frequency_penalty=0.0)
        return self

    def to_params(self, default_max_tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            stop=_stops(self.stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )


class CompletionReq(OpenAISampling):
    prompt: str | list[int]
    logprobs: int | None = None
    echo: bool = False

    @model_validator(mode="after")
    def _logprobs(self):
        _neutral(self, echo=False)
        if self.logprobs not in (None, 0):
            raise ValueError(
                f"logprobs={self.logprobs} asks for top alternatives, which the embedded engine does not compute; "
                "use logprobs=0 for the sampled tokens' log-probs"
            )
        return self


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatReq(OpenAISampling):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _logprobs(self):
        if self.top_logprobs not in (None, 0):
            raise ValueError(
                f"top_logprobs={self.top_logprobs} is not supported by the embedded engine (only 0)"
            )
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self
