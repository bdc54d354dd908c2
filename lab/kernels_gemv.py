"""Old vs new decode kernels at the Qwen3.6-35B-A3B shapes: `affine_matmul` vs `affine_gemv` (q4 g64, M = 1, 8)
and `moe_decode` vs `moe_decode_v2` (256 experts top-8, H 2048, I 512, q4 g64, 8-bit router; T = 1, 8).

  python lab/kernels_gemv.py [--out results.jsonl] [--commit abc1234]
  TRITON_INTERPRET=1 python lab/kernels_gemv.py      (toy sizes, each call once, on CPU)

Timing as lab/kernels_timing.py (weight copies past the 60 MB L2, R calls in one CUDA graph, median of 5
replays); GB/s counts the stored bytes one call must read, against the 4.29 TB/s copy ceiling. Each row also
checks new == old within bf16 tolerance (the old kernels round w to bf16 first; the new ones do not).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

from kernels_timing import CEILING_GBPS, DRY, copies_for, q_bytes, time_graph  # noqa: E402

SHAPES = [(8192, 2048), (4096, 2048), (2048, 4096), (248320, 2048), (512, 2048)]  # (N, K)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def gemv_rows(dev, mods, kc, m, n, k, bits=4, group=64):
    wbytes = q_bytes(n, k, bits, group)
    ws = []
    for _ in range(copies_for(wbytes)):
        p, s, b, _ = kc.affine_weight((n, k), bits, group, dev)
        ws.append((p, s, b))
    x = torch.randn(m, k, device=dev).bfloat16()
    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    old = time_graph([lambda w=w: mods["affine"].affine_matmul(x, *w, bits, group, out=out) for w in ws])
    new = time_graph([lambda w=w: mods["gemv"].affine_gemv(x, *w, bits, group, out=out) for w in ws])
    err = _rel(mods["gemv"].affine_gemv(x, *ws[0], bits, group), mods["affine"].affine_matmul(x, *ws[0], bits, group))
    shape = f"M={m} N={n} K={k} q{bits}g{group}"
    moved = wbytes + 2 * m * (n + k)
    return [("affine_matmul", shape, old, moved, ""), ("affine_gemv", shape, new, moved, _verdict(err, kc, 4))]


def moe_rows(dev, mods, kc, t, h=2048, e=256, i=512, top_k=8):
    x, kw, _ = kc.moe_problem(dev, 16 * t, h, e, i, i, 4, 64)
    res = kw.pop("residual")
    xs = [x[j * t:(j + 1) * t].contiguous() for j in range(16)]
    rs = [res[j * t:(j + 1) * t].contiguous() for j in range(16)]
    old = time_graph([lambda j=j: mods["moe"].moe_decode(xs[j], top_k=top_k, residual=rs[j], **kw) for j in range(16)])
    new = time_graph([lambda j=j: mods["moe2"].moe_decode_v2(xs[j], top_k=top_k, residual=rs[j], **kw)
                      for j in range(16)])
    err = _rel(mods["moe2"].moe_decode_v2(xs[0], top_k=top_k, residual=rs[0], **kw),
               mods["moe"].moe_decode(xs[0], top_k=top_k, residual=rs[0], **kw))
    picked = [mods["moe"].moe_route(xj, kw["router"], top_k).ids.unique().numel() for xj in xs]
    expert = 3 * q_bytes(i, h, 4)
    moved = q_bytes(e, h, 8) + statistics.mean(picked) * expert + expert + h * 2 + t * h * 6
    shape = f"T={t} E={e} top{top_k} I={i} H={h} q4g64 router q8"
    return [("moe_decode", shape, old, moved, ""), ("moe_decode_v2", shape, new, moved, _verdict(err, kc, 8))]


def _verdict(err: float, kc, ulps: int) -> str:
    return f"new==old {'ok' if err <= ulps * kc.BF16_EPS * kc.SLACK else 'MISMATCH'} ({err:.1e})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="append JSON lines here")
    ap.add_argument("--commit", default=os.environ.get("DELTASERVE_COMMIT", "unknown"))
    args = ap.parse_args()
    import kernel_cases as kc

    if DRY:
        kc.interpreter_numpy_shim()
    dev = "cpu" if DRY else "cuda"
    mods = {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("affine", "quant.triton_affine"), ("gemv", "quant.triton_gemv"), ("moe", "moe.triton_decode"),
        ("moe2", "moe.triton_moe_gemv"))}
    gpu = "cpu-interpreter" if DRY else torch.cuda.get_device_name()
    if DRY:
        jobs = [(gemv_rows, dict(m=1, n=40, k=256)), (gemv_rows, dict(m=8, n=24, k=128)),
                (moe_rows, dict(t=1, h=64, e=8, i=64, top_k=2))]
    else:
        jobs = [(gemv_rows, dict(m=m, n=n, k=k)) for n, k in SHAPES for m in (1, 8)]
        jobs += [(moe_rows, dict(t=t)) for t in (1, 8)]
    print(f"| {'kernel':<14} | {'shape':<38} | {'us':>8} | {'GB/s':>6} | {'% 4.29TB/s':>10} | check")
    start = time.time()
    for fn, kw in jobs:
        torch.manual_seed(0)
        try:
            rows = fn(dev, mods, kc, **kw)
        except Exception as exc:  # keep timing the rest; the failure is printed in the table
            print(f"| {fn.__name__:<14} | {str(kw):<38} | FAILED: {exc!r}"[:400], flush=True)
            continue
        for kernel, shape, us, moved, check in rows:
            gbps = moved / us / 1e3 if us == us else float("nan")
            print(f"| {kernel:<14} | {shape:<38} | {us:8.2f} | {gbps:6.0f} | {100 * gbps / CEILING_GBPS:10.1f} | "
                  f"{check}", flush=True)
            if args.out and not DRY:
                rec = {"engine": "deltaserve", "commit": args.commit, "date": datetime.date.today().isoformat(),
                       "gpu": gpu, "kernel": kernel, "shape": shape + (f" {check}" if check else ""),
                       "us": round(us, 3), "bytes": int(moved), "gbps": round(gbps, 1),
                       "roofline_pct": round(100 * gbps / CEILING_GBPS, 2), "tflops": None,
                       "notes": "CUDA graph replay, median of 5 (lab/kernels_gemv.py)"}
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
        if not DRY:
            torch.cuda.empty_cache()
    print(f"total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
