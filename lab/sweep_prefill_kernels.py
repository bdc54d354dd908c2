"""One-call device sweep of the prefill matmuls (`kernels/quant/triton_affine.py`) at the Qwen3.6-35B-A3B pp512
shapes: the dense projections at M = 512 rows (DeltaNet in_proj 12352x2048, attention q|k|v 9216x2048, the out
projections 2048x4096, shared expert 1024x2048 and 2048x512, all q4 g64) and the routed experts at T = 512 tokens x
top-8 (gate / up 512x2048 with x_repeat 8, down 2048x512; 256 experts, ~16 rows each).

Kernels swept (`default` is the library's own call: the wide kernel for a dense weight, the 16-row kernel for
experts):
  lib   the library's 16-row kernel (SUB sub-tiles sharing each dequantised weight tile; `_launch`) over
        (SUB, BN, BK, num_warps, num_stages): none of these changes a row's arithmetic (its module doc), so every
        configuration must give the default's bits;
  wide  one `tl.dot` over a [BM, BK] x tile per K step (the library's wide kernel for dense weights at var 0, this
        script's candidate_kernel otherwise): var 0 the library's dequantised tile transposed, var 2 the tile
        dequantised directly as [BK, BN], var 3 the operands swapped (out^T = W x^T: the weight as the MMA's A
        operand, which wgmma can read from registers, x^T as B). At BM >= 64 Triton emits wgmma, below it mma.sync;
        whether a row's bits survive the change is what the `bits` column answers (against the default).
Every configuration is CHECKED before it is timed (NaN-poisoned output, vs the fp64 product of x and the bf16-rounded
dequantised weight, vs the default's output bit for bit). References: cuBLAS bf16 (F.linear with the dequantised
weight) at the same shape, and for the experts a dense matmul of the same FLOPs (a ceiling, not a grouped GEMM).
Timing: eager back-to-back calls between CUDA events (prefill kernels run 50 us and more, so launch gaps hide),
dense weights cycled over copies past the 50 MB L2.

  python lab/sweep_prefill_kernels.py [--quick] [--out FILE] [--budget-s 300] [--only dense|experts]
  python lab/sweep_prefill_kernels.py --dry-run   # CPU, TRITON_INTERPRET=1, tiny shapes, checks only
Exit status 1 when a configuration fails a check.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT), str(ROOT / "tests" / "gpu")]
import sweep_common  # noqa: E402
import triton  # noqa: E402  (the dry run re-executes itself with TRITON_INTERPRET=1 before anything is compiled)
import triton.language as tl  # noqa: E402

from deltaserve.kernels.quant import triton_affine as ta  # noqa: E402
from deltaserve.kernels.triton_common import dequant_tile, dot_f32, mma  # noqa: E402
FULL = dict(t=512, e=256, k=8, h=2048, i=512,
            dense=((12352, 2048), (9216, 2048), (2048, 4096), (1024, 2048), (2048, 512)), calls=20)
TINY = dict(t=24, e=8, k=2, h=128, i=128, dense=((96, 128), (64, 256)), calls=1)
BITS, GROUP = 4, 64
EPS = 2.0**-8
L2_BYTES = 256 << 20


def lib_grid(quick: bool, experts: bool, variants=None) -> list[dict]:
    """Library-kernel configurations, the default first (sub=None, config=None); only the default with `variants`
    (the candidate kernel's variants alone are swept)."""
    grid = [dict(kernel="default", sub=None, config=None)]
    if variants is not None:
        return grid
    subs = (1, 2, 4) if experts else (4,)
    # the best of a wider grid (BN 32-128, BK 64-256, 4/8 warps, 2-4 stages) that the H200 ran at 97d4309's parent
    # (lab/results/sweep-prefill-h200-2026-11-30.jsonl): 8 warps and BK 64 lost everywhere
    shapes = [(64, 128, 4, 3), (128, 128, 4, 3), (64, 128, 4, 4)]
    if quick:
        shapes = shapes[:2] + [(64, 64, 4, 3)]
    for sub in subs:
        for cfg in shapes:
            grid.append(dict(kernel="lib", sub=sub, config=cfg))
    return grid


def wide_grid(quick: bool, experts: bool, variants=None) -> list[dict]:
    """Candidate-kernel configurations (var, bm, bn, bk, warps, stages); var 0 on a dense weight is the library's
    wide kernel at another launch shape."""
    if experts:
        shapes = [(0, 32, 64, 128, 4, 3), (2, 32, 64, 128, 4, 3), (2, 32, 128, 128, 4, 3), (3, 32, 64, 128, 4, 3),
                  (3, 16, 64, 128, 4, 3), (3, 32, 128, 128, 8, 3), (3, 64, 64, 128, 4, 3), (2, 64, 64, 128, 4, 3),
                  (3, 32, 64, 128, 4, 4), (3, 16, 128, 128, 8, 3), (4, 32, 64, 128, 4, 3), (5, 32, 64, 128, 4, 3),
                  (5, 16, 64, 128, 4, 3), (5, 64, 64, 128, 4, 3), (4, 32, 128, 128, 4, 3), (5, 32, 128, 128, 8, 3)]
    else:
        shapes = [(0, 64, 64, 128, 4, 3), (0, 128, 64, 128, 8, 3), (2, 128, 128, 128, 8, 2), (2, 64, 64, 128, 4, 3),
                  (2, 128, 64, 128, 8, 3), (3, 128, 128, 128, 8, 2), (3, 64, 64, 128, 4, 3), (3, 128, 64, 128, 4, 3),
                  (3, 64, 128, 128, 8, 3), (2, 64, 128, 128, 4, 3), (5, 128, 64, 128, 4, 3), (5, 64, 64, 128, 4, 3),
                  (5, 128, 128, 128, 8, 2), (4, 64, 64, 128, 4, 3), (4, 32, 64, 128, 4, 3)]
    if quick:
        shapes = shapes[:2] + [[c for c in shapes if c[0] == v][0] for v in (2, 3, 4, 5)]
    if variants is not None:
        shapes = [c for c in shapes if c[0] in variants]
    return [dict(kernel="wide", var=v, bm=bm, config=(bn, bk, w, s)) for v, bm, bn, bk, w, s in shapes]


def canary(args) -> list[dict]:
    return [dict(kernel="default", sub=None, config=None, canary=True)] if args.canary else []


def label(c: dict) -> str:
    if c.get("canary"):
        return "canary (corrupted default)"
    if c["kernel"] == "default":
        return "default"
    if c["kernel"] == "lib":
        return f"lib sub{c['sub']} bn{c['config'][0]} bk{c['config'][1]} " \
            f"w{c['config'][2]} s{c['config'][3]}"
    bn, bk, w, s = c["config"]
    return f"wide v{c['var']} bm{c['bm']} bn{bn} bk{bk} w{w} s{s}"


# ------------------------------------------------------------------ the wide kernel at any config


def run_wide(x, spec, out, bm, config, tiles=None, x_repeat=1, var=0):
    """var 0 on a dense weight: the library's wide kernel; otherwise this script's candidate kernel."""
    bn, bk, warps, stages = config
    if tiles is None and var == 0:
        return ta._launch_wide(x, spec, out, (bm, bn, bk, warps, stages, False))
    m = x.shape[0] * x_repeat
    if tiles is None:
        t_args, grid_t, swe, sse = (x, x, x, x), triton.cdiv(m, bm), 0, 0
    else:
        t_args, grid_t, swe, sse = tiles, tiles[0].numel(), spec.w.stride(0), spec.scales.stride(0)
    candidate_kernel[(triton.cdiv(spec.n, bn), grid_t)](
        x, spec.w, spec.scales, spec.biases, out, *t_args, m, spec.n, spec.k, x_repeat,
        x.stride(0), swe, spec.w.stride(-2), sse, spec.scales.stride(-2),
        out.stride(0), BITS=spec.bits, GROUP=spec.group, BN=bn, BK=bk, BM=bm, EXPERTS=tiles is not None, VAR=var,
        F32=dot_f32(), num_warps=warps, num_stages=stages)


@triton.jit
def dequant_kmajor(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN: tl.constexpr, BK: tl.constexpr,
                   BITS: tl.constexpr, GROUP: tl.constexpr):
    # dequant_tile's values, produced directly as [BK, BN]: words [BK/PACK, BN] -> codes [BK/PACK, PACK, BN]
    PACK: tl.constexpr = 32 // BITS
    WPG: tl.constexpr = GROUP // PACK
    j = tl.arange(0, BK // PACK)
    p = tl.load(w_ptr + rn[None, :] * stride_wn + (k0 // PACK + j)[:, None], mask=n_mask[None, :], other=0)
    shifts = tl.arange(0, PACK) * BITS
    q = (p[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)
    q = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    g = k0 // GROUP + j // WPG
    s = tl.load(s_ptr + rn[None, :] * stride_sn + g[:, None], mask=n_mask[None, :], other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rn[None, :] * stride_sn + g[:, None], mask=n_mask[None, :], other=0.0).to(tl.float32)
    return tl.reshape(q * s[:, None, :] + b[:, None, :], (BK, BN))


@triton.jit
def dequant_join4(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN: tl.constexpr, BK: tl.constexpr,
                  GROUP: tl.constexpr):
    # 4-bit only: dequant_tile's values as [BN, BK] bf16, each word's 8 codes cut with constant shifts and put back
    # in k order by joins (in-thread: no per-element shift amounts, no reshape of a strided tile)
    j = tl.arange(0, BK // 8)
    p = tl.load(w_ptr + rn[:, None] * stride_wn + (k0 // 8 + j)[None, :], mask=n_mask[:, None], other=0)
    g = k0 // GROUP + j // (GROUP // 8)
    s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rn[:, None] * stride_sn + g[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
    w0 = ((((p >> 0) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w1 = ((((p >> 4) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w2 = ((((p >> 8) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w3 = ((((p >> 12) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w4 = ((((p >> 16) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w5 = ((((p >> 20) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w6 = ((((p >> 24) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    w7 = ((((p >> 28) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * s + b
    # join appends its axis last: the outermost join is the fastest index (k = 8 j + 4 a + 2 b + c)
    r = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)), tl.join(tl.join(w1, w5), tl.join(w3, w7)))
    return tl.reshape(r, (BN, BK))


@triton.jit
def candidate_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, tile_e_ptr, tile_lo_ptr, tile_hi_ptr, order_ptr,
    M, N, K, x_repeat, stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_om,
    BITS: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
    EXPERTS: tl.constexpr, VAR: tl.constexpr, F32: tl.constexpr,
):
    # the library's tiles with one [BM, BK] x [BK, BN] dot per K step. VAR 0: the library's dequant_tile,
    # transposed; 2: the tile dequantised directly as [BK, BN]; 3: swapped operands, out^T = W x^T (the weight
    # as the MMA's A operand, which wgmma may take from registers; x^T as B); 4 / 5: dequant_join4 (4-bit),
    # unswapped / swapped
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    n_mask = rn < N
    rm = tl.arange(0, BM)
    if EXPERTS:
        e = tl.load(tile_e_ptr + pid_t)
        if e < 0:
            return
        lo = tl.load(tile_lo_ptr + pid_t)
        hi = tl.load(tile_hi_ptr + pid_t)
        w_ptr += e.to(tl.int64) * stride_we
        s_ptr += e.to(tl.int64) * stride_se
        b_ptr += e.to(tl.int64) * stride_se
        m_row = lo + rm < hi
        row = tl.load(order_ptr + lo + rm, mask=m_row, other=0)
    else:
        row = pid_t * BM + rm
        m_row = row < M
    xp = x_ptr + (row // x_repeat).to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acct = tl.zeros((BN, BM), dtype=tl.float32)
    rk = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        xa = tl.load(xp + (k0 + rk)[None, :], mask=m_row[:, None], other=0.0)
        if VAR == 4:
            w = dequant_join4(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, GROUP)
            acc = mma(xa, tl.trans(w.to(x_ptr.dtype.element_ty)), acc, F32)
        elif VAR == 5:
            w = dequant_join4(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, GROUP)
            acct = mma(w.to(x_ptr.dtype.element_ty), tl.trans(xa), acct, F32)
        elif VAR == 2:
            wt = dequant_kmajor(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, BITS, GROUP)
            acc = mma(xa, wt.to(x_ptr.dtype.element_ty), acc, F32)
        elif VAR == 3:
            w = dequant_tile(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, BITS, GROUP)
            acct = mma(w.to(x_ptr.dtype.element_ty), tl.trans(xa), acct, F32)
        else:
            w = dequant_tile(w_ptr, s_ptr, b_ptr, rn, n_mask, k0, stride_wn, stride_sn, BN, BK, BITS, GROUP)
            acc = mma(xa, tl.trans(w.to(x_ptr.dtype.element_ty)), acc, F32)
    if VAR == 3 or VAR == 5:
        acc = tl.trans(acct)
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_row[:, None] & n_mask[None, :])


# ------------------------------------------------------------------ timing


def time_calls(fns, device) -> float | None:
    """us per call: 3 warm-up calls, then every fn in turn until >= 20 calls, between CUDA events."""
    if device.type != "cuda":
        return None
    for f in fns[:3]:
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = max(20, len(fns))
    start.record()
    for j in range(n):
        fns[j % len(fns)]()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / n


# ------------------------------------------------------------------ sections


def make_weight(lead, n, k, device, copies=1):
    from kernel_cases import affine_weight

    from deltaserve.kernels.triton_common import WeightSpec

    out = []
    for _ in range(copies):
        packed, s, b, w64 = affine_weight((*lead, n, k), BITS, GROUP, device)
        out.append((WeightSpec(packed, s, b, BITS, GROUP, "sweep weight"), w64.to(torch.bfloat16)))
    return out


def sweep_case(args, name, shape_tag, k, flops, base_fn, fns_for, ref64, grid, device, deadline, emit):
    """Check then time each configuration of `grid`; fns_for(c) -> (one call writing `out`, out, [timed calls])."""
    base_out = None
    for c in grid:
        rec = dict(case=name, shape=shape_tag, label=label(c))
        if time.monotonic() > deadline:
            emit(dict(rec, skipped=True, why="budget"))
            continue
        bk = (c["config"] or (0, 0))[1]
        if bk and k % bk:
            emit(dict(rec, skipped=True, why=f"BK {bk} does not divide K {k}"))
            continue
        try:
            run, out, timed = fns_for(c)
            out.fill_(float("nan"))
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001  a config that does not compile is reported, not fatal
            emit(dict(rec, ok=False, error=f"{type(exc).__name__}: {str(exc)[:160]}"))
            continue
        got = out.clone()
        if c.get("canary"):  # --canary: a corrupted copy of the default, which the checks must fail
            got[0, 0] = got[0, 0] * 2 + 1
        if base_out is None:
            base_out = got
        err = sweep_common.rel_err(got, ref64)
        same = bool(torch.equal(got, base_out))
        # the library kernel's configurations must keep the default's bits; under the interpreter only those with
        # the default's BK (128), since its dot sums a whole [16, BK] x [BK, BN] block in numpy before adding it
        # to the accumulator, where the GPU chains k16 MMAs in the same order for every BK
        strict = c["kernel"] == "lib" and not (args.dry_run and bk not in (0, 128))
        ok = err <= 8 * EPS * args.slack and (same or not strict)
        us = time_calls(timed, device) if ok else None
        emit(dict(rec, ok=ok, err_ref=err, same_bits=same, us=us,
                  tflops=(flops / us / 1e6 if us else None)))
    ref_us = time_calls(base_fn, device) if base_fn else None
    if ref_us:
        emit(dict(case=name, shape=shape_tag, label="cuBLAS bf16 reference", ok=True, us=ref_us,
                  tflops=flops / ref_us / 1e6))


def dense_section(args, shp, device, deadline, emit):
    import torch.nn.functional as F

    from deltaserve.kernels.quant import triton_affine as ta

    m = shp["t"]
    for n, k in shp["dense"]:
        per = n * k * BITS // 8
        copies = 1 if device.type != "cuda" else max(1, min(8, L2_BYTES // per))
        weights = make_weight((), n, k, device, copies)
        x = torch.randn(m, k, device=device).bfloat16()
        ref64 = x.double() @ weights[0][1].double().T
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device=device) for _ in weights]

        def fns_for(c, weights=weights, x=x, outs=outs):
            def call(j):
                spec, out = weights[j][0], outs[j]
                if c["kernel"] == "default":
                    return lambda: ta.affine_matmul(x, spec.w, spec.scales, spec.biases, BITS, GROUP, out=out)
                if c["kernel"] == "lib":
                    sub, cfg = c["sub"], c["config"]
                    return lambda: ta._launch(x, spec, out, -(-m // (16 * sub)), sub, cfg)
                return lambda: run_wide(x, spec, out, c["bm"], c["config"], var=c["var"])
            calls = [call(j) for j in range(len(weights))]
            return calls[0], outs[0], calls

        base = None
        if device.type == "cuda":
            base = [lambda w=w: F.linear(x, w) for _, w in weights]
        grid = lib_grid(args.quick, False, args.variants) + wide_grid(args.quick, False, args.variants) + canary(args)
        sweep_case(args, "dense", f"M{m} N{n} K{k}", k, 2.0 * m * n * k, base, fns_for, ref64, grid, device, deadline,
                   emit)
        del weights, outs


def experts_section(args, shp, device, deadline, emit):
    from deltaserve.kernels.quant import triton_affine as ta

    t, e, top, h, i = shp["t"], shp["e"], shp["k"], shp["h"], shp["i"]
    ids = torch.rand(t, e, device=device).topk(top, dim=1).indices.sort(dim=1).values.reshape(-1)
    m = ids.numel()
    for what, n, k, rep in (("gate/up", i, h, top), ("down", h, i, 1)):
        (spec, w16), = make_weight((e,), n, k, device)
        x = torch.randn(m // rep, k, device=device).bfloat16()
        xr = x.repeat_interleave(rep, dim=0).double()
        ref64 = torch.einsum("mk,mnk->mn", xr, w16[ids].double()) if m * n * k < 2**31 else \
            torch.cat([torch.einsum("mk,mnk->mn", xr[j:j + 256], w16[ids[j:j + 256]].double())
                       for j in range(0, m, 256)])
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        tiles_by_rows = {}

        def fns_for(c, spec=spec, x=x, out=out, rep=rep, tiles_by_rows=tiles_by_rows):
            if c["kernel"] == "default":
                def run():
                    ta.affine_matmul_experts(x, spec.w, spec.scales, spec.biases, ids, BITS, GROUP, x_repeat=rep,
                                             out=out)
                return run, out, [run]
            rows = 16 * c["sub"] if c["kernel"] == "lib" else c["bm"]
            if rows not in tiles_by_rows:
                tiles_by_rows[rows] = ta.expert_tiles(ids, e, rows)
            tiles = tiles_by_rows[rows]
            if c["kernel"] == "lib":
                def run():
                    ta._launch(x, spec, out, tiles[0].numel(), c["sub"], c["config"], experts=tiles, x_repeat=rep)
            else:
                def run():
                    run_wide(x, spec, out, c["bm"], c["config"], tiles=tiles, x_repeat=rep, var=c["var"])
            return run, out, [run]

        base = None
        if device.type == "cuda":
            xd = torch.randn(m, k, device=device).bfloat16()
            wd = w16[0]
            base = [lambda: xd @ wd.T]
        grid = lib_grid(args.quick, True, args.variants) + wide_grid(args.quick, True, args.variants) + canary(args)
        sweep_case(args, f"experts {what}", f"T{t} x{top} E{e} N{n} K{k}", k, 2.0 * m * n * k, base, fns_for, ref64,
                   grid, device, deadline, emit)
        del spec, w16, out


def fmt(rec: dict) -> str:
    if rec.get("skipped"):
        return f"{rec['case']:<16} {rec['shape']:<24} {rec['label']:<34} skipped ({rec.get('why', 'budget')})"
    if rec.get("error"):
        return f"{rec['case']:<16} {rec['shape']:<24} {rec['label']:<34} FAIL {rec['error']}"
    us = f"{rec['us']:9.1f} us {rec['tflops']:7.1f} TFLOP/s" if rec.get("us") else " " * 28
    bits = "" if "same_bits" not in rec else ("bits =" if rec["same_bits"] else "bits ~")
    err = "" if "err_ref" not in rec else f"err {rec['err_ref']:.2e}"
    return f"{rec['case']:<16} {rec['shape']:<24} {rec['label']:<34} {us} {bits} {err} {'ok' if rec['ok'] else 'FAIL'}"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes, no timing")
    ap.add_argument("--quick", action="store_true", help="the smaller grids")
    ap.add_argument("--only", choices=("dense", "experts", "all"), default="all")
    ap.add_argument("--out", help="JSON lines file (default $OUT/sweep_prefill_kernels.jsonl if $OUT is set)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="configurations past this are skipped")
    ap.add_argument("--canary", action="store_true", help="add a deliberately corrupted configuration (must FAIL)")
    ap.add_argument("--variants", type=lambda v: {int(x) for x in v.split(",")},
                    help="only the default and these candidate-kernel variants (comma list, e.g. 4,5)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    args = parse(argv)
    status = sweep_common.start(args.dry_run, __file__, argv)
    if status is not None:
        return status
    device = torch.device("cpu" if args.dry_run else "cuda")
    shp = TINY if args.dry_run else FULL
    args.slack = 2.0 if args.dry_run else 1.0  # the interpreter truncates fp32 -> bf16 (kernel_cases.SLACK)
    out = args.out or (os.path.join(os.environ["OUT"], "sweep_prefill_kernels.jsonl") if os.environ.get("OUT") else None)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "CPU, Triton interpreter (checks only)"
    sink = sweep_common.RecordSink(out, fmt, dict(gpu=gpu, commit=os.environ.get("DELTASERVE_COMMIT", "")))
    records, emit = sink.records, sink.emit
    print(f"# {gpu}; q4 g64; bits: '=' same as the library default's output, '~' not", flush=True)
    torch.manual_seed(0)
    budget = float("inf") if args.dry_run else args.budget_s
    if args.only in ("experts", "all"):
        experts_section(args, shp, device, sink.t0 + (0.6 * budget if args.only == "all" else budget), emit)
    if args.only in ("dense", "all"):
        dense_section(args, shp, device, sink.t0 + budget, emit)
    print("\n# best per case (checked configurations, us):")
    for case in dict.fromkeys((r["case"], r["shape"]) for r in records):
        timed = [r for r in records if (r["case"], r["shape"]) == case and r.get("us") and r.get("ok")]
        if timed:
            best = min((r for r in timed if r["label"] != "cuBLAS bf16 reference"), key=lambda r: r["us"], default=None)
            if best is None:  # only the reference was timed
                continue
            base = next((r for r in timed if r["label"] == "default"), None)
            ref = next((r for r in timed if r["label"] == "cuBLAS bf16 reference"), None)
            print(f"  {case[0]:<16} {case[1]:<24} default {base['us'] if base else float('nan'):8.1f}  best "
                  f"{best['us']:8.1f} ({best['label']}, bits {'=' if best['same_bits'] else '~'})  cuBLAS bf16 "
                  f"{ref['us'] if ref else float('nan'):8.1f}")
    return sink.finish()


if __name__ == "__main__":
    sys.exit(main())
