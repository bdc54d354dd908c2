"""The dequantising prefill matmul on warpgroup MMAs (`kernels/quant/wgmma_dense.py`) on CUDA: the bits of
dequantise-then-multiply (`dequantize` + `dense_mm`, themselves the wide kernel's) at the 35B-A3B's dense
projection shapes for every launch shape, NaN-poisoned outputs fully written, a row alone == among others, fp64
within tolerance, and the wrapper's input checks."""

from __future__ import annotations

import pytest
import torch

import kernel_cases as kc
from conftest import INTERPRET

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="Gluon kernels do not run in the interpreter")]

SHAPES = [(12352, 2048), (9216, 2048), (2048, 4096), (192, 128)]  # in_proj, q|k|v, out projections; a small odd one
# (rows of x a program, slots, row sets, the bf16x2 fma dequantisation)
LAUNCHES = [(128, 3, 1, True), (128, 3, 1, False), (128, 4, 1, True), (64, 4, 1, True), (256, 3, 1, True),
            (128, 4, 2, True), (64, 3, 2, False)]


def _case(dev, n, k, m, seed):
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import triton_affine as ta
    from deltaserve.kernels.triton_common import WeightSpec

    g = torch.Generator(device=dev).manual_seed(seed)
    packed, s, b, wd = kc.affine_weight((n, k), 4, 64, dev, gen=g, bounded=True)
    spec = WeightSpec(packed, s, b, 4, 64)
    words, sb = mg.repack_q4(packed, s, b, order="natural")
    x = torch.randn(m, k, device=dev, generator=g).bfloat16()
    return spec, words, sb, x, wd, ta


@pytest.mark.parametrize("n,k", SHAPES)
def test_wg_dense_mm_same_bits(dev, n, k):
    """Every launch shape (rows of x a program, slots, row sets, the fp32 or bf16x2-fma dequantisation) gives
    dense_mm's result over the dequantised weight bit for bit at M = 1, 65, 256, 300, 512 and 1,029 (tiles cut
    short, a second row set past the weight's rows), writes every element of a NaN-poisoned output, and stays
    within bf16 of fp64."""
    from deltaserve.kernels.quant import wgmma_dense as wd_mod

    spec, words, sb, x, wd, ta = _case(dev, n, k, 1029, n + k)
    assert wd_mod.bf16_fma_exact(sb), "the bounded weight's values are exact in fp32"
    deq = ta.dequantize(spec)
    for m in (1, 65, 256, 300, 512, 1029):
        want = ta.dense_mm(x[:m], deq, torch.empty(m, n, dtype=torch.bfloat16, device=dev))
        kc.close(want, x[:m].double() @ wd.t(), 4 * kc.BF16_EPS, f"dense_mm {n}x{k} M={m}")
        for bt, ns, rs, fma in LAUNCHES:
            got = wd_mod.wg_dense_mm(x[:m], words, sb, out=kc.poisoned((m, n), torch.bfloat16, dev), bf16_fma=fma,
                                     tile_rows=bt, stages=ns, row_sets=rs)
            what = f"wg_dense_mm {n}x{k} M={m} (BT {bt}, NS {ns}, RS {rs}, bf16 fma {fma})"
            assert not torch.isnan(got).any(), what + ": NaN left"
            diff = (got != want).sum().item()
            assert diff == 0, f"{what}: {diff} of {got.numel()} elements differ from dequantize + dense_mm"
    alone = wd_mod.wg_dense_mm(x[:1], words, sb, bf16_fma=True)
    assert torch.equal(wd_mod.wg_dense_mm(x, words, sb, bf16_fma=True)[:1], alone), "a row among 1,028 others"


def test_bf16_fma_exact_detects_a_double_rounding(dev):
    """bf16_fma_exact refuses a weight with one group whose values need more than fp32's 24 bits (a bias 2^-40 of
    its scale's size), and the exact fp32 dequantisation still gives dense_mm's bits on it."""
    from deltaserve.kernels.quant import wgmma_dense as wd_mod

    spec, words, sb, x, _, ta = _case(dev, 192, 128, 64, 5)
    sb = sb.clone()
    sb[3, 1, 2, 1, 1] = -(sb[3, 1, 2, 1, 0].float() * 2.0**-40).bfloat16()
    assert not wd_mod.bf16_fma_exact(sb)
    from deltaserve.kernels.quant import mma_gemv as mg

    q, s, b = mg.unpack_q4(words, sb, order="natural")
    from deltaserve.kernels.triton_common import WeightSpec

    spec2 = WeightSpec(spec.w, s.contiguous(), b.contiguous(), 4, 64)
    want = ta.dense_mm(x, ta.dequantize(spec2), torch.empty(64, 192, dtype=torch.bfloat16, device=dev))
    assert torch.equal(wd_mod.wg_dense_mm(x, words, sb, bf16_fma=False), want)


def test_wg_dense_mm_input_checks(dev):
    """Bad operands are refused with what was expected and found."""
    from deltaserve.kernels.quant import wgmma_dense as wd_mod

    spec, words, sb, x, _, _ = _case(dev, 192, 128, 8, 1)
    with pytest.raises(ValueError, match="x must be bf16"):
        wd_mod.wg_dense_mm(x.float(), words, sb)
    with pytest.raises(ValueError, match="x must be bf16"):
        wd_mod.wg_dense_mm(x[:, :64], words, sb)
    with pytest.raises(ValueError, match="words must be int32"):
        wd_mod.wg_dense_mm(x, words[:2], sb)
    with pytest.raises(ValueError, match="sb must be"):
        wd_mod.wg_dense_mm(x, words, sb.float())
    with pytest.raises(ValueError, match="out must be bf16"):
        wd_mod.wg_dense_mm(x, words, sb, out=torch.empty(8, 100, device=dev, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="tile_rows"):
        wd_mod.wg_dense_mm(x, words, sb, tile_rows=32)


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    """The tiny q4 g64 MoE model of test_model_mma_path on the GPU (the tensor-core MoE): hidden 64, so its output
    and attention projections (N 64 / multiples of 64) can take the fused kernel; the in_proj (336 rows) cannot."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import sys
    from pathlib import Path

    from deltaserve.weights.loader import load_checkpoint
    from deltaserve.weights.quantizer import quantize_checkpoint

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from model_helpers import make_hf_model, ours_from_checkpoint

    src = tmp_path_factory.mktemp("bf16")
    hf = make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                       linear_num_value_heads=8)
    ours_from_checkpoint(hf, src)
    q4 = quantize_checkpoint(src, tmp_path_factory.mktemp("q4"), 4, 64, progress=False)
    yield load_checkpoint(q4, device="cuda", dtype=torch.bfloat16, progress=False).model


def test_model_prefill_fused_equals_dequant(q4_model, monkeypatch):
    """A prefill's logits at every position (whole, and in chunks of 64) with the dense projections on the fused
    kernel == on dequantise-then-multiply, bit for bit, from one row (triton_affine.dense_path patched); the
    fused kernel really served the projections it can take (their natural-order copies built and counted)."""
    from test_model_fast_path import run_all_logits

    from deltaserve.kernels import launch_table
    from deltaserve.kernels.quant import triton_affine as ta
    from deltaserve.model import fast

    with launch_table.override({"dense_wgmma.fused_min_programs": 1}):  # the tiny model's launches are a few programs
        prompt = [(7 * i + 3) % 32 for i in range(300)]
        runs = {}
        for mode in ("dequant", "fused"):
            monkeypatch.setattr(ta, "dense_path", lambda m, mode=mode: mode)
            runs[mode] = [run_all_logits(q4_model, prompt, "cuda", torch.bfloat16, chunk) for chunk in (None, 64)]
        for chunk, want, got in zip((None, 64), runs["dequant"], runs["fused"]):
            assert torch.equal(got, want), f"chunk {chunk}: fused != dequant ({(got != want).sum().item()} logits)"
        built = [m for m in fast.all_modules(q4_model) if fast.state(m).dense]
        assert built, "no projection took the fused kernel"
        assert fast.decode_copy_bytes(q4_model) >= sum(t.numel() * t.element_size() for m in built
                                                       for t in fast.state(m).dense[:2])
