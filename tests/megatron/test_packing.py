"""Packing variable-length trajectories for the Megatron learner: the layout, and the same log-probs
and gradients as the right-padded batch under TP=1 and TP=2 with sequence parallelism."""

from __future__ import annotations

import pytest
import torch
from _helpers import (
    HAVE_MEGATRON,
    build_tiny_dir,
    make_groups,
    packed_bounds_reads_worker,
    packed_vs_padded_worker,
    spawn_ranks,
)

from agent_rl.batch import collate
from agent_rl.learners.megatron import packing
from agent_rl.learners.megatron.model import ParallelConfig

MASK = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])


def test_rows_pack_back_to_back_and_unpack_to_the_padded_rows():
    rows = torch.tensor([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9], [10, 0, 0, 0, 0, 0]])
    layout = packing.plan(MASK, ParallelConfig())
    assert (layout.lengths, layout.starts, layout.total) == ((3, 6, 1), (0, 3, 9), 10)
    packed = packing.pack(rows, layout)
    assert packed.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    assert torch.equal(packing.unpack(packed, layout), rows)
    assert packing.positions(layout).tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 0]]
    assert layout.cu_seqlens(padded=False).tolist() == [0, 3, 9, 10]


def test_sequence_parallel_pads_only_the_total_and_context_parallel_every_sequence():
    sp = packing.plan(MASK, ParallelConfig(tp=4, sp=True))
    assert sp.padded == (3, 6, 3) and sp.total % 4 == 0  # padding goes on the last sequence
    cp = packing.plan(MASK, ParallelConfig(tp=2, sp=True, cp=2))  # 2·cp·tp = 8 per sequence
    assert cp.padded == (8, 8, 8) and cp.starts == (0, 8, 16)
    assert cp.cu_seqlens(padded=True).tolist() == [0, 8, 16, 24]
    assert cp.cu_seqlens(padded=False).tolist() == [0, 3, 9, 10]


@pytest.mark.parametrize("cp", [2, 3])
def test_thd_partition_gives_each_cp_rank_chunk_r_and_its_mirror_of_every_sequence(cp):
    layout = packing.plan(MASK, ParallelConfig(cp=cp))
    parts = [packing.thd_partition_index(layout, r, cp) for r in range(cp)]
    assert torch.equal(torch.cat(parts).sort().values, torch.arange(layout.total))
    chunk = [span // (2 * cp) for span in layout.padded]
    first = parts[0].tolist()
    want = []
    for start, c in zip(layout.starts, chunk, strict=True):
        want += list(range(start, start + c)) + list(range(start + (2 * cp - 1) * c, start + 2 * cp * c))
    assert first == want


def test_packing_refuses_left_padded_rows():
    with pytest.raises(ValueError, match="right-padded"):
        packing.plan(torch.tensor([[0, 1, 1]]), ParallelConfig())


@pytest.mark.megatron
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed: pip install 'agent-rl[gpu]'")
@pytest.mark.parametrize("world,sp", [(1, False), (2, True)], ids=["tp1", "tp2-sp"])
def test_packed_logprobs_and_gradients_equal_the_padded_batch(world, sp, tmp_path):
    from agent_rl.learners._pool import free_port

    model_dir = build_tiny_dir(tmp_path / "model")
    batch = collate(make_groups(model_dir, seed=0)).policy
    lengths = batch.attention_mask.sum(-1)
    assert int(lengths.min()) < int(lengths.max())  # rows really differ in length
    out = tmp_path / "packed.pt"
    spawn_ranks(packed_vs_padded_worker, (world, free_port(), str(model_dir), sp, batch, str(out)), world)
    got = torch.load(out)
    (lp_pad, norm_pad), (lp_pack, norm_pack) = got[False], got[True]
    real = batch.attention_mask.bool().clone()
    real[:, 0] = False  # position 0 has no log-prob
    torch.testing.assert_close(lp_pack[real], lp_pad[real], rtol=1e-5, atol=1e-5)
    assert norm_pack == pytest.approx(norm_pad, rel=1e-5)
    assert norm_pad > 0.1


@pytest.mark.megatron
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed: pip install 'agent-rl[gpu]'")
def test_rope_and_attention_read_the_packs_bounds_from_their_host_copy(tmp_path):
    """On a GPU a read of cu_seqlens waits for the device: megatron-core's unfused THD RoPE reads them twice per
    call (queries and keys of every layer), our attention once per layer. Through a packed forward and backward,
    nothing touches the device copies the pack hands to megatron (host_bounds.py)."""
    from agent_rl.learners._pool import free_port

    model_dir = build_tiny_dir(tmp_path / "model")
    batch = collate(make_groups(model_dir, seed=0)).policy
    out = tmp_path / "calls.pt"
    spawn_ranks(packed_bounds_reads_worker, (1, free_port(), str(model_dir), batch, str(out)), 1)
    got = torch.load(out)
    assert got["made"] == 4 and got["calls"] == [], got


@pytest.mark.megatron
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed: pip install 'agent-rl[gpu]'")
def test_thd_rope_takes_the_host_copy_of_the_bounds():
    """The patched RoPE gets its boundaries from the host copy: a device copy holding other values (which no real
    pack has) does not change the result, which equals megatron's own function given the true bounds."""
    from megatron.core.models.common.embeddings import rope_utils

    from agent_rl.learners.megatron.host_bounds import read_rope_bounds_on_host, to_device

    read_rope_bounds_on_host()
    patched = rope_utils._apply_rotary_pos_emb_thd
    read_rope_bounds_on_host()  # idempotent: not wrapped twice
    assert rope_utils._apply_rotary_pos_emb_thd is patched
    original = patched.__wrapped__

    class OneRank:
        def size(self) -> int:
            return 1

        def rank(self) -> int:
            return 0

    g = torch.Generator().manual_seed(0)
    t = torch.randn(10, 2, 8, generator=g)
    freqs = torch.randn(16, 1, 1, 8, generator=g)
    true = torch.tensor([0, 3, 9, 10], dtype=torch.int32)
    cu = to_device(true, "cpu")
    cu.copy_(torch.tensor([0, 5, 6, 10], dtype=torch.int32))  # the device copy says something else
    want = original(t, true, freqs, cp_group=OneRank())
    assert torch.equal(patched(t, cu, freqs, cp_group=OneRank()), want)
    assert not torch.equal(original(t, cu, freqs, cp_group=OneRank()), want)
