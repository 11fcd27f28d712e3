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
        )
        if self.n < 1:
            raise ValueError(f"n={self.n} must be >= 1")
        return self

    def to_params(self, index: int = 0) -> SamplingParams:
        """Sampling for sample `index` of a prompt (n > 1: sampling_seed + index)."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop=_stops(self.stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=None if self.sampling_seed is None else self.sampling_seed + index,
            ignore_eos=self.ignore_eos,
        )


class GenerateReq(Strict):
    """One prompt (text / input_ids) or a batch (a list of them); with n > 1 each prompt is sampled n times.
    A batch or n > 1 is answered with a list, prompt-major, as SGLang does."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
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
            raise ValueError("give exactly one of text or input_ids (one prompt, or a list of them)")
        if self.top_logprobs_num < 0 or self.top_logprobs_num > 20:
            raise ValueError(f"top_logprobs_num={self.top_logprobs_num} must be in [0, 20]")
        _neutral(self, logprob_start_len=-1, stream=False)
        return self

    @property
    def batched(self) -> bool:
        single = isinstance(self.text, str) or (
            self.input_ids is not None and (not self.input_ids or isinstance(self.input_ids[0], int))
        )
        return not single or self.sampling_params.n > 1

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.text, str):
            return [self.text]
        if self.text is not None:
            return list(self.text)
        assert self.input_ids is not None
        return (
            [self.input_ids]
            if not self.input_ids or isinstance(self.input_ids[0], int)
            else list(self.input_ids)
        )


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
# OpenAI's bodies are lenient: a field we do not know is ignored with one warning per field name
# (`unknown_fields`), because agents and frameworks send fields of newer API versions. Known
# options the engine cannot honour (penalties, logit_bias) are still refused unless neutral.


class Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


def unknown_fields(model: BaseModel, where: str = "") -> list[str]:
    """Dotted names of every field the request carried that our models do not declare (nested too)."""
    out = [f"{where}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for j, v in enumerate(items):
            if isinstance(v, BaseModel):
                sub = f"{where}{name}[{j}]." if isinstance(value, list) else f"{where}{name}."
                out += [_generic_index(x) for x in unknown_fields(v, sub)]
    return sorted(set(out))


def _generic_index(name: str) -> str:
    import re

    return re.sub(r"\[\d+\]", "[]", name)  # messages[3].foo -> messages[].foo: one warning per field


class StreamOptions(Lenient):
    include_usage: bool = False


class OpenAISampling(Lenient):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None  # None: 1.0
    top_p: float | None = None  # None: 1.0
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM extensions
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _supported(self):
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError(
                "presence_penalty/frequency_penalty are not supported by the embedded engine (only 0)"
            )
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by the embedded engine (only empty)")
        return self

    def to_params(self, default_max_tokens: int, index: int = 0) -> SamplingParams:
        """Sampling for choice `index` (n > 1: seed + index, so the choices differ yet are reproducible)."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            stop=_stops(self.stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=None if self.seed is None else self.seed + index,
            ignore_eos=self.ignore_eos,
        )


class CompletionReq(OpenAISampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _echo(self):
        _neutral(self, echo=False, suffix=None)
        return self


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str = "{}"


class ToolCall(Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # vLLM/Qwen: the thinking of an earlier assistant turn
    # sent back by clients that echo the response message; ignored
    refusal: str | None = None
    function_call: dict | None = None
    audio: dict | None = None
    annotations: list | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data):
        content = data.get("content") if isinstance(data, dict) else None
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text":
                    raise ValueError(f"content part of type {kind!r} is not supported (text parts only)")
        return data

    @model_validator(mode="after")
    def _roles(self):
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id (the id of the call it answers)")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError(f"only assistant messages carry tool_calls (this one is {self.role!r})")
        return self

    @property
    def text(self) -> str:
        """The content as one string (text parts joined; None -> "")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDef(Lenient):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ToolDef(Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatReq(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None  # vLLM extension: extra variables for the chat template

    @model_validator(mode="after")
    def _options(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("response_format: only {'type': 'text'} is supported (no constrained decoding)")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    @property
    def parse_tools(self) -> bool:
        """Parse tool calls out of the output: tools were given and tool_choice is not "none"."""
        return bool(self.tools) and self.tool_choice != "none"
