"""The MoE's experts matmul on warpgroup MMAs (wgmma), `wg_matmul_experts`, with the bits of the mma.sync experts
kernel (`mma_experts.mma_matmul_experts`): the MoE block (`mma_moe.moe_block_mma`) takes it from `wg_min_rows()`
rows (prefill chunks, decodes of 16+ streams) for its gate/up and its down.

Why: at a 512-token prefill `moe/mma_experts._mma_experts_kernel` (mma.sync, 16 weight rows x 8 sorted rows of x a
program) takes ~60% of the prefill; each program dequantises its 16 rows for 8 rows of x and re-reads 32 KB of x
from L2, and ncu found it bound by its programs' latency and issue (lab/NOTES.md). Here a program owns 64 weight
rows (four row blocks of 16, one per warp of the warpgroup) against BN sorted rows of one expert (a tile of
`mma_expert_tiles(rows=BN)`), so a weight word is dequantised once for up to BN rows of x and x is read once per
64 weight rows.

Tiles and sets: BN is wg_tile_rows(m) (8, 16 or 32 by the block's rows); the grid is (tiles, N / (64 row sets)):
tile t is the sorted rows [lo, hi) of expert tile_e[t] (expert -1, the table's unused tail, does no work). Gate/up
is one launch (SiLU * up in the epilogue), down one with each slot's routing weight (fp32 out), its programs taking
two row sets of 64 weight rows (wg_row_sets: x read once per 128). tile_set=(i, n) splits the table's tiles over n
launches that make the joint launch's output between them, bit for bit (moe_block_mma(fork=): two streams).

Why it shares a program: the launch is `quant/wgmma_gemv._wg_program` over the tile table, the program the dense
GEMV (wgmma_gemv.wg_gemv) runs with one weight and no table, so the bit contract (the mma.sync kernels' FMAs of a
group and cross-warp adds; wgmma_gemv's docstring), the copy pipeline and every setting that never changes a bit
are one code, tested against mma.sync for both. The program stays in quant/ with the dense launch (quant/ may not
import moe/); a @gluon.jit kernel resolves what it calls among its own module's globals, so the Gluon functions it
calls are imported here by name. The launch settings both launches share (wg_maxnreg, wg_step_groups, _step_args,
_order_args and the knobs they read) are wgmma_gemv's globals: patch them there (their tuned constants are
launch_table entries: launch_table.override).
"""

from __future__ import annotations

import torch

from ...utils import tuning
from .. import backend
from ..launch_table import value as launch_value
from ..quant.mma_gemv import GROUP, HAVE_GLUON
from .mma_experts import MmaTiles, experts_operands
from ..quant.wgmma_gemv import _at_rows, _order_args, _step_args, _wg_slots, wg_maxnreg, wg_step_groups
from ..triton_pdl import pdl_args


def wg_min_rows() -> int:
    """From how many rows (tokens x slots) an MoE block's gate/up and down take this kernel instead of the mma.sync
    one (the same bits, so the choice may follow the size). H200, 35B-A3B q4, eager (lab/NOTES.md), both kernels
    skipping the tile table's unused tail tiles: at 512 tokens (4,608 rows) gated 267 -> 250 us, down 155 -> 123
    with 16-row tiles and 3 slots (pp512 B=1 19,176 -> 20,024 tok/s); at 4,096 tokens 1,524 -> 1,271 and 854 ->
    729; at 64 tokens (a 64-stream decode, 576 rows; before the skip) 151 -> 175 and 111 -> 108, and in the model
    tg64 @ d512 at 64 streams (8-row tiles) 4,852 -> 4,913 tok/s with it from 512 rows. Later, H100, tg64 @ d512 in
    one call (wave 46), mma.sync -> this kernel joint -> as two tile sets on two streams (fast.moe_fork): 32 streams
    3,586 -> 3,861 -> 3,928 tok/s, 16 streams 2,678 -> 2,764 -> 2,859, 8 streams 2,154 -> 2,109 -> 2,046, batch 1
    639 -> 421; so 144 (16 tokens) is the default: decodes of 16+ streams and prefill chunks of 16+ tokens take it,
    8 streams and fewer keep mma.sync (launch_table "moe_wgmma.min_rows")."""
    return launch_value("moe_wgmma.min_rows")


def wg_moe_stages(tile_rows: int) -> int:
    """Shared-memory slots of the MoE block's launches of this kernel with tiles of tile_rows rows of x (never a bit):
    launch_table "moe_wgmma.stages", (tile rows up to, slots) entries: 5 for 8-row tiles (a 64-stream decode), else
    "gemv_wgmma.stages". At 64 streams ncu found the gated form moving 2.9 TB/s from DRAM with two groups in flight a
    program, 4 programs an SM; H200, tg64 @ d512 in one call (lab/NOTES.md): 3 slots 5,174 / 5,172, 5 slots 5,190, 8
    slots 4,965 tok/s; with wg_gemv's conv in its epilogue 5,171 -> 5,210. Slots of one group: with two groups a step
    (wg_step_groups) the kernel keeps the same groups in flight in fewer, wider slots (_wg_slots: 5 -> 3); there, in one
    call, 3 / 5 / 7 such slots gave 5,506 / 5,778 / 5,721 tok/s."""
    ns = _at_rows(launch_value("moe_wgmma.stages"), tile_rows)
    return launch_value("gemv_wgmma.stages") if ns is None else ns


def wg_moe_down_stages(tile_rows: int) -> int:
    """Shared-memory slots (of one group) of the MoE block's down launch with tiles of tile_rows rows (never a bit):
    wg_moe_stages'. Down's K is
    the experts' width (512 at 35B-A3B: 8 groups), so a program's copies are in flight for a short time; ncu at 64
    streams (lab/NOTES.md): down 53.2 us at 55% of DRAM's throughput, the gated launch 77.5 at 73%. More slots
    for down were slower, in one call at 64 streams: 5 (the gated launch's) 5,914, 7 5,847, 9 (all of K in
    flight) 5,587 / 5,587 tok/s."""
    return wg_moe_stages(tile_rows)


def wg_tile_rows(m: int) -> int:
    """Sorted rows of x per program for a block of m rows (launch_table): 32 from "moe_wgmma.widest_rows" rows,
    "moe_wgmma.tile_rows" from "moe_wgmma.wide_rows", else 8 (a few rows per expert: H200 probe at 64 tokens, before the
    tail-tile skip, gated 139.5 us with 8-row tiles against 174.5 with 16 and 150.7 on mma.sync; down 94.2 / 108.2 /
    110.8). At the current launch defaults (CUDA-graph probe, lab/NOTES.md), gated / down: 512 tokens (4,608 rows, ~16 a
    routed expert) 8 rows 200.7 / 117.0 us, 16 161.3 / 103.1, 32 185.8 / 108.8; 4,096 tokens (36,864 rows, ~128 an
    expert) 1,273.6 / 765.7, 912.2 / 600.3, 810.2 / 514.9; 16 against 32 rows at 1,024 tokens (9,216 rows) 273.3 / 172.1
    against 269.4 / 163.4, at 2,048 481.4 / 310.7 against 447.3 / 276.6; in the model 8 prompts of 512 (36,864 rows a
    forward) 36,259 -> 38,893 tok/s, 64 prompts 34,961 -> 38,087. Never a row's bits."""
    if m >= launch_value("moe_wgmma.widest_rows"):
        return 32
    return launch_value("moe_wgmma.tile_rows") if m >= launch_value("moe_wgmma.wide_rows") else 8


def wg_split_wait() -> bool:
    """Whether the gated launch's step waits for gate's MMAs alone first and makes gate's FMAs while up's MMAs run,
    then waits for up's (instead of one wait for both): the same FMAs in the same order, so never a bit. An
    experiment (utils/tuning.py DELTASERVE_WGMMA_SPLIT_WAIT, off): the gated launch at 512 tokens 149.1 -> 147.7 us
    in a probe (lab/NOTES.md), not yet measured in the model."""
    return tuning.get("DELTASERVE_WGMMA_SPLIT_WAIT")


def wg_row_sets(tile_rows: int) -> int:
    """Row sets of 64 weight rows a program of the kernel's one-weight launches (the MoE's down) takes for tiles of
    tile_rows rows of x (never a bit: each set's MMAs and FMAs are a program's own, side by side against one copy of
    x): 1 or 2. At 2 a program reads x once per 128 weight rows instead of 64, and its tile lookup, x copies and
    barriers serve both sets (sm_90: 116 registers against 79 at 16-row tiles). A prefill's down at 512 tokens
    (Nsight Compute, lab/NOTES.md) had 16 KB of weights a program beside 16 KB of x, 13,312 programs of 8 groups.
    H200, CUDA-graph probe: down at 512 tokens 111.1 -> 100.2 us, at 4,096 682.5 -> 599.2, at a 64-stream decode's
    8-row tiles 58.8 -> 48.3 (two groups a step) / 54.1 -> 45.5 (one); pp512 B=1 with gated GS 2 24,132 / 24,158 ->
    24,110 / 24,529 tok/s, 8 prompts 34,885 -> 36,211; 64 streams tg64 @ d512 5,854 / 5,854 -> 5,984 / 5,983 (one
    group a step: 6,018 / 6,017, the default with it, wg_step_groups); weights of N % 128 != 0 take 1. launch_table
    "moe_wgmma.down_row_sets"."""
    return launch_value("moe_wgmma.down_row_sets")


def wg_fits(gate_words: torch.Tensor, down_words: torch.Tensor) -> bool:
    """Whether an MoE block's repacked gate [E, I/16, H/64, 128] and down [E, H/16, I/64, 128] stacks suit this
    kernel: both widths multiples of 64 (four row blocks of 16 a program), and K split over at most 4 warps in the
    mma.sync kernel whose bits it gives (K < 4096)."""
    from ..quant.mma_gemv import default_warps

    return all(w.shape[1] % 4 == 0 and default_warps(w.shape[2] * GROUP) <= 4 for w in (gate_words, down_words))


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    # the shared program and the PDL open: a @gluon.jit kernel resolves what it calls among its module's globals
    from ..quant.mma_gemv import pdl_open
    from ..quant.wgmma_gemv import _wg_program

    @gluon.jit
    def _wg_experts_kernel(xq_ptr, xs_ptr, w_ptr, w2_ptr, sbq_ptr, sb2q_ptr, out_ptr, scale_ptr, tile_e_ptr, lo_ptr,
                           hi_ptr, order_ptr, stride_xq, stride_sm, stride_om, NBE, M, XREP: gl.constexpr,
                           K: gl.constexpr, W: gl.constexpr, BN: gl.constexpr, GATED: gl.constexpr,
                           SCALED: gl.constexpr, SELF_XS: gl.constexpr, NS: gl.constexpr = 3,
                           PARTIAL_MAJOR: gl.constexpr = False, PDL: gl.constexpr = False,
                           XS_SMEM: gl.constexpr = False, SLOT_CARRY: gl.constexpr = False, GS: gl.constexpr = 1,
                           PAIRED: gl.constexpr = False, FOLD_PAIR: gl.constexpr = False,
                           SPLIT_WAIT: gl.constexpr = False, TSTEP: gl.constexpr = 1,
                           TILE0: gl.constexpr = 0):
        """The experts matmul (wg_matmul_experts): _wg_program over the sorted tile table (every TSTEP-th tile
        from TILE0)."""
        pdl_open(PDL)
        _wg_program(xq_ptr, xs_ptr, w_ptr, w2_ptr, sbq_ptr, sb2q_ptr, out_ptr, scale_ptr, tile_e_ptr, lo_ptr, hi_ptr,
                    order_ptr, stride_xq, stride_sm, stride_om, NBE, M, XREP, K, W, BN, GATED, SCALED, SELF_XS, NS,
                    PARTIAL_MAJOR, False, PDL, XS_SMEM=XS_SMEM, SLOT_CARRY=SLOT_CARRY, GS=GS, PAIRED=PAIRED,
                    FOLD_PAIR=FOLD_PAIR, SPLIT_WAIT=SPLIT_WAIT, TSTEP=TSTEP, TILE0=TILE0)


def wg_matmul_experts(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, expert_ids: torch.Tensor,
                      tiles: MmaTiles, x_repeat: int = 1, xs: torch.Tensor | None = None,
                      up: tuple | None = None, scale: torch.Tensor | None = None, warps: int | None = None,
                      out: torch.Tensor | None = None, stages: int | None = None,
                      partial_major: bool | None = None, xs_smem: bool | None = None,
                      row_sets: int | None = None, fold: bool | None = None,
                      tile_set: tuple[int, int] = (0, 1)) -> torch.Tensor:
    """mma_experts.mma_matmul_experts' result (the same bits) through warpgroup MMAs, for sorted tiles of 8 to 64 rows
    (tiles.rows is the MMA's N): row m = x[m // x_repeat] W[expert_ids[m]]^T for repacked stacked experts (N a
    multiple of 64); up= the gated epilogue (x's group sums xs= required, as the model's norm makes them), scale=
    the scaled one (fp32 out); xs None: the group sums are the kernel's own, MMA(ones, x), as mma.sync's.
    warps: the mma.sync kernel's K split whose bits to give (default_warps(K)); stages: shared-memory slots (2+;
    None: launch_table "gemv_wgmma.stages");
    partial_major: the groups partial sum by partial sum (None: wg_partial_major()); xs_smem: x's given group sums
    staged in shared memory (None: wg_xs_smem()); row_sets: 64-row sets a program of a one-weight launch, 1 or 2
    (None: wg_row_sets(tiles.rows) where N is a multiple of 128, else 1; 2 given needs it); fold: partial sums 0 and
    2 added as soon as both are complete (None: wg_fold_pair()); none of them changes bits.
    tile_set (i, n): this launch takes the table's tiles i, i + n, i + 2n, ... only, writing only their rows of out
    (given, shared by the n launches: out= required when n > 1), so the n launches of i = 0 .. n - 1 make the
    one launch's out between them, bit for bit, and may run at once on n streams (moe_block_mma(fork=))."""
    from ..quant.mma_gemv import default_warps

    if not HAVE_GLUON or backend.interpreting() or x.device.type != "cuda":
        raise RuntimeError("wg_matmul_experts: needs a CUDA device (sm_90) and Triton's Gluon")
    nbe, g = words.shape[1:3]
    k = g * GROUP
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or x.stride(0) % 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"wg_matmul_experts: x must be bf16 [rows, {k}] with unit column stride and an even row "
                         f"stride, found {x.dtype} {tuple(x.shape)} strides {x.stride()}")
    if nbe % 4:
        raise ValueError(f"wg_matmul_experts: the weight's {nbe} row blocks of 16 must come in fours (64 rows a "
                         f"program)")
    if tiles.rows not in (8, 16, 32, 64):
        raise ValueError(f"wg_matmul_experts: sorted tiles of 8 - 64 rows, found {tiles.rows}")
    m = expert_ids.numel()
    if m != x.shape[0] * x_repeat:
        raise ValueError(f"wg_matmul_experts: {m} expert ids for {x.shape[0]} rows x {x_repeat} repeats")
    if up is not None and (scale is not None or xs is None):
        raise ValueError("wg_matmul_experts: up= (the gated epilogue) takes x's group sums (xs=) and no scale=")
    warps = warps or default_warps(k)
    stages = launch_value("gemv_wgmma.stages") if stages is None else stages
    if warps not in (1, 2, 4) or g % warps:  # _wg_sum's orders
        raise ValueError(f"wg_matmul_experts: W={warps} must be 1, 2 or 4 and divide the {g} groups")
    if stages < 2:
        raise ValueError(f"wg_matmul_experts: {stages} shared-memory slots; at least 2")
    gs = wg_step_groups(tiles.rows, g, warps, down=up is None)
    sets = row_sets
    if sets is None:  # the switch's sets for a one-weight launch whose weight has them (N a multiple of 128)
        sets = 1 if up is not None or nbe % 8 else wg_row_sets(tiles.rows)
    if sets not in (1, 2) or nbe % (4 * sets) or (up is not None and sets != 1):
        raise ValueError(f"wg_matmul_experts: {sets} row sets of 64 a program for a weight of {nbe} row blocks of 16 "
                         f"(1, or 2 with the row blocks a multiple of 8; gated launches 1)")
    stages = _wg_slots(stages, g, gs)  # the prologue requests NS - 1 steps: at most all of them (never a bit)
    first, step = tile_set
    if not 0 <= first < step or (step > 1 and out is None):
        raise ValueError(f"wg_matmul_experts: tile_set (i, n) needs 0 <= i < n and, for n > 1, out= (the n launches' "
                         f"shared output), found {tile_set} with out {'given' if out is not None else 'None'}")
    self_xs = xs is None
    out = experts_operands(x, words, sb, up, scale, xs, m, out, "wg_matmul_experts")
    if m:
        w2, sb2 = up if up is not None else (words, sb)
        w2, sb2 = w2.view(torch.int32), sb2.view(torch.int32)
        if sets == 2:  # the second row set: the same stack seen from 4 row blocks on (128 words and 16 (s, b)
            # pairs a row block's group; the kernel's own offsets from there)
            w2, sb2 = w2.view(-1)[4 * g * 128:], sb2.view(-1)[4 * g * 16:]
        xq = x.view(torch.int32)  # bf16 pairs: the kernel copies x 4 bytes at a time, in the fragment order
        programs = -(-(tiles.tile_e.numel() - first) // step)  # tile first + i step < the table's length
        _wg_experts_kernel[(programs, nbe // (4 * sets))](
            xq, xq if self_xs else xs, words, w2, sb.view(torch.int32), sb2, out,
            scale if scale is not None else out, tiles.tile_e, tiles.lo, tiles.hi, tiles.order, xq.stride(0),
            0 if self_xs else xs.stride(0), out.stride(0), nbe, 0, XREP=x_repeat, K=k, W=warps, BN=tiles.rows,
            GATED=up is not None, SCALED=scale is not None, SELF_XS=self_xs, NS=stages, num_warps=4,
            **_step_args(self_xs, xs_smem, gs), **({"PAIRED": True} if sets == 2 else {}),
            **_order_args(warps, partial_major, fold),
            **({"SPLIT_WAIT": True} if up is not None and wg_split_wait() else {}), **wg_maxnreg(tiles.rows),
            **({"TSTEP": step, "TILE0": first} if step > 1 else {}), **pdl_args(x))
    return out
