"""Context-parallel sequence layout (pure tensor code; the CP forward itself needs Transformer Engine)."""

from __future__ import annotations

import pytest
import torch

from agent_rl.learners.megatron.logprobs import cp_slice, cp_unslice, pad_to_multiple
from agent_rl.learners.megatron.model import ParallelConfig


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_cp_slices_reassemble_to_the_sequence(cp):
    x = torch.arange(2 * 24 * cp).reshape(2, 24 * cp)
    parts = [cp_slice(x, r, cp) for r in range(cp)]
    assert all(p.shape == (2, 24) for p in parts)
    assert torch.equal(cp_unslice(parts, cp) if cp > 1 else parts[0], x)


def test_cp_rank_holds_chunk_r_and_its_mirror():
    """Megatron's load balancing for causal attention: rank r gets chunks r and 2cp-1-r of 2cp."""
    x = torch.arange(16)[None]
    assert cp_slice(x, 0, 2).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert cp_slice(x, 1, 2).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]


def test_sequences_pad_to_what_sp_and_cp_split():
    assert ParallelConfig(tp=4, sp=True, cp=2).seq_multiple == 16
    assert ParallelConfig(tp=4, sp=False).seq_multiple == 1
    assert pad_to_multiple(torch.ones(1, 13, dtype=torch.long), 4).tolist() == [[1] * 13 + [0] * 3]
