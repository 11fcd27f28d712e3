"""Inference engines behind one interface (api.EngineClient): the embedded CPU engine, SGLang, vLLM, pools.

engine = launch_embedded(model_dir).client()        # or SGLangClient(url) / VLLMClient(url)
gen = await engine.generate(prompt_ids, SamplingParams(temperature=1.0), request_id="traj-1/turn-0")
gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason
"""

from agent_rl.engines.api import (
    BadRequest,
    EngineClient,
    EngineError,
    EngineUnavailable,
    Generation,
    SamplingParams,
)
from agent_rl.engines.client import SGLangClient, VLLMClient
from agent_rl.engines.embedded import EmbeddedEngine
from agent_rl.engines.launch import launch_embedded
from agent_rl.engines.pool import EnginePool

__all__ = [
    "BadRequest",
    "EmbeddedEngine",
    "EngineClient",
    "EngineError",
    "EnginePool",
    "EngineUnavailable",
    "Generation",
    "SGLangClient",
    "SamplingParams",
    "VLLMClient",
    "launch_embedded",
]
