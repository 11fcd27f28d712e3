"""OpenAI request bodies (`/v1/completions`, `/v1/chat/completions`; + vLLM's extensions `top_k`,
`stop_token_ids`, `ignore_eos`, `include_stop_str_in_output`, `return_tokens_as_token_ids`), shared by
`agent-rl serve` and the recording gateway.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.engines.api import SamplingParams
from agent_rl.engines.protocol import require_neutral, stop_tuple
from agent_rl.openai.errors import Invalid

log = logging.getLogger(__name__)
_warned: set[str] = set()

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
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise Invalid(f"{name}={getattr(self, name)!r} is not supported (only 0)", param=name)
        if self.logit_bias:
            raise Invalid(f"logit_bias={self.logit_bias!r} is not supported (only empty)", param="logit_bias")
        try:  # the engine's own checks of the values (temperature >= 0, top_p in (0, 1], top_k, stop), here
            self.to_params(1)
        except ValueError as e:
            raise Invalid(str(e), param=str(e).split(" ", 1)[0]) from None
        return self

    def to_params(self, default_max_tokens: int, index: int = 0) -> SamplingParams:
        """Sampling for choice `index` (n > 1: seed + index, so the choices differ yet are reproducible)."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            stop=stop_tuple(self.stop),
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
        require_neutral(self, echo=False, suffix=None)
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
            raise Invalid(f"top_logprobs={self.top_logprobs} needs logprobs=true", param="top_logprobs")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    @property
    def parse_tools(self) -> bool:
        """Parse tool calls out of the output: tools were given and tool_choice is not "none"."""
        return bool(self.tools) and self.tool_choice != "none"


def warn_unknown(req, route: str) -> None:
    """One warning per unknown field name and process: the field is ignored, the request is served."""
    for name in unknown_fields(req):
        if name not in _warned:
            _warned.add(name)
            log.warning("%s: ignoring unknown field %r (warned once)", route, name)
