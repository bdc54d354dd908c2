"""A test kernel around `triton_gemv.gemv_row_pair` and `gemv_row` for one row of x (imported lazily by the checks:
importing it imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deltaserve.kernels.quant.triton_gemv import MAGIC, gemv_row, gemv_row_pair, row_run_config
from deltaserve.kernels.triton_common import WeightSpec


@triton.jit
def _pair_kernel(x, w1, s1, b1, w2, s2, b2, o_pair1, o_pair2, o_one1, o_one2, N, stride_wn, stride_sn, magic,
                 K: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, CG: tl.constexpr):
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    m = rn < N
    y1, y2 = gemv_row_pair(x, x, x, w1, s1, b1, w2, s2, b2, rn, m, stride_wn, stride_sn, stride_wn, stride_sn, magic,
                           K, BITS, GROUP, BN, CG, 1, False, True)
    tl.store(o_pair1 + rn, y1, mask=m)
    tl.store(o_pair2 + rn, y2, mask=m)
    tl.store(o_one1 + rn, gemv_row(x, x, x, w1, s1, b1, rn, m, stride_wn, stride_sn, magic, K, BITS, GROUP, BN, CG, 1),
             mask=m)
    tl.store(o_one2 + rn, gemv_row(x, x, x, w2, s2, b2, rn, m, stride_wn, stride_sn, magic, K, BITS, GROUP, BN, CG, 1),
             mask=m)


def pair_and_singles(x_row, first, second, bits, group):
    """(pair's W1.x, pair's W2.x, gemv_row W1.x, gemv_row W2.x), fp32 [N] each, for packed (w, s, b) weights, in
    the MoE gate/up's launch shape (row runs of 4 rows: triton_gemv.row_run_config; one warp over the whole row
    when the row is too short for it)."""
    (w1, s1, b1), (w2, s2, b2) = first, second
    n, k = w1.shape[0], x_row.numel()
    bn, cg, warps = row_run_config(WeightSpec(w1, s1, b1, bits, group), 4) or (4, k // group, 1)
    outs = [torch.full((n,), float("nan"), device=x_row.device) for _ in range(4)]
    _pair_kernel[(triton.cdiv(n, bn),)](x_row, w1, s1, b1, w2, s2, b2, *outs, n, w1.stride(0), s1.stride(0), MAGIC, K=k,
                                        BITS=bits, GROUP=group, BN=bn, CG=cg, num_warps=warps)
    return outs
