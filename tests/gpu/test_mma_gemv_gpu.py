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
