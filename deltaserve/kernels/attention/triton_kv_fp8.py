"""Triton helpers writing kv_fp8's format (an e4m3 cache row and its scale), shared by the attention kernels."""

from __future__ import annotations

import triton
import triton.language as tl

from .kv_fp8 import FP8_MAX

_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + M) - M rounds |y| < 2^22 to an integer, ties to even (fp32)
_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def round_e4m3(x):
    """fp32 x -> the nearest e4m3fn value (ties to even; the sign of a zero kept), clamped to +-448, still fp32:
    the step of x's binade (2^(e-3), at least the subnormal step 2^-9) by exact power-of-two scaling."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    ulp = ((e + 124) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3)
    r = (x / ulp + _MAGIC) - _MAGIC
    r = tl.where(r == 0.0, x * 0.0, r)
    return tl.clamp(r * ulp, -_MAX, _MAX)


@triton.jit
def fp8_scale(amax):
    """A row's scale from its amax(|x|) (fp32 scalar): amax / 448 (IEEE division, as torch's), 1 for a zero row."""
    return tl.where(amax > 0.0, tl.math.div_rn(amax, _MAX), 1.0)


@triton.jit
def store_fp8(dst_ptr, x, scale, mask):
    """e4m3(x / scale) at dst_ptr (x fp32, any shape; pointers shaped alike), as quantize_rows."""
    tl.store(dst_ptr, round_e4m3(tl.math.div_rn(x, scale)).to(dst_ptr.dtype.element_ty), mask=mask)
