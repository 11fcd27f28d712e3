"""The names `learners/_dp.py` exported before the learners became rank kind x pool, kept for the scripts and
tests written against them (benchmarks/long_context.py, megatron_attention_memory.py, tests/megatron): a free
TCP port and joining a rank group now live in `_pool.py`, the worker-process pool in `_processes.py`."""

from agent_rl.learners._pool import free_port as _free_port
from agent_rl.learners._pool import join_rank_group

__all__ = ["_free_port", "join_rank_group"]
