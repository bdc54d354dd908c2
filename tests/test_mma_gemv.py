"""The tensor-core GEMV's repacked weight layout (kernels/quant/mma_gemv.py), on CPU: the repack is a bijection
of the MLX codes, its fragment order is the one the kernel's layouts assume, and bad shapes are named."""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels.quant import mma_gemv as mg


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    words = (q.reshape(n, k // 8, 8) << (torch.arange(8) * 4)).sum(-1).to(torch.uint32)
    s = torch.rand(n, k // 64, generator=g).bfloat16()
    b = -torch.rand(n, k // 64, generator=g).bfloat16()
    return q, words, s, b


@pytest.mark.parametrize("order", ["fragment", "natural"])
def test_repack_round_trip(order):
    q, w, s, b = _weight(48, 256)
    words, sb = mg.repack_q4(w, s, b, order=order)
    assert words.shape == (3, 4, 128) and words.dtype == torch.int32 and sb.shape == (3, 4, 8, 2, 2)
    q2, s2, b2 = mg.unpack_q4(words, sb, order=order)
    assert torch.equal(q2, q) and torch.equal(s2, s) and torch.equal(b2, b)
    with pytest.raises(ValueError, match="order must be 'fragment' or 'natural', found 'mlx'"):
        mg.repack_q4(w, s, b, order="mlx")
    with pytest.raises(ValueError, match="order must be 'fragment' or 'natural', found 'mlx'"):
        mg.unpack_q4(words, sb, order="mlx")


@pytest.mark.parametrize("order", ["fragment", "natural"])
def test_fragment_order(order):
    """Word (rb, g, lane = 4 rr + c, j), nibble 4 (i1 + 2 i2) + 16 l holds row 16 rb + rr + 8 i1, column
    64 g + 16 c + 4 j + 2 i2 + l ("fragment"), or 64 g + 16 j + 8 i2 + 2 c + l ("natural": the MMA's order kk is the
    column): checked element by element against the MLX codes."""
    q, w, s, b = _weight(32, 128, seed=1)
    words, _ = mg.repack_q4(w, s, b, order=order)
    wd = words.to(torch.int64) & 0xFFFFFFFF
    for rb in range(2):
        for g in range(2):
            for lane in range(32):
                rr, c = divmod(lane, 4)
                for j in range(4):
                    word = int(wd[rb, g, lane * 4 + j])
                    for i1 in range(2):
                        for i2 in range(2):
                            for lo in range(2):
                                code = (word >> (4 * (i1 + 2 * i2) + 16 * lo)) & 15
                                col = (16 * c + 4 * j + 2 * i2 + lo if order == "fragment"
                                       else 16 * j + 8 * i2 + 2 * c + lo)
                                assert code == int(q[16 * rb + rr + 8 * i1, 64 * g + col])


def test_reference_matches_dense():
    q, w, s, b = _weight(32, 128, seed=2)
    words, sb = mg.repack_q4(w, s, b)
    x = torch.randn(3, 128).bfloat16()
    dense = q.double().reshape(32, 2, 64) * s.double()[..., None] + b.double()[..., None]
    ref = x.double() @ dense.reshape(32, 128).t()
    assert torch.allclose(mg.mma_gemv_reference(x, words, sb), ref, rtol=0, atol=1e-12)


def test_bad_shapes_named():
    _, w, s, b = _weight(32, 128)
    with pytest.raises(ValueError, match=r"N % 16"):
        mg.repack_q4(w[:24], s[:24], b[:24])
    with pytest.raises(ValueError, match=r"scales/biases must be \[32, 2\]"):
        mg.repack_q4(w, s[:, :1], b)
    with pytest.raises(ValueError, match="uint32"):
        mg.repack_q4(w.float(), s, b)


def test_config_fixed_by_k():
    assert [mg.default_warps(k) for k in (64, 128, 512, 1024, 2048, 4096)] == [1, 1, 1, 4, 4, 8]
    assert mg.default_config(2048) == (4, 1, 7)  # W from K alone; one row block, the ring of all chunks but one
    assert mg.default_config(2048, 8, 772) == (4, 1, 7)  # up to 8 rows: the one-row launch shape
    assert mg.default_config(4096, 1, 128) == (8, 1, 7)  # 64 groups over 8 warps: 8 chunks
    assert mg.default_config(2048, 1, 15520) == (4, 1, 1)  # the lm_head's many programs: one chunk ahead
    assert mg.default_config(256, 1, 128) == (1, 1, 3)  # 4 chunks on one warp: 3 ahead, the ring at its least ...
    assert mg.default_config(128, 1, 128) == (1, 1, 1)  # ... 2 chunks are too few for it
    assert mg.default_config(2048, 16, 772) == (4, 1, 2)  # 9 to 32 rows: two chunks in flight ...
    assert mg.default_config(2048, 32, 15520) == (4, 2, 2)  # ... and the lm_head's two row blocks
    assert mg.default_config(2048, 64, 772) == (4, 2, 1)  # 64 rows: two row blocks share the x reads ...
    assert mg.default_config(2048, 64, 5) == (4, 1, 2)  # ... when the row blocks pair up
    assert mg.default_config(4096, 64, 128) == (8, 1, 2)  # K = 4096: one block, two chunks in flight
    assert [mg.column_tiles(m) for m in (1, 8, 9, 16, 17, 64)] == [1, 1, 2, 2, 4, 8]


def test_cpu_call_is_refused():
    _, w, s, b = _weight(32, 128)
    words, sb = mg.repack_q4(w, s, b)
    with pytest.raises(RuntimeError, match="CUDA"):
        mg.mma_gemv(torch.randn(1, 128).bfloat16(), words, sb)
