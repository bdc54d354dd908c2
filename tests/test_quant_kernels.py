"""Quantised-weight kernels: MLX affine packing/quantise/dequantise/matmul and Qwen FP8 blocks.

Oracles are independent of deltaserve.kernels.quant: `mlx.core.quantize` for the packed bits, a numpy little-endian
bit reader + float64 arithmetic for the decode rule and the matmuls. Inputs are fresh random tensors every run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from deltaserve.kernels.quant import (
    SUPPORTED_BITS,
    SUPPORTED_GROUP_SIZES,
    affine_dequantize,
    affine_linear,
    affine_quantize,
    fp8_block_dequantize,
    fp8_block_linear,
    fp8_block_quantize,
    pack_bits,
    unpack_bits,
)
from deltaserve.kernels.quant import affine as affine_mod
from deltaserve.kernels.quant import fp8 as fp8_mod
from deltaserve.quant import AffineEmbedding, AffineLinear, AffineSpec, AffineStacked

f64 = torch.float64
COMBOS = [(b, g) for b in SUPPORTED_BITS for g in SUPPORTED_GROUP_SIZES]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(torch.seed() % 2**31)


def codes_fp64_reader(packed: torch.Tensor, bits: int, n: int) -> np.ndarray:
    """Independent decoder of the spec's layout: each row is a little-endian bit stream of n codes."""
    raw = packed.contiguous().view(torch.int32).numpy().view(np.uint8).reshape(*packed.shape[:-1], -1)
    stream = np.unpackbits(raw, axis=-1, bitorder="little")[..., : n * bits]
    weights = (1 << np.arange(bits)).astype(np.int64)
    return (stream.reshape(*packed.shape[:-1], n, bits).astype(np.int64) * weights).sum(-1)


def dequant_fp64(packed, scales, biases, bits, group, n) -> torch.Tensor:
    q = torch.from_numpy(codes_fp64_reader(packed, bits, n)).to(f64)
    s = scales.to(f64).repeat_interleave(group, dim=-1)
    b = biases.to(f64).repeat_interleave(group, dim=-1)
    return s * q + b


# ---- packing --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_pack_is_a_little_endian_bit_stream_and_unpack_inverts_it(gen, bits):
    q = torch.randint(0, 1 << bits, (3, 5, 128), generator=gen)
    packed = pack_bits(q, bits)
    assert packed.dtype == torch.uint32 and packed.shape == (3, 5, 128 * bits // 32)
    assert np.array_equal(codes_fp64_reader(packed, bits, 128), q.numpy())
    assert torch.equal(unpack_bits(packed, bits), q.to(torch.int32))


# ---- MLX's quantiser, bit for bit -------------------------------------------------------------------------------


def mlx_quantize(w: torch.Tensor, bits: int, group: int):
    mx = pytest.importorskip("mlx.core")
    dtype = {torch.float32: mx.float32, torch.bfloat16: mx.bfloat16, torch.float16: mx.float16}[w.dtype]
    wq, s, b = mx.quantize(mx.array(w.float().numpy()).astype(dtype), group_size=group, bits=bits)
    as_np = lambda a: np.array(a.astype(mx.float32))  # noqa: E731
    return np.array(wq), as_np(s), as_np(b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,group", COMBOS)
def test_quantize_matches_mlx_bit_for_bit(gen, bits, group, dtype):
    w = (torch.randn(24, 256, generator=gen) * torch.rand(24, 1, generator=gen) * 4).to(dtype)
    w[0, :group] = 0.0  # all-zero group (scale clamps to 1e-7, q0 rounds to 0)
    w[1, :group] = -0.75  # constant negative group
    w[2, :group] = 0.5  # constant positive group
    w[3, 5] = 40.0  # one outlier dominating its group
    w[4, :group] = torch.rand(group, generator=gen).to(dtype) + 3  # all-positive group: the bias is the max edge
    packed, scales, biases = affine_quantize(w, bits, group)
    want_q, want_s, want_b = mlx_quantize(w, bits, group)
    assert scales.dtype == dtype and biases.dtype == dtype
    assert np.array_equal(packed.view(torch.int32).numpy().view(np.uint32), want_q)
    assert np.array_equal(scales.float().numpy(), want_s)
    assert np.array_equal(biases.float().numpy(), want_b)


@pytest.mark.parametrize("bits,group", COMBOS)
def test_dequantize_follows_the_decode_rule(gen, bits, group):
    w = torch.randn(2, 16, 384, generator=gen)  # a leading (expert) axis is carried through
    packed, scales, biases = affine_quantize(w, bits, group)
    got = affine_dequantize(packed, scales, biases, bits, group, torch.float32)
    want = dequant_fp64(packed, scales, biases, bits, group, 384)
    assert torch.allclose(got.to(f64), want, rtol=0, atol=1e-6 * want.abs().max().item())
    # and the error is what affine quantisation allows: half a step, unless the code is clipped to an end of the grid
    step = scales.abs().to(f64).repeat_interleave(group, dim=-1)
    q = torch.from_numpy(codes_fp64_reader(packed, bits, 384))
    clipped = (q == 0) | (q == (1 << bits) - 1)
    assert (((want - w.to(f64)).abs() <= 0.5 * step * (1 + 1e-4) + 1e-6) | clipped).all()


# ---- packed matmul == dequantise-then-matmul -------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("bits,group", COMBOS)
def test_packed_matmul_equals_dequantised_matmul_fp64(gen, monkeypatch, bits, group, chunked):
    if chunked:  # force the block-of-rows path: 7 rows per block, ragged last block
        monkeypatch.setattr(affine_mod, "_MATMUL_CHUNK_ELEMS", 7 * 256)
    out_f, in_f = 45, 256
    packed, scales, biases = affine_quantize(torch.randn(out_f, in_f, generator=gen), bits, group)
    x = torch.randn(3, 5, in_f, generator=gen)
    got = affine_linear(x, packed, scales, biases, bits, group)
    want = x.to(f64) @ dequant_fp64(packed, scales, biases, bits, group, in_f).T
    assert got.shape == (3, 5, out_f) and got.dtype == torch.float32
    assert (got.to(f64) - want).abs().max().item() <= 2e-6 * want.abs().max().item()


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32), (3, 128)])
def test_packed_matmul_in_bf16(gen, bits, group):
    packed, scales, biases = affine_quantize(torch.randn(64, 128, generator=gen).bfloat16(), bits, group)
    x = torch.randn(9, 128, generator=gen).bfloat16()
    got = affine_linear(x, packed, scales, biases, bits, group)
    want = x.to(f64) @ dequant_fp64(packed, scales, biases, bits, group, 128).T
    assert got.dtype == torch.bfloat16
    assert (got.to(f64) - want).abs().max().item() <= 2e-2 * want.abs().max().item()


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 64), (2, 32), (6, 128)])
def test_packed_modules_match_fp64(gen, bits, group):
    spec = AffineSpec(bits, group)
    lin, stacked, emb = AffineLinear(256, 48, spec), AffineStacked(3, 256, 48, spec), AffineEmbedding(50, 256, spec)
    for module, shape in ((lin, (48, 256)), (stacked, (3, 48, 256)), (emb, (50, 256))):
        w, s, b = affine_quantize(torch.randn(*shape, generator=gen), bits, group)
        module.weight.data, module.scales.data, module.biases.data = w, s, b
    x = torch.randn(7, 256, generator=gen)
    dense = lambda m: dequant_fp64(m.weight.data, m.scales.data, m.biases.data, bits, group, 256)  # noqa: E731
    close = lambda got, want: (got.to(f64) - want).abs().max() <= 2e-6 * want.abs().max()  # noqa: E731
    assert close(lin(x), x.to(f64) @ dense(lin).T)
    assert close(stacked.forward_one(x, 2), x.to(f64) @ dense(stacked)[2].T)
    assert close(emb.as_linear(x), x.to(f64) @ dense(emb).T)
    ids = torch.tensor([0, 49, 7, 7])
    assert torch.allclose(emb(ids).to(f64), dense(emb)[ids], rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits,group", [(7, 64), (4, 16), (1, 64), (4, 256)])
def test_unsupported_affine_spec_is_refused(bits, group):
    with pytest.raises(ValueError, match=f"unsupported (affine bits {bits}|group size {group})"):
        affine_quantize(torch.randn(4, 256), bits, group)


# ---- FP8 blocks ---------------------------------------------------------------------------------------------------


def fp8_dequant_fp64(w8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    out = torch.empty(w8.shape, dtype=f64)
    w = w8.view(torch.float8_e4m3fn).to(f64)
    for r in range(w8.shape[0]):
        for c0 in range(0, w8.shape[1], block[1]):
            out[r, c0 : c0 + block[1]] = w[r, c0 : c0 + block[1]] * scale[r // block[0], c0 // block[1]].to(f64)
    return out


@pytest.mark.parametrize("shape,block", [((300, 200), (128, 128)), ((64, 96), (32, 32)), ((5, 17), (4, 8))])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_fp8_block_dequantize_and_matmul_match_fp64(gen, shape, block, scale_dtype):
    w = torch.randn(*shape, generator=gen) * torch.rand(shape[0], 1, generator=gen) * 3
    w8, scale = fp8_block_quantize(w, block, scale_dtype)
    assert w8.dtype == torch.float8_e4m3fn and scale.shape == (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
    bits = w8.view(torch.uint8)  # the in-memory form
    want = fp8_dequant_fp64(bits, scale, block)
    for held in (bits, w8):
        assert torch.equal(fp8_block_dequantize(held, scale, block, torch.float32).to(f64), want.float().to(f64))
    x = torch.randn(6, shape[1], generator=gen)
    ref = x.to(f64) @ want.T
    assert (fp8_block_linear(x, bits, scale, block).to(f64) - ref).abs().max() <= 2e-6 * ref.abs().max()


def test_fp8_matmul_row_blocks_align_with_scale_blocks(gen, monkeypatch):
    monkeypatch.setattr(fp8_mod, "_MATMUL_CHUNK_ELEMS", 1)  # one 8-row scale block per matmul block
    w8, scale = fp8_block_quantize(torch.randn(37, 24, generator=gen), (8, 8))
    x = torch.randn(3, 24, generator=gen)
    want = x.to(f64) @ fp8_dequant_fp64(w8.view(torch.uint8), scale, (8, 8)).T
    got = fp8_block_linear(x, w8.view(torch.uint8), scale, (8, 8))
    assert (got.to(f64) - want).abs().max() <= 2e-6 * want.abs().max()


def test_fp8_quantize_error_is_within_e4m3_precision(gen):
    w = torch.randn(256, 384, generator=gen)
    w8, scale = fp8_block_quantize(w)
    err = (fp8_block_dequantize(w8, scale).to(f64) - w.to(f64)).abs()
    amax = w.abs().reshape(2, 128, 3, 128).amax(dim=(1, 3)).repeat_interleave(128, 0).repeat_interleave(128, 1)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; subnormal floor 2^-10 of the block's amax/448
    assert (err <= w.abs().to(f64) * 2**-4 + amax.to(f64) / 448 * 2**-9).all()


def test_fp8_scale_shape_mismatch_is_named():
    with pytest.raises(ValueError, match=r"weight_scale_inv shape \[2, 2\] does not match weight \[300, 200\]"):
        fp8_block_dequantize(torch.zeros(300, 200, dtype=torch.uint8), torch.ones(2, 2))


# ---- the reference path on CUDA tensors (run with `pytest -m gpu`) ----------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 64), (3, 32), (6, 128), (2, 64), (5, 32)])
def test_reference_ops_give_the_same_results_on_cuda(bits, group):
    """The references are the spec on every device: on CUDA tensors they give the CPU's bits (packing, quantiser,
    lookups) and the CPU's matmuls up to fp32 summation order (the engine's fallback where no Triton kernel runs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(bits * 1000 + group)
    w = torch.randn(3, 96, 256, generator=g).bfloat16()
    packed, scales, biases = affine_quantize(w, bits, group)
    cu = affine_quantize(w.cuda(), bits, group)
    assert all(t.is_cuda for t in cu)  # the quantiser's outputs stay on the input's device
    assert torch.equal(cu[0].cpu().view(torch.int32), packed.view(torch.int32))
    assert torch.equal(cu[1].cpu(), scales) and torch.equal(cu[2].cpu(), biases)
    assert torch.equal(unpack_bits(cu[0], bits).cpu(), unpack_bits(packed, bits))
    x = torch.randn(5, 256, generator=g)
    want = affine_linear(x, packed[1], scales[1], biases[1], bits, group)
    got = affine_linear(x.cuda(), cu[0][1], cu[1][1], cu[2][1], bits, group).cpu()
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    emb = AffineEmbedding(96, 256, AffineSpec(bits, group)).cuda()
    emb.weight.data, emb.scales.data, emb.biases.data = cu[0][0], cu[1][0], cu[2][0]
    ids = torch.tensor([0, 95, 3, 3])
    assert torch.equal(emb(ids.cuda()).cpu(), affine_dequantize(packed[0], scales[0], biases[0], bits, group)[ids])
    w8, s8 = fp8_block_quantize(w[0].float(), (32, 32))
    w8c, s8c = fp8_block_quantize(w[0].float().cuda(), (32, 32))
    assert torch.equal(w8c.cpu().view(torch.uint8), w8.view(torch.uint8)) and torch.equal(s8c.cpu(), s8)
    ref = fp8_block_linear(x, w8.view(torch.uint8), s8, (32, 32))
    got8 = fp8_block_linear(x.cuda(), w8.view(torch.uint8).cuda(), s8.cuda(), (32, 32)).cpu()
    assert (got8 - ref).abs().max() <= 1e-5 * ref.abs().max()
