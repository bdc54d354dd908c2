"""The GPU fast path under tensor / expert parallelism, on CPU: every rank a process (gloo), every Triton kernel
through Triton's interpreter (TRITON_INTERPRET=1, DELTASERVE_FAST_INTERPRET=1). See README.md.

The parent writes a tiny bf16 MoE checkpoint (transformers-initialised, vocab 32), runs N = 1, N = 2 tensor-parallel
and N = 2 expert-parallel, each rank computing prefill, decode and a 24-token prefill on the reference path and on
the fast path; rank 0 saves the logits; the parent compares."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rank_main(rank: int, size: int, store: str, ep: bool, ckpt: str, out: str) -> None:
    sys.path[:0] = [str(ROOT / "tests" / "gpu"), str(ROOT / "tests")]
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    import torch
    import torch.distributed as dist

    from deltaserve.kernels import backend
    from deltaserve.kernels.gated_delta import triton_decode
    from deltaserve.model import ForwardBatch
    from deltaserve.model.parallel import Parallel, TorchCommunicator
    from deltaserve.weights.loader import load_checkpoint
    from test_fast_path_interpret import _reference_gdn_prefill

    triton_decode.gdn_prefill = _reference_gdn_prefill  # fla's chunked rule has no interpreter path
    torch.set_num_threads(1)
    parallel = None
    if size > 1:
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=1800))
        parallel = Parallel(rank, size, TorchCommunicator(dist.group.WORLD, rank, size, 1800), ep)
    model = load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False, parallel=parallel).model
    prompts = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22]]
    long_prompt = [(5 * j + 3) % 31 + 1 for j in range(24)]  # past MOE_GEMV_MAX_TOKENS: the grouped experts
    tables = [[4 * i + j for j in range(4)] for i in range(3)]
    res = {}
    for fast in (False, True):
        backend.use_reference(not fast)
        cache = model.make_cache(16, 16, 3, torch.bfloat16)
        with torch.no_grad():
            pre = [model(ForwardBatch.build([p], [0], [tables[i]], [i], 16), cache) for i, p in enumerate(prompts)]
            dec = model(ForwardBatch.build([[1], [2]], [len(p) for p in prompts], tables[:2], [0, 1], 16), cache)
            whole = model(ForwardBatch.build([long_prompt], [0], [tables[2]], [2], 16, logits="all"), cache)
        res[fast] = dict(prefill=torch.cat(pre).float(), decode=dec.float(), long=whole.float())
    if rank == 0:
        torch.save(res, out)


def launch(tmp: Path, ckpt: Path, size: int, ep: bool, name: str) -> Path:
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out, store = tmp / f"{name}.pt", tmp / f"{name}.store"
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(size), str(store), str(int(ep)),
                               str(ckpt), str(out)], env=env) for r in range(size)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"{name}: ranks exited with {codes}")
    return out


def main() -> int:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from model_helpers import make_hf_model, ours_from_checkpoint

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ckpt = tmp / "ckpt"
        ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32), ckpt)
        start = time.time()
        runs = {name: torch.load(launch(tmp, ckpt, size, ep, name))
                for name, size, ep in (("one", 1, False), ("tp2", 2, False), ("ep2", 2, True))}
        print(f"interpreter runs: {time.time() - start:.0f} s")

    def rel(a, b) -> float:
        return float((a - b).abs().max() / b.abs().max())

    ok = True
    for name in ("tp2", "ep2"):
        for key in ("prefill", "decode", "long"):
            fast, ref, one = runs[name][True][key], runs[name][False][key], runs["one"][True][key]
            same = bool(torch.equal(fast.argmax(-1), one.argmax(-1)))
            base = rel(runs["one"][True][key], runs["one"][False][key])
            print(f"{name} {key}: fast vs reference {rel(fast, ref):.4f} (N = 1: {base:.4f}), fast vs N = 1 fast "
                  f"{rel(fast, one):.4f}, greedy tokens equal: {same}")
            ok &= same and rel(fast, ref) < 2 * base + 0.01 and rel(fast, one) < 0.02
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        r, n, store, ep, ckpt, out = sys.argv[2:8]
        rank_main(int(r), int(n), store, ep == "1", ckpt, out)
    else:
        sys.exit(main())
