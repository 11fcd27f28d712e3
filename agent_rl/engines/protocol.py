"""Request bodies of SGLang's native HTTP API, as pydantic models that reject unknown fields and wrong types.

Field names follow SGLang (`GenerateReqInput`, its `sampling_params`, `AbortReq`,
`PauseGenerationReqInput`, `UpdateWeightFromDiskReqInput`, `InitWeightsUpdateGroupReqInput`,
`UpdateWeightsFromDistributedReqInput`, `Begin/EndWeightUpdateReqInput` in
sglang/srt/managers/io_struct.py); OpenAI's bodies are in agent_rl/openai/protocol.py. Options the embedded engine cannot
honour are accepted only at their neutral value, so a request never silently means something else.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.engines.api import Constraint, SamplingParams


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def require_neutral(model: BaseModel, **neutral) -> None:
    for name, value in neutral.items():
        got = getattr(model, name)
        if got != value:
            raise ValueError(f"{name}={got!r} is not supported by the embedded engine (only {value!r})")


def stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
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
    # structured output (at most one), compiled by xgrammar in the engine (embedded/constrained.py)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @model_validator(mode="after")
    def _supported(self):
        require_neutral(
            self,
            min_p=0.0,
            min_new_tokens=0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            repetition_penalty=1.0,
        )
        if self.n < 1:
            raise ValueError(f"n={self.n} must be >= 1")
        given = [
            k for k in ("json_schema", "regex", "ebnf", "structural_tag") if getattr(self, k) is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give at most one of json_schema, regex, ebnf, structural_tag; got {given}")
        self.to_params()  # the engine's own checks of the values (temperature >= 0, top_p, top_k), at parse time
        return self

    def to_params(self, index: int = 0) -> SamplingParams:
        """Sampling for sample `index` of a prompt (n > 1: sampling_seed + index)."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop=stop_tuple(self.stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=None if self.sampling_seed is None else self.sampling_seed + index,
            ignore_eos=self.ignore_eos,
            constraint=next(
                (
                    Constraint(k, getattr(self, k))
                    for k in ("json_schema", "regex", "ebnf", "structural_tag")
                    if getattr(self, k) is not None
                ),
                None,
            ),
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
    lora_path: str | list[str | None] | None = None  # a loaded adapter's name (embedded: the one loaded)

    @model_validator(mode="after")
    def _one_input(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text or input_ids (one prompt, or a list of them)")
        if self.top_logprobs_num < 0 or self.top_logprobs_num > 20:
            raise ValueError(f"top_logprobs_num={self.top_logprobs_num} must be in [0, 20]")
        require_neutral(self, logprob_start_len=-1, stream=False)
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
    """SGLang's InitWeightsUpdateGroupReqInput: join the trainer's weight group (agent_rl/weights/group.py)."""

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
        from agent_rl.weights.group import parse_dtype

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
        require_neutral(self, load_format=None)
        return self


class DestroyWeightsUpdateGroupReq(Strict):
    group_name: str = "weight_update_group"


class BeginWeightUpdateReq(Strict):
    selector: Literal["target", "all"] = "all"


class EndWeightUpdateReq(Strict):
    pass
