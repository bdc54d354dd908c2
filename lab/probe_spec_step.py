"""Where a drafting step's time goes (engine/spec_graph.py), on the device machine, Qwen3.6-35B-A3B q4 shapes
(random weights): per batch, the replay times of the step's two captured parts (verify; accept = commit + the MTP
head's drafts), the accept part of a graph without the head (commit alone), the plain decode graph of the same
bucket, and an engine step's wall time while drafting (the host's share is the rest).

  PYTHONPATH=/tmp/site:$PWD python3 lab/probe_spec_step.py --k 3 --depth 512 --batch 1,8
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from deltaserve.bench import engine_bench as eb
from deltaserve.bench import profile as prof
from deltaserve.bench import spec_bench as sb
from deltaserve.bench.random_model import build_random_model
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.engine.spec_graph import SpecGraph
from deltaserve.model.config import ModelConfig
from deltaserve.synthetic.presets import get_preset


def replay_us(fn, reps: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def probe(model, batch: int, k: int, depth: int, profile_top: int = 0) -> dict:
    engine = sb.make_spec_engine(model, None, batch, sb.max_len(depth, 64), k)  # warm_up captures the graphs
    engine.spec.min_acceptance = 0.0  # (random drafts: keep drafting)
    rng = random.Random(batch)
    params = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0)
    for _ in range(batch):
        engine.add_request([rng.randrange(model.config.vocab_size) for _ in range(depth + 1)], params)
    eb.lay_down_depth(engine, depth)
    for _ in range(4):
        engine.step()
    graphs = engine.spec.graphs
    bucket = graphs.bucket(batch)
    g = next(v for (b, _), v in graphs.spec_graphs.items() if b == bucket)
    dg = graphs._graph(bucket, graphs.width(depth + 1))  # the plain decode graph of the bucket
    plain = SpecGraph(model, engine.cache, bucket, k, g.table_source, draft=False)
    graphs.load(plain, [], [], [], [], [], [], [])
    plain.capture(graphs._pool)
    out = {"verify_us": replay_us(g.graphs[0].replay), "accept_us": replay_us(g.graphs[1].replay),
           "commit_us": replay_us(plain.graphs[1].replay), "decode_us": replay_us(dg.graph.replay)}
    if profile_top:  # where each part's time goes, kernel by kernel (in-graph and critical time)
        for name, replay in (("verify", g.graphs[0].replay), ("accept", g.graphs[1].replay),
                             ("decode", dg.graph.replay)):
            header = f"# {name} graph profile (batch {batch}, k {k}, depth {depth}, 5 replays)"
            out[f"profile_{name}"] = prof._graph_report(prof._replayed_kernels(replay, 2, 5), 5, header, "a step",
                                                        profile_top)
    before = (engine.spec.graph_steps, engine.spec.eager_steps, engine.runner.graph_steps)
    steps, t0 = 0, time.perf_counter()
    while engine.has_unfinished() and steps < 20:
        engine.step()
        steps += 1
    torch.cuda.synchronize()
    out["step_us"] = (time.perf_counter() - t0) / steps * 1e6
    after = (engine.spec.graph_steps, engine.spec.eager_steps, engine.runner.graph_steps)
    out["steps"] = (f"{steps} steps: {after[0] - before[0]} drafting through graphs, {after[1] - before[1]} eager, "
                    f"{after[2] - before[2]} plain decode graphs; plan {engine.plan.describe()}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", default="3", help="drafts a step, or a list: 1,2,3")
    p.add_argument("--depth", type=int, default=512)
    p.add_argument("--batch", default="1")
    p.add_argument("--profile", type=int, default=0, help="also profile each part's graph: its top N kernels")
    args = p.parse_args()
    config = ModelConfig.from_dict(get_preset("qwen3.6-35b-a3b").config)
    model = build_random_model(config, "q4", "cuda", mtp_layers=config.mtp_num_hidden_layers)
    print(f"{torch.cuda.get_device_name()}, depth {args.depth}")
    print("| B | k | verify us | accept us (commit + head) | commit us | decode step us | engine step us |")
    print("|---|---|---|---|---|---|---|")
    profiles = []
    for batch, k in ((int(b), int(k)) for b in args.batch.split(",") for k in args.k.split(",")):
        r = probe(model, batch, k, args.depth, args.profile)
        profiles += [v for key, v in r.items() if key.startswith("profile_")]
        print(f"| {batch} | {k} | {r['verify_us']:.0f} | {r['accept_us']:.0f} | {r['commit_us']:.0f} | {r['decode_us']:.0f} "
              f"| {r['step_us']:.0f} ({r['steps']}) |", flush=True)
    for text in profiles:
        print(text)


if __name__ == "__main__":
    main()
