"""Tensor-core GEMV (`kernels/quant/mma_gemv.py`) on CUDA: fp64 reference with NaN-poisoned outputs, and bit-for-bit
batch invariance (a row alone == the same row among up to 63 others). Gluon kernels have no interpreter form, so
these run on the GPU only; the repack's meaning is checked on CPU (tests/test_mma_gemv.py)."""

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


@pytest.mark.parametrize("c,extra,k", [(64, 16, 256), (8192, 4160, 2048)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_mma_gemv_conv(dev, c, extra, k, m):
    """mma_gemv(conv=...) == mma_gemv then causal_conv on the first C features, bit for bit (outputs and pool),
    the other slots untouched, and the conv channels against fp64 (the DeltaNet in_proj decode of the model)."""
    from deltaserve.kernels.conv1d import causal_conv1d
    from deltaserve.kernels.gated_delta import triton_decode as td
    from deltaserve.kernels.quant import mma_gemv as mg

    n = c + extra
    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(m, k, device=dev).bfloat16()
    w, pool, slots, ctx = kc.conv_problem(dev, m, c, 4, 3 * m + 2, fresh=(1,))
    pool0, pool1 = pool.clone(), pool.clone()
    out = kc.poisoned((m, n), torch.bfloat16, dev)
    y = mg.mma_gemv(x, words, sb, out=out, conv=(w, pool, slots, ctx, c))
    plain = mg.mma_gemv(x, words, sb)
    cu = torch.arange(m + 1, device=dev, dtype=torch.int32)
    conv = td.causal_conv(plain[:, :c].contiguous(), w, pool1, cu, slots, ctx, 1)
    assert torch.equal(y[:, c:], plain[:, c:]), "conv mma_gemv: the plain features differ"
    assert torch.equal(y[:, :c], conv), "conv mma_gemv != mma_gemv + causal_conv (conv channels)"
    assert torch.equal(pool, pool1), "conv mma_gemv: the pool differs from causal_conv's"
    yb = (x.double() @ wd.t())[:, :c].bfloat16().double()
    for i in range(m):
        st = None if int(ctx[i]) == 0 else pool0[slots[i]].double()
        ry, _ = causal_conv1d(yb[i : i + 1], w.double(), st)
        kc.close(y[i : i + 1, :c], ry, 4 * kc.BF16_EPS, f"conv mma_gemv row {i}")
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[slots.cpu()] = False
    assert torch.equal(pool[untouched.to(dev)], pool0[untouched.to(dev)]), "other slots were written"


def test_mma_gemv_conv_invariance(dev):
    from deltaserve.kernels.quant import mma_gemv as mg

    c, extra, k = 8192, 4160, 2048
    p, s, b, _ = kc.affine_weight((c + extra, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(16, k, device=dev).bfloat16()
    w, pool, slots, ctx = kc.conv_problem(dev, 16, c, 4, 40, fresh=(2,))
    pool = pool.nan_to_num()

    def run(rows):
        pl = pool.clone()
        y = mg.mma_gemv(x[rows], words, sb, conv=(w, pl, slots[rows], ctx[rows], c))
        return y, pl[slots[rows]]

    alone = run(slice(0, 1))
    for o in (1, 3, 15):
        y, st = run(slice(0, o + 1))
        assert torch.equal(y[:1], alone[0]) and torch.equal(st[:1], alone[1]), f"row 0 among {o}"
        last = run(slice(o, o + 1))
        assert torch.equal(y[o:], last[0]) and torch.equal(st[o:], last[1]), f"row {o} among {o}"
