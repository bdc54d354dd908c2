"""The router's logits for many tokens (a prefill chunk) in Gluon, with the bits of the per-token router launch.

Why: the multi-row Triton GEMV (`triton_gemv._gemv_kernel`, 8 tokens a program, the router's BE = 4 rows) took
66 us a layer at pp512 on the H200 (lab/NOTES.md), ~10% of the prefill, for 0.27 GFLOP. Its sm_90 SASS has 111
block barriers a program: per token, Triton moves every x tile it reads from the load's layout to the weight
tile's, and the group sums between layouts, each through shared memory. Here the layouts are chosen, so x is read
straight into the weight tile's layout (no move), the x group sums and the per-group values stay in registers,
and only the last sum over a row's groups crosses warps, once for all of a program's tokens.

The bits. The router's per-token arithmetic (`triton_gemv.gemv_row` with the router's row run: 8-bit codes, group
64, K = 2048 in one chunk over 4 warps, INLINE pairs) is, per (token, expert row):
  - per word j (codes c0..c3 of x[4j .. 4j+3]): d_j = (((0 + q0 x0) + q1 x1) + q2 x2) + q3 x3 (products exact in
    fp32: 8-bit codes times bf16) and xsum_j = (((0 + x0) + x1) + x2) + x3;
  - per group g (16 words): gs_g = the sum of its d_j as Triton reduces a [rows, 32, 16] tile laid out 4 words a
    thread, 4 threads a group ([1, 1, 4] / [1, 8, 4] / [1, 4, 1]): each thread's 4 words in order, then the 4
    threads by the lane butterfly; xs_g = the sum of its xsum_j as Triton reduces a [32, 16] tile one word a lane
    (16 lanes: the butterfly at word distance 8, 4, 2, 1);
  - a_g = fma(s_g, gs_g, b_g * xs_g), acc_g = 0 + a_g, and the logit = the sum of the 32 acc_g over 32 lanes
    (the butterfly at group distance 16, 8, 4, 2, 1).
A butterfly is a tree of two-element sums, so it is spelled here as sums over axes of size two in the same order
(`_pairwise`): the same values whatever layout holds them. The in-thread part of gs is a sequential sum, so gs is
reduced in the very layout Triton reduces it in (the weight tile's, reshaped). The GPU test compares this kernel
with the per-token launch bit for bit (tests/gpu/kernel_cases.check_router_rows).

A program: BN expert rows (BN never changes a row's bits) against MB tokens, x of each token copied into shared
memory by cp.async as its own group (every token's request issued after the weights', before any arithmetic), the
per-group values of all MB tokens staged in shared memory for the one cross-warp sum at the end.
"""

from __future__ import annotations

import torch
import triton

from .. import backend
from ..launch_table import value as launch_value
from ..quant.mma_gemv import HAVE_GLUON
from ..quant.triton_gemv import MAGIC
from ..triton_common import WeightSpec
from ..triton_pdl import pdl_args

WARPS = 4  # the router's row run at H = 2048, 8 bits: 4 warps over the whole K (_router_cg)
K_ROUTER, BITS_ROUTER, GROUP_ROUTER = 2048, 8, 64  # the one router format this kernel reproduces


def rows_launch() -> tuple[int, int]:
    """(BN expert rows, MB tokens) a program: launch_table "router.rows_bn" and "router.rows_mb" (never a bit; what
    they won against is in the table's docs)."""
    return launch_value("router.rows_bn"), launch_value("router.rows_mb")


def rows_fit(x: torch.Tensor, r: WeightSpec, cg: int, warps: int) -> bool:
    """Whether this kernel gives the per-token router's bits for router r read with (CG, warps): the 8-bit g64 router
    of H = 2048 as its row run (one chunk over 4 warps), bf16 x whose rows can be read as aligned 16-byte runs, on a
    CUDA device with Gluon (it cannot run in the interpreter)."""
    if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":
        return False
    fmt = (r.k, r.bits, r.group, cg, warps) == (K_ROUTER, BITS_ROUTER, GROUP_ROUTER, K_ROUTER // GROUP_ROUTER, WARPS)
    aligned = x.dtype == torch.bfloat16 and x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and x.stride(0) % 8 == 0
    return fmt and aligned and r.w.stride(-1) == 1 and r.w.data_ptr() % 16 == 0 and r.w.stride(0) % 4 == 0


def router_rows_logits(x: torch.Tensor, r: WeightSpec, out: torch.Tensor,
                       shape: tuple[int, int] | None = None) -> None:
    """out [T, E] fp32 = the router's logits of the T rows of x [T, 2048] bf16 (rows_fit must hold). shape: the
    program's (BN, MB), default rows_launch()."""
    t = x.shape[0]
    if out.shape != (t, r.n) or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(f"router_rows_logits: out must be fp32 [{t}, {r.n}] with contiguous rows, found "
                         f"{out.dtype} {tuple(out.shape)}")
    if not t:
        return
    bn, mb = shape or rows_launch()
    _router_rows_kernel[(triton.cdiv(r.n, bn), triton.cdiv(t, mb))](
        x, r.w, r.scales, r.biases, out, t, r.n, x.stride(0), r.w.stride(0), r.scales.stride(0), out.stride(0), MAGIC,
        K=K_ROUTER, GROUP=GROUP_ROUTER, BN=bn, MB=mb, num_warps=WARPS, **pdl_args(x))


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    from ..quant.mma_gemv import pdl_open, pdl_wait
    from ..quant.wgmma_gemv import bf16_pair

    @gluon.jit
    def _pairwise(v, AXIS: gl.constexpr, LEVELS: gl.constexpr):
        """v reshaped with LEVELS axes of two from AXIS on (most significant first) summed one axis at a time, the
        most significant first: a butterfly's tree over an index's bits, the same values in any layout."""
        for _ in gl.static_range(LEVELS):
            v = gl.sum(v, axis=AXIS)
        return v

    @gluon.jit
    def _codes(p, magic, SH: gl.constexpr):
        """fp32 value of the 8-bit field at bits [SH, SH + 8) of p (SH 0 or 8), exactly: the field ORed into the
        mantissa of 2^(23 - SH) minus 2^(23 - SH) (triton_gemv_inline._code_dot_unscaled's decode)."""
        mag = magic - (SH << 23)
        return ((p & (255 << SH)) | mag).to(gl.float32, bitcast=True) - (8388608.0 / (1 << SH))

    @gluon.jit
    def _router_rows_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_sn, stride_om,
                            magic, K: gl.constexpr, GROUP: gl.constexpr, BN: gl.constexpr, MB: gl.constexpr,
                            PDL: gl.constexpr = False):
        # grid (cdiv(N, BN), cdiv(M, MB)). Words [BN, K/4] int32 (4 codes a word), 4 a thread along K (WL); x of a
        # token as [K/2] int32 pairs, 8 a thread: exactly the x of its words (XL). Rows past M read row M - 1 and
        # store nothing.
        pdl_open(PDL)
        W: gl.constexpr = 4
        KW: gl.constexpr = K // 4  # words a row
        CG: gl.constexpr = K // GROUP  # groups a row
        GW: gl.constexpr = GROUP // 4  # words a group
        WL: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, W], [1, 0])
        XL: gl.constexpr = gl.BlockedLayout([8], [32], [W], [0])  # [K/2] pairs: 32 bytes a thread
        SWL: gl.constexpr = gl.SliceLayout(2, gl.BlockedLayout([1, 1, 4], [1, 8, 4], [1, W, 1], [2, 1, 0]))
        FL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [W, 1], [1, 0])  # [MB * BN, CG]: groups on lanes
        rn = gl.program_id(0) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, WL))
        j = gl.arange(0, KW, layout=gl.SliceLayout(0, WL))
        p = gl.load(w_ptr + gl.minimum(rn, N - 1).to(gl.int64)[:, None] * stride_wn + j[None, :])
        # the scales and biases [BN, CG] in the layout of the group sums (SWL)
        rs = gl.program_id(0) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, SWL))
        gs_i = gl.arange(0, CG, layout=gl.SliceLayout(0, SWL))
        sofs = gl.minimum(rs, N - 1).to(gl.int64)[:, None] * stride_sn + gs_i[None, :]
        s = gl.load(s_ptr + sofs).to(gl.float32)
        b = gl.load(b_ptr + sofs).to(gl.float32)
        pdl_wait(PDL)
        m0 = gl.program_id(1) * MB
        xi = gl.arange(0, 2 * KW, layout=XL)
        SH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # a token's row (the subview's layout)
        x_sm = gl.allocate_shared_memory(gl.int32, [MB, 2 * KW], SH1)
        for t in gl.static_range(MB):  # one cp.async group a token: token t waits for its own copies only
            row = gl.minimum(m0 + t, M - 1).to(gl.int64)
            x_row = (x_ptr + row * stride_xm).to(gl.pointer_type(gl.int32), bitcast=True)
            async_copy.async_copy_global_to_shared(x_sm.index(t), x_row + xi)
            async_copy.commit_group()
        q0 = _codes(p, magic, 0)
        q1 = _codes(p, magic, 8)
        q2 = _codes(p >> 16, magic, 0)
        q3 = _codes(p >> 16, magic, 8)
        SH3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        a_sm = gl.allocate_shared_memory(gl.float32, [MB * BN, CG], SH3)  # token t's rows at t * BN
        zero_w = gl.zeros([BN, KW], gl.float32, WL)
        zero_x = gl.zeros([KW], gl.float32, gl.SliceLayout(0, WL))
        zero_g = gl.zeros([BN, CG], gl.float32, SWL)
        for t in gl.static_range(MB):
            async_copy.wait_group(MB - 1 - t)
            pair = x_sm.index(t).load(XL)  # the pairs this thread copied: no barrier needed
            lo, hi = gl.split(gl.reshape(pair, [KW, 2]))  # codes (0, 1) and (2, 3) of each word
            lo = gl.convert_layout(lo, gl.SliceLayout(0, WL), assert_trivial=True)
            hi = gl.convert_layout(hi, gl.SliceLayout(0, WL), assert_trivial=True)
            x0, x1 = bf16_pair(lo)
            x2, x3 = bf16_pair(hi)
            xsum = (((zero_x + x0) + x1) + x2) + x3
            d = zero_w + q0 * x0[None, :]
            d = d + q1 * x1[None, :]
            d = d + q2 * x2[None, :]
            d = d + q3 * x3[None, :]
            gs = gl.sum(gl.reshape(d, [BN, CG, GW]), axis=2)  # Triton's reduction in Triton's layout
            xs = _pairwise(gl.reshape(xsum, [CG, 2, 2, 2, 2]), 1, 4)  # the 16-lane butterfly over the words
            xs = gl.convert_layout(xs, gl.SliceLayout(0, SWL))
            a = zero_g + gl.fma(s, gs, b * xs[None, :])
            a_sm.slice(t * BN, BN).store(a)
        gl.thread_barrier()
        acc = a_sm.load(FL)
        y = _pairwise(gl.reshape(acc, [MB, BN, 2, 2, 2, 2, 2]), 2, 5)  # the 32-lane butterfly over the groups
        YL: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, W], [0, 1])
        y = gl.convert_layout(y, YL)
        tm = m0 + gl.arange(0, MB, layout=gl.SliceLayout(1, YL))
        tn = gl.program_id(0) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, YL))
        gl.store(out_ptr + tm.to(gl.int64)[:, None] * stride_om + tn[None, :], y,
                 mask=(tm < M)[:, None] & (tn < N)[None, :])
