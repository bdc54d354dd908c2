"""A first tensor-core decode GEMV, as a probe for the next step (lab/NOTES.md, last section): what Triton 3.6 makes
of "int4 codes dequantised in registers, bf16 MMA per quantisation group, the GEMV's own group epilogue".

    y[m, n] = sum_g  s[n, g] * (q[n, g-th 64 codes] . x[m, same 64]) + b[n, g] * sum(x[m, same 64])

One program owns BN output features and a 16-row tile of x (rows past M masked), for the whole K: per group one
[BN, 64] x [64, 16] MMA from zero, then acc += fma(s, P, b * xs). An MMA row's result does not depend on the other
rows of its tile, so a row would get the same bits at M = 1 and M = 64: the property the 64-stream target needs
(a row's bits may not depend on the batch) with tensor-core throughput. Not wired into the model.

  TRITON_INTERPRET=1 python lab/probe_mma_gemv.py --check     against fp64 on random q4 g64 weights (CPU)
  python lab/probe_mma_gemv.py --sass                          sm_90 SASS instruction mix, no GPU needed

Finding (2026-11-30, --sass at N = 12352, K = 2048): Triton emits wgmma (HGMMA) with the dequantised tile stored to
shared memory and read back by LDSM (STS ~1,200 per thread at BN 64), 6.6-7.4 instructions per code for the whole
program (the unpack and conversion: SHF, LOP3, I2F per element), against 4.9 per code and row in the CUDA-core GEMV
at M = 1 (624 per thread, 64 threads, 4 rows x 2048 codes). So: slower at batch 1 as written, and ~0.5 per code
and row at M = 16. The work is in the dequant: two codes per LOP3 into a bf16x2 register and the tile kept out of
shared memory are what would make it pay at batch 1.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltaserve.kernels.triton_common import dot_f32, mma  # noqa: E402


@triton.jit
def _mma_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_om,
                     K: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, F32: tl.constexpr):
    # grid (cdiv(N, BN), cdiv(M, BM)); q4, GROUP codes = GROUP / 8 words per row and group
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.program_id(1) * BM + tl.arange(0, BM)
    n_mask = rn < N
    m_mask = rm < M
    GW: tl.constexpr = GROUP // 8
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for g in tl.static_range(K // GROUP):
        words = tl.load(w_ptr + rn[:, None] * stride_wn + g * GW + tl.arange(0, GW)[None, :], mask=n_mask[:, None],
                        other=0)
        codes = (words[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 0xF  # code i of word j: k = 8j + i
        q = tl.reshape(codes, (BN, GROUP)).to(tl.float32).to(tl.bfloat16)  # exact: codes < 16
        k = g * GROUP + tl.arange(0, GROUP)
        xg = tl.load(x_ptr + rm[None, :] * stride_xm + k[:, None], mask=m_mask[None, :], other=0.0)  # [GROUP, BM]
        p = mma(q, xg, tl.zeros((BN, BM), dtype=tl.float32), F32)
        xs = tl.sum(xg.to(tl.float32), axis=0)
        s = tl.load(s_ptr + rn * stride_sn + g, mask=n_mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + rn * stride_sn + g, mask=n_mask, other=0.0).to(tl.float32)
        acc += tl.fma(s[:, None], p, b[:, None] * xs[None, :])
    o = out_ptr + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


def mma_gemv(x, w, s, b, k, bn=64, warps=4, f32=None):
    """y = x W^T for x [M, K] bf16 and a q4 g64 weight (w int32/uint32 [N, K/8], s/b bf16 [N, K/64]). f32: the
    fp32 dot the interpreter needs (None: triton_common.dot_f32())."""
    m, n = x.shape[0], w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _mma_gemv_kernel[(triton.cdiv(n, bn), triton.cdiv(m, 16))](
        x, w, s, b, out, m, n, x.stride(0), w.stride(0), s.stride(0), out.stride(0),
        K=k, GROUP=64, BN=bn, BM=16, F32=dot_f32() if f32 is None else f32, num_warps=warps)
    return out


def check() -> float:
    """Largest error against fp64, relative to the largest |y|, on random weights and rows (M = 3, ragged N)."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import kernel_cases as kc

    kc.interpreter_numpy_shim()
    torch.manual_seed(0)
    n, k = 72, 256
    w, s, b, wd = kc.affine_weight((n, k), 4, 64, "cpu")
    x = torch.randn(3, k).bfloat16()
    ref = x.double() @ wd.t()
    return ((mma_gemv(x, w, s, b, k).double() - ref).abs().max() / ref.abs().max()).item()


def sass(n=12352, k=2048) -> list[str]:
    sys.path.insert(0, str(ROOT / "lab"))
    import sass_report as sr

    compiled = sr.install(False)
    lines = []
    w = torch.zeros(n, k // 8, dtype=torch.int32)
    s = torch.zeros(n, k // 64, dtype=torch.bfloat16)
    for bn in (64, 128):
        before = set(compiled)
        mma_gemv(torch.zeros(1, k, dtype=torch.bfloat16), w, s, s, k, bn=bn, f32=False)  # the GPU's bf16 MMA
        ins = [ln.split(";")[0] for ln in sr.instructions(compiled[next(x for x in compiled if x not in before)])]
        ops = collections.Counter(re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", i).split(" ")[0].split(".")[0]
                                  for i in ins)
        per_code = len(ins) * 4 * 32 / ((k // 64) * bn * 64)
        mmas = sum(c for o, c in ops.items() if "MMA" in o)
        smem = sum(c for o, c in ops.items() if o in ("STS", "STSM", "LDS", "LDSM"))
        lines.append(f"BN {bn}, 4 warps: {len(ins)} instructions per thread, {per_code:.1f} per code and program row, "
                     f"{mmas} MMA, {smem} shared-memory; " + ", ".join(f"{o} {c}" for o, c in ops.most_common(12)))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="against fp64 (set TRITON_INTERPRET=1 without a GPU)")
    ap.add_argument("--sass", action="store_true", help="sm_90 SASS instruction mix (compile only)")
    args = ap.parse_args(argv)
    if args.check:
        err = check()
        print(f"max error / max |y|: {err:.2e}")
        if err > 2 * 2.0**-8 * 2:  # bf16 output rounding, doubled for the interpreter's truncating conversion
            return 1
    if args.sass:
        print("\n".join(sass()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
