"""Where the eager prefill forward's host time goes: cProfile of one eager forward of B prompts of n tokens on the
35B preset (after a warm-up), the top functions by own and by cumulative time, and the wall time of the forward
with the GPU synchronised before and after. Usage (H200): python3 lab/probe_host_prefill.py B N OUT_PREFIX"""

import cProfile
import pstats
import sys
import time

import torch

from deltaserve.bench.random_model import build_random_model
from deltaserve.model import ForwardBatch
from deltaserve.model.config import ModelConfig
from deltaserve.synthetic.presets import get_preset


def main() -> None:
    batch, n, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    config = ModelConfig.from_dict(get_preset("qwen3.6-35b-a3b").config)
    model = build_random_model(config, "q4", "cuda")
    blocks = -(-(n + 8) // 64)
    cache = model.make_cache(batch * blocks, 64, batch, torch.bfloat16)
    tables = torch.arange(batch * blocks, dtype=torch.int32).view(batch, -1).tolist()
    ids = torch.randint(0, config.vocab_size, (batch, n)).tolist()
    fb = ForwardBatch.build(ids, [0] * batch, tables, list(range(batch)), 64, device="cuda")
    with torch.no_grad():
        for _ in range(2):
            model(fb, cache)
        torch.cuda.synchronize()
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            model(fb, cache)
            host = time.perf_counter() - t
            torch.cuda.synchronize()
            walls.append((host, time.perf_counter() - t))
        prof = cProfile.Profile()
        prof.enable()
        model(fb, cache)
        prof.disable()
        torch.cuda.synchronize()
    print(f"# eager prefill {batch} x {n}: host (launch return) / wall ms " +
          ", ".join(f"{h * 1e3:.1f} / {w * 1e3:.1f}" for h, w in walls))
    stats = pstats.Stats(prof)
    stats.dump_stats(prefix + ".pstats")
    with open(prefix + ".txt", "w") as f:
        s = pstats.Stats(prof, stream=f)
        s.sort_stats("tottime").print_stats(45)
        s.sort_stats("cumulative").print_stats(70)
        s.sort_stats("tottime").print_callers(15)
    s = pstats.Stats(prof)
    s.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
