"""An MoE block on tensor cores for any number of tokens (decode steps of 1-64 streams, prefill chunks) in three
launches after the routing: gate and up with SiLU * up as one launch, down with each slot's routing weight as one
launch, then the one combine of the prefill path (`triton_combine.combine_slots`). Gate/up and down go through
`mma_experts.mma_matmul_experts` (mma.sync), or from `wgmma_experts.wg_min_rows()` rows (prefill chunks,
decodes of 16+ streams) through `wgmma_experts.wg_matmul_experts` (warpgroup MMAs, the same bits): each (token,
slot) row is an MMA column of its expert's tile, so an expert picked by several rows of a tile is read once, and a
row's bits never depend on which rows share the launch or which of the two kernels ran it.

At decode-sized batches (single-row tiles) the combine runs inside the down launch, at each token's last-arriving
program (the same arithmetic and bits as the combine launch), and down makes its input's group sums itself: the
block is router, gate/up, down, as on the CUDA-core path.

Why: the CUDA-core decode MoE (triton_moe_gemv.py) spends an FMA per code and row, and at 64 streams the block is
~17 ms of a ~40 ms step (lab/NOTES.md); on tensor cores the cost per code does not grow with the rows sharing an
expert. The weights are the repacked layout (`repack_q4_experts`), which a model would hold instead of the MLX one.

The shared expert: when its width equals the routed experts' (Qwen3.6-35B-A3B: 512 and 512) it is stacked as one
more expert, the last, and every token's slot k picks it with the shared gate's sigmoid as its routing weight, so it
costs no launch of its own; otherwise it runs as a one-expert stack (two launches more).

Arithmetic, per token: the k picks in the routing contract's order, then the shared expert; slot s contributes
w_s * bf16(W_down h_s) in fp32 with h_s = bf16(bf16(SiLU(bf16 g)) * bf16 u); the slots are summed in order and
rounded once, + residual rounded once (combine_slots). A token's bits depend on its own x and routing only (GPU
test: alone == among 63 others).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..quant.mma_gemv import GROUP, ROW_BLOCK, default_warps, repack_q4
from ..triton_sync import MIN_COUNTERS
from .mma_experts import default_ahead, default_row_blocks, mma_expert_tiles, mma_matmul_experts, repack_q4_experts
from .triton_combine import combine_slots
from .triton_moe_gemv import down_early
from .wgmma_experts import wg_fits, wg_matmul_experts, wg_min_rows, wg_moe_down_stages, wg_moe_stages, wg_tile_rows


class MmaExperts(NamedTuple):
    """Repacked weights of one MoE block, each (words, sb): gate/up [E', I/16, H/64, ...], down [E', H/16, I/64,
    ...]. shared_last: expert E' - 1 is the shared expert (slot k of every token). shared: (gate, up, down) of a
    shared expert of another width, each a one-expert stack; None without one (or when stacked). Gate and up are
    two stacks run by one gated launch (one stack of 2 I rows a plain launch made h at its row-block pairs' second
    arrival: slower at every token count on the H200, B=1 596 -> 579 tok/s, pp512 18,816 -> 14,470; lab/NOTES.md)."""

    gate: tuple
    up: tuple
    down: tuple
    shared_last: bool = False
    shared: tuple | None = None

    @property
    def num_experts(self) -> int:
        return self.gate[0].shape[0]


def pack_mma_experts(gate, up, down, shared_gate=None, shared_up=None, shared_down=None) -> MmaExperts:
    """MmaExperts from MLX q4 g64 weights (objects with .w, .scales, .biases: stacked [E, N, ...] for the routed
    experts, [N, ...] for the shared one). The shared expert is stacked last when its width equals the routed
    experts' (one copy either way: the stack is built from the repacked parts)."""
    parts = [repack_q4_experts(s.w, s.scales, s.biases) for s in (gate, up, down)]
    shared_last, shared = False, None
    if shared_gate is not None:
        sh = [repack_q4(s.w, s.scales, s.biases) for s in (shared_gate, shared_up, shared_down)]
        if all(p[0].shape[1:] == s[0].shape for p, s in zip(parts, sh)):
            parts = [tuple(torch.cat([pt, st[None]]) for pt, st in zip(p, s)) for p, s in zip(parts, sh)]
            shared_last = True
        else:
            shared = tuple(tuple(t[None] for t in s) for s in sh)
    return MmaExperts(*parts, shared_last=shared_last, shared=shared)


def _down_early_fits(m: int, k: int) -> bool:
    """Whether down's default launch at m rows and K = k is the register ring that its early form needs."""
    chunks = k // GROUP // default_warps(k)
    return 3 <= default_ahead(m, False, chunks) < chunks


def wg_block_tile_rows(experts: MmaExperts, rows: int) -> int | None:
    """The rows per tile of moe_block_mma's warpgroup-MMA launches for a block of `rows` (token, slot) rows, or None
    where the block takes the mma.sync kernel (fewer than wg_min_rows rows, or a stack the kernel does not fit). The router can then build the block's tiles (moe_route(tile_rows=))."""
    if rows >= wg_min_rows() and wg_fits(experts.gate[0], experts.down[0]):
        return wg_tile_rows(rows)
    return None


def moe_block_mma(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, shared_weight: torch.Tensor | None,
                  experts: MmaExperts, residual: torch.Tensor | None = None, xs: torch.Tensor | None = None,
                  tile_rows: int | None = None, shared_slotted: bool = False, tiles=None,
                  fork=None) -> torch.Tensor:
    """x [T, H] bf16; ids / weights [T, k] (the routing contract: int32 expert ids, fp32 weights); shared_weight
    [T] fp32 (sigmoid of the shared gate) when the block has a shared expert. shared_slotted: ids / weights are
    [T, k + 1] with the stacked shared expert already in the last slot (moe_route(shared_slot=E' - 1): no launches
    to append it). xs: x's group sums (prep_x's, or the norm's prep: the same bits) if the caller has them.
    tile_rows: rows per expert tile (mma_expert_tiles; never a row's bits). tiles: the warpgroup-MMA launches' tiles
    of these ids when the caller has them (moe_route(tile_rows=wg_block_tile_rows(...))). fork: for the
    warpgroup-MMA launches, a caller's fork(fns) that runs the callables (each on a stream of its own; the kernels
    know no streams) and joins them before it returns: the table's tiles then run as two sets (even and odd
    tiles), each set's gate/up then down a chain of its own writing its rows of one hidden and one slot buffer
    (wg_matmul_experts(tile_set=)), so the two chains fill each other's kernel tails; every row is its own MMA
    column, so the bits of the joint launches. Returns [T, H] bf16 (+ residual)."""
    if x.device.type != "cuda":
        raise RuntimeError("moe_block_mma: the tensor-core MoE needs a CUDA device (its kernels are Gluon)")
    from ..quant.triton_gemv import prep_x

    t = ids.shape[0]
    has_shared = experts.shared_last or experts.shared is not None
    if has_shared and shared_weight is None:
        raise ValueError("moe_block_mma: the block has a shared expert but no shared_weight was given")
    num_e = experts.num_experts
    ids = ids.to(torch.int32)
    weights = weights.to(torch.float32)
    if shared_slotted:
        if not experts.shared_last or ids.shape[1] < 2 or weights.shape != ids.shape:
            raise ValueError(f"moe_block_mma: shared_slotted routing needs experts with the shared expert stacked last "
                             f"and ids / weights of k + 1 slots, found {tuple(ids.shape)} / {tuple(weights.shape)}")
    elif experts.shared_last:
        ids = torch.cat([ids, ids.new_full((t, 1), num_e - 1)], dim=1)
        weights = torch.cat([weights, shared_weight.to(torch.float32)[:, None]], dim=1)
    slots = ids.shape[1]
    xs = prep_x(x, 4, 64)[1] if xs is None else xs  # x's group sums: shared by every gate and up row
    # large blocks (prefill chunks): gate/up and down on warpgroup MMAs over their own tiles (tile_rows unused),
    # the mma.sync kernel's bits
    wg_rows = wg_block_tile_rows(experts, ids.numel())
    if wg_rows is not None:
        if tiles is None:
            tiles = mma_expert_tiles(ids, num_e, wg_rows)
        elif tiles.order is None or tiles.order.numel() != ids.numel() or tiles.rows != wg_rows:
            raise ValueError(f"moe_block_mma: the tiles given are for another block (rows per tile {tiles.rows}, "
                             f"expected {wg_rows} for {ids.numel()} rows)")
        hid = x.new_empty(ids.numel(), experts.gate[0].shape[1] * ROW_BLOCK)  # [T (k + 1), I]
        part = torch.empty(ids.numel(), experts.down[0].shape[1] * ROW_BLOCK, dtype=torch.float32,
                           device=x.device)  # [T (k + 1), H]

        def chain(tile_set):  # gate/up then down over the tiles of tile_set, into their rows of hid and part
            wg_matmul_experts(x, *experts.gate, ids, tiles, slots, xs=xs, up=experts.up, out=hid,
                              stages=wg_moe_stages(tiles.rows), tile_set=tile_set)
            wg_matmul_experts(hid, *experts.down, ids, tiles, 1, scale=weights.reshape(-1), out=part,
                              stages=wg_moe_down_stages(tiles.rows), tile_set=tile_set)

        if fork is None:
            chain((0, 1))
        else:
            fork([lambda: chain((0, 2)), lambda: chain((1, 2))])
        return _with_shared(part.view(t, slots, -1), x, xs, shared_weight, experts, residual)
    tiles = mma_expert_tiles(ids, num_e, tile_rows)  # the mma.sync kernel's own (single-row at decode sizes)
    # down: hid's group sums are the kernel's own (no prep launch); with single-row tiles (decode-sized batches)
    # the combine runs at each token's last-arriving down program (no launch either; the same bits as the launch)
    nbe, groups = experts.down[0].shape[1:3]
    columns = nbe // default_row_blocks(nbe, ids.numel(), groups * GROUP)  # the down launch's programs per row
    single = experts.shared is None and tiles.rows == 1 and t * columns <= MIN_COUNTERS  # counters exist already
    # down's early form (the ids and its weights read before its wait) right after the gated launch only
    early = single and _down_early_fits(ids.numel(), groups * GROUP) and down_early(x, tensor_cores=True)
    hid = mma_matmul_experts(x, *experts.gate, ids, slots, xs=xs, tiles=tiles, up=experts.up, open_late=early)
    if single:
        return mma_matmul_experts(hid, *experts.down, ids, 1, tiles=tiles, scale=weights.reshape(-1),
                                  combine=(residual, torch.empty_like(x)), early=early)
    part = mma_matmul_experts(hid, *experts.down, ids, 1, tiles=tiles, scale=weights.reshape(-1)).view(t, slots, -1)
    return _with_shared(part, x, xs, shared_weight, experts, residual)


def _with_shared(part: torch.Tensor, x: torch.Tensor, xs: torch.Tensor, shared_weight: torch.Tensor | None,
                 experts: MmaExperts, residual: torch.Tensor | None) -> torch.Tensor:
    """The block's output from its slots' parts [T, S, H] (fp32): the shared expert's part appended when it is not
    stacked (a one-expert stack, two launches), then the combine (+ residual)."""
    t = part.shape[0]
    if experts.shared is not None:
        sg, su, sd = experts.shared
        zero = torch.zeros(t, dtype=torch.int32, device=x.device)
        one = mma_expert_tiles(zero, 1, 1)
        hs = mma_matmul_experts(x, *sg, zero, 1, xs=xs, tiles=one, up=su)
        ps = mma_matmul_experts(hs, *sd, zero, 1, tiles=one, scale=shared_weight.to(torch.float32).contiguous())
        part = torch.cat([part, ps.view(t, 1, x.shape[1])], dim=1)
    return combine_slots(part, residual, out=torch.empty_like(x))
