"""The embedded CPU inference engine: a plain-torch Qwen2/Llama model with a preallocated KV cache
(model.py, cache.py), sampling that reports the log-prob of the distribution actually sampled from
(sampling.py), continuous batching with pause/abort/resume and versioned weight updates (scheduler.py),
an `EngineClient` in-process (engine.py), and the HTTP server that speaks SGLang's native API and
OpenAI's (server.py, openai_routes.py, weight_routes.py). Mixture-of-Experts and hybrid linear-attention
Qwen models: sparse.py, moe.py, linear_attention.py."""

# built by sparse.py; named here so that config checks need no torch
SPARSE_ARCHITECTURES = (
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
)
