"""Sequence lengths under the parallel layouts (pure tensor code; the context-parallel forward itself is tested in
test_attention.py, and each CP rank's chunks in test_packing.py)."""

from __future__ import annotations

import torch

from agent_rl.learners.megatron.logprobs import pad_to_multiple
from agent_rl.learners.megatron.model import ParallelConfig


def test_sequences_pad_to_what_sp_and_cp_split():
    assert ParallelConfig(tp=4, sp=True, cp=2).seq_multiple == 16
    assert ParallelConfig(tp=4, sp=False).seq_multiple == 1
    assert pad_to_multiple(torch.ones(1, 13, dtype=torch.long), 4).tolist() == [[1] * 13 + [0] * 3]
