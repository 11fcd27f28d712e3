"""Inference engines behind one interface (`api.EngineClient`): token ids in; token ids, log-probs and
policy versions out. Imports nothing heavy, so `agent_rl.engines.api` costs no torch or aiohttp.

api.py         EngineClient, SamplingParams, Generation, errors (stdlib only)
client.py      SGLangClient / VLLMClient (HTTP);  pool.py  EnginePool (least-loaded, sticky, failover)
protocol.py    SGLang's native request bodies;    launch.py / vllm_local.py  start local servers
embedded/      our CPU inference engine and its HTTP server (`agent-rl serve`)
"""
