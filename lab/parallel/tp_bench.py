"""tg N at B streams and pp N, one rank's shard of a random-weight preset per GPU, over NCCL (README.md).

    torchrun --standalone --nproc-per-node 2 lab/parallel/tp_bench.py --preset qwen3.6-35b-a3b --quant q4

Every rank builds its shard of the preset in the real in-memory layout (deltaserve.bench.random_model's values;
each parameter seeded by its name, so the replicated ones - routers, norms - agree across ranks), then runs the
benchmark's own decode (a captured CUDA graph feeding its argmax back: the NCCL all-gathers are inside the graph)
and prefill (one eager forward, or the prefill graph at B = 1) at depth 0. Rank 0 prints one JSON line per test."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import zlib

import torch
import torch.distributed as dist
from torch import nn


def random_rank_model(config, quant: str, parallel, device=None):
    from deltaserve.bench.random_model import _random_param, quant_scheme
    from deltaserve.model.layers import DenseWeights
    from deltaserve.model.qwen3_5 import Qwen3_5ForCausalLM
    from deltaserve.model.tp_layout import TPLayout
    from deltaserve.quant.affine import AffineWeights
    from deltaserve.weights.shard import ShardedWeights

    factory = DenseWeights() if quant == "bf16" else AffineWeights(
        quant_scheme(config, {"q4": 4, "q8": 8}[quant]), model_type=config.model_type)
    local = config
    if parallel.size > 1:
        layout = TPLayout(config, parallel.rank, parallel.size, parallel.expert_parallel)
        factory, local = ShardedWeights(factory, layout), layout.local_config()
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(local, factory, 1.0, parallel=parallel)
    dev = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    gen = torch.Generator(device=dev)
    for mod_name, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            full = f"{mod_name}.{name}"
            gen.manual_seed(zlib.crc32(full.encode()))
            value = _random_param(full, module, name, param, dev, torch.bfloat16, gen)
            setattr(module, name, nn.Parameter(value, requires_grad=False))
    model.fuse_projections()
    return model.eval()


def main() -> int:
    from deltaserve.bench.main import Streams, bench_decode, bench_prefill
    from deltaserve.model import ModelConfig, fast
    from deltaserve.model.plan import resolve_plan
    from deltaserve.model.parallel import SINGLE
    from deltaserve.synthetic.presets import get_preset

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3.6-35b-a3b")
    p.add_argument("--quant", default="q4", choices=["q4", "q8", "bf16"])
    p.add_argument("--expert-parallel", action="store_true")
    p.add_argument("--moe-kernels", default="mma", choices=["mma", "cuda"], help="the MoE family (model/plan.py)")
    p.add_argument("-n", type=int, default=128, help="decode tokens")
    p.add_argument("-p", type=int, default=512, help="prefill tokens")
    p.add_argument("-b", default="1,64", help="decode streams (comma list)")
    p.add_argument("-r", type=int, default=5, help="repetitions")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()

    size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's environment (lab code: not the package's knobs)
    rank, parallel = 0, SINGLE
    if size > 1:
        from deltaserve.engine.distributed import ParallelOptions, join_group

        opts = ParallelOptions(size, args.expert_parallel, "external_launcher", args.timeout)
        parallel = join_group(None, size, "cuda", None, opts).parallel  # sets cuda:(rank mod GPUs)
        rank = parallel.rank
    else:
        torch.cuda.set_device(0)
    torch.manual_seed(0)  # every rank draws the same token ids
    config = ModelConfig.from_dict(get_preset(args.preset).config)
    model = random_rank_model(config, args.quant, parallel)
    mem = torch.cuda.memory_allocated() / 1e9
    base = dict(engine="deltaserve", model=args.preset, quant=args.quant, tensor_parallel_size=size,
                expert_parallel=args.expert_parallel, gpu=torch.cuda.get_device_name(), weights_gb_per_rank=mem,
                date=time.strftime("%Y-%m-%d"), depth=0, reps=args.r)

    def report(test: str, n: int, b: int, times: list[float]) -> None:
        if rank == 0:
            tok_s = [b * n / t for t in times]
            print(json.dumps(dict(base, test=test, n=n, batch=b, tok_s=statistics.median(tok_s),
                                  tok_s_std=statistics.pstdev(tok_s))), flush=True)

    with torch.inference_mode():
        for b in [int(v) for v in args.b.split(",")]:
            fast.set_plan(model, resolve_plan("auto", args.moe_kernels, max_num_seqs=b))  # as an engine for b streams
            streams = Streams(model, model.config, b, args.n + 64)
            report("tg", args.n, b, bench_decode(streams, args.n, 0, args.r, graph=True))
            del streams
        fast.set_plan(model, resolve_plan("auto", args.moe_kernels, max_num_seqs=1))
        streams = Streams(model, model.config, 1, args.p + 64)
        report("pp", args.p, 1, bench_prefill(streams, args.p, 0, args.r, graph=True))
    if size > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
