"""Where a prefill graph's wall time goes outside its kernels: `deltaserve bench`'s pp timing is load_batch + replay +
synchronize, against the graph profile's span (first kernel's start to last kernel's end). Times, per depth and per
load form (the engine's PrefillGraph.load_batch, and the form before it: host tensors copied one by one from pageable
memory, positions and slots derived by ~10 small device ops), the median over --reps of: load alone (synchronised),
replay alone (synchronised), load + replay (the bench's unit), the replay's CPU launch call, and the GPU time between
events recorded before and after the replay. Both forms load the same metadata: the probe checks the device buffers
are equal first, and the logits at depth 0 (past it each replay has advanced the sequence's DeltaNet state, which
the next one reads, so logits of successive replays differ whatever the load).

Usage (H200, repo root): python3 lab/probe_prefill_host.py [--n 512] [--depths 0,512] [--reps 20] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from deltaserve.bench.main import Streams
from deltaserve.bench.random_model import build_random_model
from deltaserve.engine.cuda_graph import PrefillGraph
from deltaserve.model import ModelConfig
from deltaserve.synthetic.presets import get_preset


def plain_load(g: PrefillGraph, offsets, rows, token_ids, depths, block_tables, state_slots) -> None:
    """The load before the staged one: four pageable copies, then positions and slots derived on the device (offsets,
    rows: the static [t] within-chunk offsets and sequence indices it kept)."""
    b = g.batch
    full = torch.full((b, g.block_tables.shape[1]), -1, dtype=torch.int32)
    for i, table in enumerate(block_tables):
        table = torch.as_tensor(table, dtype=torch.int32)
        full[i, : table.numel()] = table
    ids = torch.cat([torch.as_tensor(t, dtype=torch.int64).reshape(-1) for t in token_ids])
    g.input_ids.copy_(ids)
    g.block_tables.copy_(full)
    g.context_lens.copy_(torch.as_tensor(list(depths), dtype=torch.int64))
    g.state_slots.copy_(torch.as_tensor(list(state_slots), dtype=torch.int64))
    torch.add(offsets, g.context_lens[rows], out=g.positions)
    blk = g.block_tables.to(torch.int64)[rows, g.positions // g.block_size]
    g.slot_mapping.copy_(blk * g.block_size + g.positions % g.block_size)
    g.fb.context_lens_cpu = [int(d) for d in depths]


def median_us(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) * 1e6)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--depths", default="0,512")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    config = ModelConfig.from_dict(get_preset("qwen3.6-35b-a3b").config)
    model = build_random_model(config, "q4", "cuda")
    depths = [int(d) for d in args.depths.split(",")]
    streams = Streams(model, config, 1, max(depths) + args.n)
    g = PrefillGraph(model, streams.cache, args.n, streams.tables.shape[1])
    tables = streams.tables.tolist()
    ids = [torch.randint(0, config.vocab_size, (args.n,)).tolist()]
    offsets = torch.arange(args.n, device="cuda")
    seq_rows = torch.zeros(args.n, dtype=torch.int64, device="cuda")
    rows = []
    for depth in depths:
        loads = {"staged": lambda d=depth: g.load_batch(ids, [d], tables, [0]),
                 "plain": lambda d=depth: plain_load(g, offsets, seq_rows, ids, [d], tables, [0])}
        bufs = {}
        for name, load in loads.items():
            load()
            torch.cuda.synchronize()
            bufs[name] = [t.clone() for t in (g.input_ids, g.positions, g.slot_mapping, g.context_lens,
                                              g.state_slots, g.block_tables)]
            if g.graph is None:
                g.capture()
            bufs[name].append(g.replay().clone())
        same = all(torch.equal(a, b) for a, b in zip(bufs["staged"][:-1], bufs["plain"][:-1]))
        logits = torch.equal(bufs["staged"][-1], bufs["plain"][-1])
        print(f"depth {depth}: staged and plain loads' buffers equal: {same}; logits equal: {logits}"
              f"{'' if depth == 0 else ' (not comparable past depth 0: the state advanced)'}", flush=True)
        for name in ("staged", "plain", "staged"):  # staged twice: the drift between the first and the last
            load = loads[name]
            for _ in range(3):
                load(); g.replay()
            t_load = median_us(load, args.reps)
            t_replay = median_us(g.replay, args.reps)
            t_both = median_us(lambda: (load(), g.replay()), args.reps)
            # the same unit with a synchronize between (the copies done before the graph's launch), and the replay
            # right after an idle gap as long as the load's (is it the gap or the pending copy that costs?)
            t_both_sync = median_us(lambda: (load(), torch.cuda.synchronize(), g.replay()), args.reps)
            t_idle = median_us(lambda: (time.sleep(t_load * 1e-6), g.replay()), args.reps)
            launch, gpu = [], []
            for _ in range(args.reps):
                load()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                s = time.perf_counter()
                g.replay()
                launch.append((time.perf_counter() - s) * 1e6)
                e1.record()
                torch.cuda.synchronize()
                gpu.append(e0.elapsed_time(e1) * 1e3)
            row = dict(depth=depth, load=name, n=args.n, load_us=t_load, replay_us=t_replay, both_us=t_both,
                       both_sync_us=t_both_sync, idle_replay_us=t_idle,
                       launch_us=statistics.median(launch), gpu_us=statistics.median(gpu), same=same,
                       tok_s=args.n / t_both * 1e6)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| depth | load | load us | replay us | load+replay us | load, sync, replay us | sleep, replay us | "
          "launch call us | replay GPU us | tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['depth']} | {r['load']} | {r['load_us']:.1f} | {r['replay_us']:.1f} | {r['both_us']:.1f} | "
              f"{r['both_sync_us']:.1f} | {r['idle_replay_us']:.1f} | {r['launch_us']:.1f} | {r['gpu_us']:.1f} | "
              f"{r['tok_s']:,.0f} |")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
