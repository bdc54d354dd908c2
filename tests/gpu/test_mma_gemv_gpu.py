"""Tensor-core GEMV (`kernels/quant/mma_gemv.py`) on CUDA: fp64 reference with NaN-poisoned outputs, and bit-for-bit
batch invariance (a row alone == the same row among up to 63 others). Gluon kernels have no interpreter form, so
these run on the GPU only; the repack's meaning is checked on CPU (tests/test_mma_gemv.py). The experts matmul on
its helpers and the MoE block: test_mma_experts_gpu.py."""

from __future__ import annotations

import pytest
import torch

import kernel_cases as kc
from conftest import INTERPRET

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="Gluon kernels do not run in the interpreter")]


@pytest.mark.parametrize("n,k", [(64, 256), (2048, 4096), (12352, 2048), (512, 1024)])
@pytest.mark.parametrize("m", [1, 5, 8, 16, 64])
def test_mma_gemv_vs_fp64(dev, n, k, m):
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(m, k, device=dev).bfloat16()
    out = kc.poisoned((m, n), torch.bfloat16, dev)
    y = mg.mma_gemv(x, words, sb, out=out)
    assert y.data_ptr() == out.data_ptr()
    ref = x.double() @ wd.t()
    kc.close(y, ref, 2 * kc.BF16_EPS, f"mma_gemv M={m} N={n} K={k}")
    rowscale = ref.abs().amax(1, keepdim=True).clamp_min(1e-3)
    err = ((y.double() - ref).abs() / rowscale).max().item()
    assert err <= 2 * kc.BF16_EPS, f"mma_gemv M={m}: row-relative error {err:.3g}"


@pytest.mark.parametrize("n,k", [(2048, 4096), (9216, 2048)])
def test_mma_gemv_batch_invariant(dev, n, k):
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(64, k, device=dev).bfloat16()
    alone = torch.cat([mg.mma_gemv(x[r : r + 1], words, sb) for r in range(64)])
    for m in (2, 4, 16, 64):
        assert torch.equal(mg.mma_gemv(x[:m], words, sb), alone[:m]), f"rows differ when {m} share the launch"
    assert torch.equal(mg.mma_gemv(x[37:40], words, sb), alone[37:40])


@pytest.mark.parametrize("m", [1, 8, 64, 70])
def test_mma_gemv_fp32_out_is_the_bf16_result_widened(dev, m):
    """An fp32 out (the lm_head's logits) holds the bf16 results widened, bit for bit,
    at one launch and past MAX_ROWS (two); conv= with an fp32 out is refused."""
    from deltaserve.kernels.quant import mma_gemv as mg

    n, k = 2048 * 3, 2048
    p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(m, k, device=dev).bfloat16()
    out = kc.poisoned((m, n), torch.float32, dev)
    got = mg.mma_gemv(x, words, sb, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, mg.mma_gemv(x, words, sb).float())
    with pytest.raises(ValueError, match="out must be bf16"):
        mg.mma_gemv(x[:1], words, sb, out=out[:1], conv=(None, None, None, None, 0))


def _mma_gemv_of(p, s, b):
    """kernel_cases' conv-check GEMV factory for the mma.sync tensor-core GEMV (the weight repacked once)."""
    from deltaserve.kernels.quant import mma_gemv as mg

    words, sb = mg.repack_q4(p, s, b)
    return lambda x, out=None, conv=None: mg.mma_gemv(x, words, sb, out=out, conv=conv)


def _tc_gemv_of(p, s, b):
    """The same for the decode linears' entry (tensor_core_gemv.tc_gemv: mma_gemv or wg_gemv by rows)."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import tensor_core_gemv as tcg

    words, sb = mg.repack_q4(p, s, b)
    return lambda x, out=None, conv=None: tcg.tc_gemv(x, words, sb, out=out, conv=conv)


@pytest.mark.parametrize("c,extra,k", [(64, 16, 256), (8192, 4160, 2048)])
@pytest.mark.parametrize("m", [1, 3, 16, 64])
def test_mma_gemv_conv(dev, c, extra, k, m):
    """mma_gemv(conv=...) == mma_gemv then causal_conv on the first C features, bit for bit (outputs and pool),
    the other slots untouched, and against fp64 (the DeltaNet in_proj decode of the model): the CUDA-core GEMV's
    check (kernel_cases.check_gemv_conv) with this GEMV."""
    from deltaserve.kernels.gated_delta import triton_decode as td

    kc.check_gemv_conv({"gdn": td}, dev, 4, 64, m=m, c=c, extra=extra, k=k, fresh=(1,), gemv=_mma_gemv_of)


def test_mma_gemv_conv_invariance(dev):
    kc.check_gemv_conv_invariance({}, dev, 8192, 4160, 2048, gemv=_mma_gemv_of)


@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 4096)])
def test_mma_gemv_launch_shapes_same_bits(dev, n, k):
    """Row blocks per program and chunks in flight (which default_config picks by the rows of x) never change a
    bit: 64 rows under every (RB, AHEAD) == under (1, 1), plain and with the conv epilogue (outputs and pool)."""
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    w = mg.default_warps(k)
    x = torch.randn(64, k, device=dev).bfloat16()
    base = mg.mma_gemv(x, words, sb, config=(w, 1, 1))
    assert mg.default_config(k, 64, n // 16) != (w, 1, 1)  # the 64-row default is another launch shape
    for rb in (1, 2):
        for ahead in (1, 2):
            assert torch.equal(mg.mma_gemv(x, words, sb, config=(w, rb, ahead)), base), (rb, ahead)
    assert torch.equal(mg.mma_gemv(x, words, sb), base), "the default launch shape at 64 rows"
    every = k // 64 // w  # AHEAD >= the chunks: the whole weight requested up front (a form for up to 8 rows)
    for m in (1, 8):
        assert torch.equal(mg.mma_gemv(x[:m], words, sb, config=(w, 1, every)), base[:m]), f"all chunks, {m} rows"
        for ring in (3, 4, every - 1):  # the register ring (_accumulate_ring): first chunks' weights before the wait
            assert torch.equal(mg.mma_gemv(x[:m], words, sb, config=(w, 1, ring)), base[:m]), f"ring {ring}, {m} rows"
    c = min(8192, n // 2)
    cw, pool, slots, ctx = kc.conv_problem(dev, 64, c, 4, 3 * 64 + 2, (1,))
    pool = pool.nan_to_num()
    outs = []
    for config in ((w, 1, 1), None):  # the one-row shape and the 64-row default
        pl = pool.clone()
        outs.append((mg.mma_gemv(x, words, sb, conv=(cw, pl, slots, ctx, c), config=config), pl))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), "conv epilogue bits"
    rows = [(mg.mma_gemv(x[:8], words, sb, conv=(cw, pl, slots[:8], ctx[:8], c), config=config), pl)
            for config in ((w, 1, 1), (w, 1, every), (w, 1, 4)) for pl in (pool.clone(),)]
    for got, what in ((rows[1], "all chunks"), (rows[2], "the ring")):
        assert torch.equal(rows[0][0], got[0]) and torch.equal(rows[0][1], got[1]), f"conv, {what}"


@pytest.mark.parametrize("n,k", [(2048, 4096), (512, 1024)])
def test_mma_gemv_own_group_sums(dev, n, k):
    """xs=None (the kernel's own group sums, MMA with ones) and xs from prep_x (the norm's bits) are both within
    the fp64 bound, and each is batch invariant (a row alone == among 64)."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant.triton_gemv import prep_x

    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(64, k, device=dev).bfloat16()
    xs = prep_x(x, 4, 64)[1]
    ref = x.double() @ wd.t()
    own = mg.mma_gemv(x, words, sb, out=kc.poisoned((64, n), torch.bfloat16, dev))
    loaded = mg.mma_gemv(x, words, sb, xs=xs, out=kc.poisoned((64, n), torch.bfloat16, dev))
    kc.close(own, ref, 2 * kc.BF16_EPS, "mma_gemv, own group sums")
    kc.close(loaded, ref, 2 * kc.BF16_EPS, "mma_gemv, prep_x's group sums")
    for r in (0, 37, 63):
        assert torch.equal(mg.mma_gemv(x[r : r + 1].clone(), words, sb), own[r : r + 1]), f"own sums: row {r}"
        assert torch.equal(mg.mma_gemv(x[r : r + 1].clone(), words, sb, xs=xs[r : r + 1].clone()),
                           loaded[r : r + 1]), f"prep sums: row {r}"


@pytest.mark.parametrize("split,cap", [(16, {}), (32, {}), (32, {"maxnreg": 128})])
def test_mma_gemv_row_split_same_bits(dev, split, cap, monkeypatch):
    """The K = 4096 weights' rows of x split over programs (launch_table "gemv_mma.split_rows", with and without a
    register cap) give the unsplit launch's bits at 64 and 37 rows (a ragged last block), the group sums given or
    the kernel's own, every element of a NaN-poisoned output written."""
    from deltaserve.kernels import launch_table
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant.triton_gemv import prep_x

    p, s, b, _ = kc.affine_weight((2048, 4096), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(64, 4096, device=dev).bfloat16()
    xs_all = prep_x(x, 4, 64)[1]
    for m in (64, 37):
        for xs in (None, xs_all[:m]):
            with launch_table.override({"gemv_mma.split_rows": 1 << 30}):  # no split
                ref = mg.mma_gemv(x[:m], words, sb, xs=xs)
            monkeypatch.setattr(mg, "split_maxnreg", lambda: cap)
            with launch_table.override({"gemv_mma.split_rows": split}):
                assert mg.split_rows(4096, m) == split
                got = mg.mma_gemv(x[:m], words, sb, xs=xs, out=kc.poisoned((m, 2048), torch.bfloat16, dev))
            assert torch.equal(got, ref), f"split {split} cap {cap}, {m} rows, own sums {xs is None}"
