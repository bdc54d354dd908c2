"""Whether a 64-stream decode step's MoE block gains from running its expert tiles as two sets on two streams, the
way the mixers' halves gained (lab/NOTES.md wave 45: two independent chains fill each other's kernel tails).

The mixers split by rows; the MoE cannot (each half would read most experts again), but its tiles split by expert
without any byte read twice: set A the tiles of experts below E / 2, set B the rest (the stacked shared expert
last, in B). Each set's gate/up then down run as a chain on a stream of its own, writing their rows of one hidden
buffer and one slot buffer (each tile's rows are its own MMA columns: the same bits), joined before the one combine.

Per MoE block at the 35B-A3B's shapes (256 experts + the stacked shared one, H 2048, I 512, top-8, 64 tokens, 8-row
tiles: the model's 64-stream launches, `wgmma_experts.wg_matmul_experts`), 40 blocks each with its own weights (so
the experts come from DRAM, as in a decode step), random weights and routing, one CUDA graph with PDL, us a block:
  joint       gate/up(all tiles) -> down(all tiles) -> combine: today's schedule
  serial      set A's chain, then set B's, one stream, then the combine
  forked      the two sets' chains on two streams, joined before the combine
  tile sets   the model's form (moe_block_mma(fork=)): the table's even and odd tiles as the two sets, each launch
              over the whole table (wg_matmul_experts(tile_set=)), forked as above
Checked first: every form's outputs == joint's, bit for bit (one block, eager).

  python lab/probe_moe_halves.py [--tokens 64] [--replays 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from sweep_common import same_bits, time_graph_median  # noqa: E402

BLOCKS = 40
E, H, INTER, TOP_K = 256, 2048, 512, 8


def q4_stack(experts: int, n: int, k: int, dev):
    """Random repacked q4 weights of `experts` stacked experts [N, K] (words and (s, b) in repack_q4's shapes):
    the kernels' timing and bits do not depend on what the codes mean."""
    words = torch.randint(-2**31, 2**31 - 1, (experts, n // 16, k // 64, 128), dtype=torch.int32, device=dev)
    s = torch.rand(experts, n // 16, k // 64, 8, 2, device=dev) * 0.004 + 0.001
    sb = torch.stack([s, -7.5 * s], dim=-1).bfloat16()
    return words, sb


class Block:
    def __init__(self, dev):
        self.gate, self.up = q4_stack(E + 1, INTER, H, dev), q4_stack(E + 1, INTER, H, dev)
        self.down = q4_stack(E + 1, H, INTER, dev)


def routing(tokens: int, dev, seed: int):
    """ids [T, k + 1] (k distinct routed experts, then the stacked shared one) and fp32 weights."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:TOP_K] for _ in range(tokens)]).sort(dim=1).values
    ids = torch.cat([ids, torch.full((tokens, 1), E)], dim=1).to(torch.int32).to(dev)
    weights = torch.rand(tokens, TOP_K + 1, generator=gen).to(dev)
    return ids, weights


def tile_sets(tiles):
    """(set A, set B): the tiles of experts below E / 2, and the rest (the shared expert's included), each an
    MmaTiles over the same sorted order (a host read: the probe's split, not a graph's)."""
    from deltaserve.kernels.moe.mma_experts import MmaTiles

    live = tiles.tile_e >= 0
    sets = []
    for mask in (live & (tiles.tile_e < E // 2), live & (tiles.tile_e >= E // 2)):
        idx = mask.nonzero().flatten()
        sets.append(MmaTiles(tiles.tile_e[idx].contiguous(), tiles.lo[idx].contiguous(), tiles.hi[idx].contiguous(),
                             tiles.order, tiles.rows))
    return sets


def chain(block: Block, x, xs, ids, weights, tiles, hid, part, tile_set=(0, 1)):
    """gate/up then down over `tiles` (those of tile_set, wg_matmul_experts'), into their rows of hid [T (k+1), I]
    and part [T (k+1), H]."""
    from deltaserve.kernels.moe.wgmma_experts import wg_matmul_experts, wg_moe_down_stages, wg_moe_stages

    slots = ids.shape[1]
    wg_matmul_experts(x, *block.gate, ids, tiles, slots, xs=xs, up=block.up, out=hid,
                      stages=wg_moe_stages(tiles.rows), tile_set=tile_set)
    wg_matmul_experts(hid, *block.down, ids, tiles, 1, scale=weights.reshape(-1), out=part,
                      stages=wg_moe_down_stages(tiles.rows), tile_set=tile_set)


def schedule(form, blocks, x, xs, ids, weights, tiles, sets, bufs, streams):
    from deltaserve.kernels.moe.triton_combine import combine_slots

    t, slots = ids.shape
    main = torch.cuda.current_stream()
    for block, (hid, part, out) in zip(blocks, bufs):
        if form == "joint":
            chain(block, x, xs, ids, weights, tiles, hid, part)
        elif form == "serial":
            for s in sets:
                chain(block, x, xs, ids, weights, s, hid, part)
        elif form == "tile sets":
            for stream, i in zip(streams, (0, 1)):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    chain(block, x, xs, ids, weights, tiles, hid, part, tile_set=(i, 2))
            for stream in streams:
                main.wait_stream(stream)
        else:
            for stream, s in zip(streams, sets):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    chain(block, x, xs, ids, weights, s, hid, part)
            for stream in streams:
                main.wait_stream(stream)
        combine_slots(part.view(t, slots, H), x, out=out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from deltaserve.kernels.moe.mma_experts import mma_expert_tiles
    from deltaserve.kernels.moe.wgmma_experts import wg_tile_rows
    from deltaserve.kernels.quant.triton_gemv import prep_x

    dev = torch.device("cuda")
    torch.manual_seed(0)
    t = args.tokens
    x = torch.randn(t, H, device=dev).bfloat16()
    xs = prep_x(x, 4, 64)[1]
    ids, weights = routing(t, dev, seed=1)
    tiles = mma_expert_tiles(ids, E + 1, wg_tile_rows(ids.numel()))
    sets = tile_sets(tiles)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    live = int((tiles.tile_e >= 0).sum())
    print(f"{torch.cuda.get_device_name()}; {t} tokens, {tiles.rows}-row tiles: {live} live "
          f"({sets[0].tile_e.numel()} in set A, {sets[1].tile_e.numel()} in set B)")

    def buffers():
        m = ids.numel()
        return (torch.full((m, INTER), float("nan"), device=dev, dtype=torch.bfloat16),
                torch.full((m, H), float("nan"), device=dev), torch.empty(t, H, device=dev, dtype=torch.bfloat16))

    check = Block(dev)
    want = buffers()
    schedule("joint", [check], x, xs, ids, weights, tiles, sets, [want], streams)
    bad = []
    for form in ("serial", "forked", "tile sets"):
        got = buffers()
        schedule(form, [check], x, xs, ids, weights, tiles, sets, [got], streams)
        torch.cuda.synchronize()
        for name, a, b in zip(("hidden", "slots", "output"), got, want):
            if not same_bits(a, b):
                bad.append(f"{form}: {name} differs from joint's")
    print("bits: " + ("; ".join(bad) if bad else "serial, forked and tile sets == joint (hidden, slots, output)"))
    del check

    blocks = [Block(dev) for _ in range(BLOCKS)]
    bufs = [buffers() for _ in range(BLOCKS)]
    def timed(form):
        return time_graph_median(lambda: schedule(form, blocks, x, xs, ids, weights, tiles, sets, bufs, streams),
                                 args.replays, args.repeats) * 1e3 / BLOCKS

    rows = [(form, timed(form)) for form in ("joint", "serial", "forked", "tile sets")]
    print("\n| form | us a block |\n|---|---|")
    for form, us in rows:
        print(f"| {form} | {us:.2f} ({(us / rows[0][1] - 1) * 100:+.1f}%) |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
