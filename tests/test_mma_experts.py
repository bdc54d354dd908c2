"""The tensor-core experts matmul (kernels/moe/mma_experts.py) and the MoE block on it (kernels/moe/mma_moe.py), on
CPU: the stacked experts' repack and reference, the tile policy, the block's packing, and the refusal without a
GPU (the kernels themselves: tests/gpu/test_mma_experts_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels.moe import mma_experts as mx
from deltaserve.kernels.quant import mma_gemv as mg
from test_mma_gemv import _weight


def test_experts_repack_and_reference():
    """Stacked experts repack per expert; the experts reference is the per-expert GEMV reference row by row."""
    e, n, k = 3, 32, 128
    ws = [_weight(n, k, seed=10 + i) for i in range(e)]
    w = torch.stack([t[1] for t in ws])
    s = torch.stack([t[2] for t in ws])
    b = torch.stack([t[3] for t in ws])
    words, sb = mx.repack_q4_experts(w, s, b)
    assert words.shape == (e, 2, 2, 128) and sb.shape == (e, 2, 2, 8, 2, 2)
    for i in range(e):
        wi, sbi = mg.repack_q4(w[i], s[i], b[i])
        assert torch.equal(words[i], wi) and torch.equal(sb[i], sbi)
    x = torch.randn(2, k).bfloat16()
    ids = torch.tensor([[2, 0], [1, 2]])
    ref = mx.mma_experts_reference(x, words, sb, ids, x_repeat=2)
    for r, ex in enumerate(ids.reshape(-1).tolist()):
        assert torch.equal(ref[r], mg.mma_gemv_reference(x[r // 2 : r // 2 + 1], words[ex], sb[ex])[0])


def test_moe_block_refused_on_cpu():
    from deltaserve.kernels.moe.mma_moe import MmaExperts, moe_block_mma

    with pytest.raises(RuntimeError, match="CUDA"):
        moe_block_mma(torch.zeros(1, 64).bfloat16(), torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, 2), None,
                      MmaExperts((torch.zeros(1),), (None,), (None,)))


def test_expert_tile_policy():
    """Single-row tiles (no table) while experts average under half a row, then sorted tiles sized to the mean;
    single tiles are the ids themselves, as int32."""
    assert [mx.default_tile_rows(m, 256) for m in (8, 72, 128, 129, 576, 4608, 65536)] == [1, 1, 1, 8, 8, 8, 8]
    ids = torch.tensor([[3, 1], [0, 3]])
    tiles = mx.mma_expert_tiles(ids, 16)
    assert tiles.rows == 1 and tiles.tile_e.dtype == torch.int32 and tiles.tile_e.tolist() == [3, 1, 0, 3]
    with pytest.raises(ValueError, match="rows per tile"):
        mx.mma_expert_tiles(ids, 16, 12)
    assert [mx.default_row_blocks(nbe, m, k) for nbe, m, k in ((32, 8, 2048), (32, 576, 2048), (128, 8, 512),
                                                                (128, 576, 512), (1, 576, 512))] == [1, 1, 1, 2, 1]


def test_expert_tile_rows():
    """The sorted tiles' rows: single rows while the mean rows per expert stay under one half, else 8 (never a row's
    bits)."""
    assert [mx.default_tile_rows(m, 256) for m in (72, 128, 129, 4608)] == [1, 1, 8, 8]
    assert mx.mma_expert_tiles(torch.tensor([[3, 1], [0, 3]]), 16).rows == 1


def test_pack_mma_experts_stacks_an_equal_width_shared_expert():
    from types import SimpleNamespace

    from deltaserve.kernels.moe.mma_moe import pack_mma_experts

    def mlx(*shape):
        w = torch.randint(0, 2**31, (*shape[:-1], shape[-1] // 8), dtype=torch.int64).to(torch.int32).view(torch.uint32)
        s = torch.rand(*shape[:-1], shape[-1] // 64).bfloat16()
        return SimpleNamespace(w=w, scales=s, biases=-s)

    e, h, i = 3, 128, 64
    routed = (mlx(e, i, h), mlx(e, i, h), mlx(e, h, i))
    same = pack_mma_experts(*routed, mlx(i, h), mlx(i, h), mlx(h, i))
    assert same.shared_last and same.shared is None and same.gate[0].shape[0] == e + 1
    sg = mlx(i, h)
    again = pack_mma_experts(*routed, sg, mlx(i, h), mlx(h, i))
    assert torch.equal(again.gate[0][e], mg.repack_q4(sg.w, sg.scales, sg.biases)[0])
    wide = pack_mma_experts(*routed, mlx(2 * i, h), mlx(2 * i, h), mlx(h, 2 * i))
    assert not wide.shared_last and wide.gate[0].shape[0] == e and wide.shared[0][0].shape[0] == 1
    assert not pack_mma_experts(*routed).shared_last
    assert same.num_experts == e + 1
