"""The tensor-core decode GEMV of the q4 g64 linears (a repack_q4 weight): which of its two kernels runs a launch.

Both give a row the same bits (rows are MMA columns; GPU tests: tests/gpu/test_wgmma_experts_gpu.py), so the choice
is by speed alone, per launch of at most mma_gemv.MAX_ROWS rows:
  mma_gemv.mma_gemv          mma.sync, the weight streamed through registers: every launch below wg_gemv_rows(K)
                             rows, every weight wgmma_gemv.wg_dense_fits refuses, every non-sm_90 device;
  wgmma_gemv.wg_gemv         warpgroup MMAs, x read once per 64 weight rows: from wg_gemv_rows(K) rows on sm_90.
The two kernels share Gluon helpers (wgmma_gemv imports mma_gemv's); this module sits above both, so neither
imports the other's entry point.
"""

from __future__ import annotations

import torch

from ..launch_table import value as launch_value
from .mma_gemv import GROUP, MAX_ROWS, ROW_BLOCK, mma_gemv, ring_max_blocks, row_launches
from .wgmma_gemv import wg_dense_fits, wg_gemv


def wg_gemv_rows(k: int = 0) -> int:
    """From how many rows of x (per launch of at most MAX_ROWS) a launch runs as wgmma_gemv.wg_gemv (launch_table
    "gemv_tc.wg_gemv_rows", by K): the same bits (GPU tests), for weights of N % 64 == 0 and K <= 4096 on sm_90
    (K = 4096, the out projections, with its K split over programs: wgmma_gemv.wg_gemv_ksplit; the others keep
    mma_gemv). H200 probe (graph timings, weights past the L2, lab/NOTES.md): the DeltaNet in_proj 12352 x 2048 at
    16 / 32 / 64 rows 11.5 / 20.8 / 35.3 us on mma_gemv against 14.1 / 15.1 / 25.7 on wg_gemv, the lm_head 157 /
    352 / 535 against 149 / 237 / 472; in the model, 64 streams tg64 @ d512 4,915 -> 5,100 tok/s. So from 17 rows
    (the 32- and 64-row graph buckets). For a weight of K >= 4096 (k, the out projections, their K split over
    programs; a K past 4096 reads the K=4096 value) 9: the 2048 x 4096 out projection at 8 / 16 / 32 / 64 rows 6.33
    / 10.31 / 11.33 / 16.54 us on mma_gemv, 6.62 / 7.85 / 7.76 / 13.78 on wg_gemv over eight programs (8 streams
    tg64 @ d512 2,368 / 2,374 -> 2,377 / 2,376 from 1 row: nothing to gain at 8)."""
    return launch_value("gemv_tc.wg_gemv_rows", K=min(k, 4096))


def wg_gemv_tile_rows(m: int, nb: int) -> int:
    """Rows of x per wg_gemv program for m rows and a weight of nb row blocks (never a row's bits): 64 for the
    lm_head's thousands of row blocks past 32 rows, 32 past 32 rows and for the lm_head below, else 16 (H200 probe
    at 32 / 64 rows: the in_proj 15.1 / 28.8 us with 16, 23.9 / 25.7 with 32, 32.4 / 36.4 with 64; the lm_head 270 /
    530, 237 / 472, 454 / 519; with x's group sums staged in shared memory the lm_head at 64 rows 392 with 32, 353
    with 64, which no longer spills)."""
    if nb >= ring_max_blocks():
        return 64 if m > 32 else 32
    return 32 if m > 32 else 16 if m > 8 else 8  # (8 rows and fewer: only under a lower _K4096 threshold)


def wg_gemv_stages() -> int:
    """Shared-memory slots per wg_gemv program (never a row's bits): launch_table "gemv_tc.wg_gemv_stages" (H200,
    64 streams, BN 32: 3 / 5 / 8 slots 5,100 / 5,087 / 5,044 tok/s)."""
    return launch_value("gemv_tc.wg_gemv_stages")


_HOPPER: dict = {}


def _hopper(device: torch.device) -> bool:
    """Whether the device runs warpgroup MMAs (sm_90), cached per device."""
    if device not in _HOPPER:
        _HOPPER[device] = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
    return _HOPPER[device]


def tc_gemv(x: torch.Tensor, words: torch.Tensor, sb: torch.Tensor, out: torch.Tensor | None = None,
            xs: torch.Tensor | None = None, conv: tuple | None = None) -> torch.Tensor:
    """y = x W^T for x [..., K] bf16 and a repack_q4 weight, [..., N] (out, xs and conv as mma_gemv's): launches of
    at most MAX_ROWS rows (a conv only within one), each through wg_gemv from wg_gemv_rows(K) rows where the device
    and the weight allow it, else mma_gemv; the same bits either way."""
    nb, g, _ = words.shape
    n, k = nb * ROW_BLOCK, g * GROUP
    if x.shape[-1] != k:
        raise ValueError(f"tc_gemv: input has {x.shape[-1]} features, the weight expects {k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m > MAX_ROWS:
        return row_launches(lambda rows, out, xs: tc_gemv(rows, words, sb, out=out, xs=xs), x2, n, out, xs, conv,
                            "tc_gemv").reshape(*lead, n)
    if m >= wg_gemv_rows(k) and x2.is_cuda and _hopper(x2.device) and wg_dense_fits(words):
        # the same bits through warpgroup MMAs (x read once per 64 weight rows), the conv in its epilogue (mma_gemv's
        # conv epilogue equals the GEMV followed by causal_conv, bit for bit; H200, 64 streams 5,174 -> 5,193 tok/s
        # against the conv's own launch, lab/NOTES.md)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = wg_gemv(x2, words, sb, xs=xs, out=out, tile_rows=wg_gemv_tile_rows(m, nb), stages=wg_gemv_stages(),
                    conv=conv)
        return y.reshape(*lead, n)
    return mma_gemv(x, words, sb, out=out, xs=xs, conv=conv)
