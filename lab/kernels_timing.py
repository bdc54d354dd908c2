"""Kernel timing table at the Qwen3.6-35B-A3B decode/prefill shapes: time per call, achieved GB/s and % of the
measured 4.29 TB/s copy ceiling (shared/GPU_NOTES.md), TFLOP/s for the matmul-bound ones.

  python lab/kernels_timing.py [--out results.jsonl] [--commit abc1234] [--only NAME...]
  TRITON_INTERPRET=1 python lab/kernels_timing.py --dry     (runs every case once at toy sizes on CPU)

Method: each case builds C copies of its inputs (C chosen so the copies together exceed the 60 MB L2, so weights are
re-read from HBM as in a real decode step), captures R calls cycling over the copies in one CUDA graph (no launch
gaps, as the engine will run), replays it 5 times and reports the median time per call. Compile and capture stay
out of the numbers. fla's prefill is timed eagerly with CUDA events (it is not captured).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

from graph_capture import capture_calls  # noqa: E402  (after the sys.path lines)

CEILING_GBPS = 4290.0  # device-to-device copy, bytes read + written (GPU_NOTES.md)
L2_BYTES = 60 << 20
DRY = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def copies_for(nbytes: int) -> int:
    return max(2, min(32, math.ceil(2 * L2_BYTES / max(nbytes, 1))))


def time_graph(calls, reps: int = 32) -> float:
    """Median microseconds per call of `calls` (a list of closures, cycled) replayed from one CUDA graph."""
    if DRY:
        for c in calls:
            c()
        return float("nan")
    graph = capture_calls([calls[r % len(calls)] for r in range(reps)], warmup=calls)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


def time_eager(fn, reps: int = 5) -> float:
    if DRY:
        fn()
        return float("nan")
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def q_bytes(n: int, k: int, bits: int, group: int = 64) -> int:
    """Stored bytes of an [n, k] weight: packed codes + bf16 scales and biases (dense bf16 for bits 16)."""
    return n * k * 2 if bits == 16 else n * k * bits // 8 + n * (k // group) * 4


# ------------------------------------------------------------------------------------------------ cases


def case_affine(dev, mods, kc, m, n, k, bits, group=64, config=None):
    ta = mods["affine"]
    wbytes = q_bytes(n, k, bits, group)
    ws = []
    for _ in range(copies_for(wbytes)):
        if bits == 16:
            ws.append((torch.randn(n, k, device=dev).bfloat16(), None, None))
        else:
            p, s, b, _ = kc.affine_weight((n, k), bits, group, dev)
            ws.append((p, s, b))
    x = torch.randn(m, k, device=dev).bfloat16()
    outs = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    us = time_graph([lambda w=w: ta.affine_matmul(x, *w, bits, group, out=outs, config=config) for w in ws])
    moved = wbytes + 2 * m * (n + k)
    check = ""
    if config is not None:  # a swept configuration must give the default's result (up to rounding)
        want = ta.affine_matmul(x, *ws[0], bits, group).double()
        got = ta.affine_matmul(x, *ws[0], bits, group, config=config).double()
        err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        check = f" check={'ok' if err <= 2 * kc.BF16_EPS else 'MISMATCH'}({err:.1e})"
    shape = (f"M={m} N={n} K={k} q{bits}g{group}" if bits < 16 else f"M={m} N={n} K={k} bf16") + check
    return dict(kernel="affine_matmul", shape=shape + (f" cfg={config}" if config else ""), us=us, bytes=moved,
                flops=2 * m * n * k)


def case_moe(dev, mods, kc, t, h=2048, e=256, i=512, top_k=8, config=None):
    md = mods["moe"]
    x, kw, _ = kc.moe_problem(dev, 16 * t, h, e, i, i, 4, 64)
    res = kw.pop("residual")
    xs = [x[j * t:(j + 1) * t].contiguous() for j in range(16)]
    rs = [res[j * t:(j + 1) * t].contiguous() for j in range(16)]
    us = time_graph([lambda j=j: md.moe_decode(xs[j], top_k=top_k, residual=rs[j], config=config, **kw)
                     for j in range(16)])
    check = ""
    if config is not None:
        want = md.moe_decode(xs[0], top_k=top_k, residual=rs[0], **kw).double()
        got = md.moe_decode(xs[0], top_k=top_k, residual=rs[0], config=config, **kw).double()
        err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        check = f" check={'ok' if err <= 4 * kc.BF16_EPS else 'MISMATCH'}({err:.1e})"
    # bytes: router + the distinct experts each call touches (3 matrices each) + the shared expert
    picked = [md.moe_route(xj, kw["router"], top_k).ids.unique().numel() for xj in xs]
    expert = 3 * q_bytes(i, h, 4)
    moved = q_bytes(e, h, 8) + statistics.mean(picked) * expert + expert + h * 2 + t * h * 6
    return dict(kernel="moe_decode", shape=f"T={t} E={e} top{top_k} I={i} H={h} q4g64 router q8" +
                (f" cfg={config}" if config else "") + check, us=us,
                bytes=moved, flops=2 * t * (top_k + 1) * 3 * i * h)


def case_gdn_decode(dev, mods, kc, b, hk=16, hv=32, d=128, part="both"):
    gd = mods["gdn"]
    c = 2 * hk * d + hv * d
    pools = copies_for(b * hv * d * d * 8)
    inp = kc.gdn_inputs(dev, b, hk, hv, d, d, b * pools)
    conv_w = torch.randn(c, 4, device=dev).bfloat16()
    conv = torch.randn(b * pools, c, 3, device=dev).bfloat16()
    ctx = torch.full((b,), 100, device=dev)
    cu = torch.arange(b + 1, device=dev, dtype=torch.int32)
    slot_sets = [torch.arange(j * b, (j + 1) * b, device=dev) for j in range(pools)]

    xc0 = inp["qkv"].clone()

    def step(slots):
        xc = gd.causal_conv(inp["qkv"], conv_w, conv, cu, slots, ctx, 1) if part != "step" else xc0
        if part != "conv":
            gd.gdn_decode_step(xc, inp["z"], inp["a"], inp["b"], inp["a_log"], inp["dt_bias"], inp["norm_w"],
                               inp["ssm"], slots, ctx, hk, 1e-6)

    us = time_graph([lambda s=s: step(s) for s in slot_sets])
    moved = b * (hv * d * d * 4 * 2 + c * 3 * 2 * 2 + c * 2 * 2 + hv * d * 2 * 3)
    if part == "conv":
        moved = b * c * (3 * 2 * 2 + 2 * 2)
    elif part == "step":
        moved = b * (hv * d * d * 4 * 2 + c * 2 + hv * d * 2 * 2)
    name = {"both": "gdn_conv+decode_step", "conv": "gdn_conv(decode)", "step": "gdn_decode_step"}[part]
    return dict(kernel=name, shape=f"B={b} Hk={hk} Hv={hv} d={d}", us=us, bytes=moved, flops=0)


def case_attn_decode(dev, mods, kc, b, ctx, hq=16, hkv=2, d=256, bs=16):
    tp = mods["attn"]
    kv_bytes = b * ctx * 2 * hkv * d * 2
    n = copies_for(kv_bytes)
    p = kc.paged_problem(dev, [ctx] * (b * n), [1] * (b * n), hq, hkv, d, bs)
    lens = torch.full((b,), ctx + 1, device=dev, dtype=torch.int32)
    q = torch.randn(b, hq, d, device=dev).bfloat16()
    out = torch.empty_like(q)
    tables = [p["tables"][j * b:(j + 1) * b] for j in range(n)]
    us = time_graph([lambda t=t: tp.paged_decode_attention(q, p["kc"], p["vc"], t, lens, d**-0.5, ctx + 1, out=out)
                     for t in tables])
    return dict(kernel="paged_decode_attention", shape=f"B={b} ctx={ctx} Hq={hq} Hkv={hkv} D={d}", us=us,
                bytes=kv_bytes, flops=4 * b * hq * d * ctx)


def case_attn_prefill(dev, mods, kc, t, hq=16, hkv=2, d=256, bs=16):
    tp = mods["attn"]
    p = kc.paged_problem(dev, [0], [t], hq, hkv, d, bs)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    ctx = torch.zeros(1, device=dev, dtype=torch.int64)
    out = torch.empty_like(p["q"])
    us = time_graph([lambda: tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"], ctx,
                                                        d**-0.5, t, out=out)], reps=4)
    return dict(kernel="paged_prefill_attention", shape=f"T={t} causal Hq={hq} D={d}", us=us,
                bytes=t * (hq + 2 * hkv) * d * 2 * 2, flops=2 * hq * d * t * t)


def case_conv_prefill(dev, mods, kc, t, c=8192):
    gd = mods["gdn"]
    x = torch.randn(t, c, device=dev).bfloat16()
    w = torch.randn(c, 4, device=dev).bfloat16()
    pool = torch.zeros(2, c, 3, device=dev).bfloat16()
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    slots, ctx = torch.zeros(1, device=dev, dtype=torch.int64), torch.zeros(1, device=dev, dtype=torch.int64)
    y = torch.empty_like(x)
    us = time_graph([lambda: gd.causal_conv(x, w, pool, cu, slots, ctx, t, out=y)], reps=8)
    return dict(kernel="causal_conv", shape=f"T={t} C={c}", us=us, bytes=2 * t * c * 2, flops=0)


def case_fla_prefill(dev, mods, kc, t, hk=16, hv=32, d=128):
    gd = mods["gdn"]
    q, k = (torch.randn(t, hk, d, device=dev).bfloat16() for _ in range(2))
    v = torch.randn(t, hv, d, device=dev).bfloat16()
    g, beta = -torch.rand(t, hv, device=dev) * 0.5, torch.rand(t, hv, device=dev)
    ssm = torch.zeros(2, hv, d, d, device=dev)
    cu = torch.tensor([0, t], device=dev)
    slots, ctx = torch.zeros(1, device=dev, dtype=torch.int64), torch.zeros(1, device=dev, dtype=torch.int64)
    us = time_eager(lambda: gd.gdn_prefill(q, k, v, g, beta, cu, ssm, slots, ctx, d**-0.5, cu_seqlens_cpu=cu.cpu()))
    return dict(kernel="gdn_prefill(fla chunk)", shape=f"T={t} Hk={hk} Hv={hv} d={d}", us=us,
                bytes=t * (2 * hk + 2 * hv) * d * 2, flops=0)


def case_norm(dev, mods, kc, rows, n=2048):
    nm = mods["norm"]
    x = torch.randn(rows, n, device=dev).bfloat16()
    r = torch.randn(rows, n, device=dev).bfloat16()
    w = torch.randn(n, device=dev).bfloat16()
    us = time_graph([lambda: nm.add_rms_norm(x, r, w, 1e-6)])
    return dict(kernel="add_rms_norm", shape=f"rows={rows} N={n}", us=us, bytes=4 * rows * n * 2, flops=0)


def cases(small: bool):
    if small:
        return [("affine", dict(m=1, n=64, k=256, bits=4)), ("moe", dict(t=1, h=64, e=8, i=64, top_k=2)),
                ("gdn", dict(b=2, hk=2, hv=4, d=16)), ("attn_decode", dict(b=2, ctx=40, hq=4, d=32, bs=8)),
                ("attn_prefill", dict(t=20, hq=4, d=32, bs=8)), ("conv", dict(t=10, c=48)),
                ("norm", dict(rows=1, n=64))]
    out = []
    for n, k in ((8192, 2048), (2048, 4096), (248320, 2048)):
        out.append(("affine", dict(m=1, n=n, k=k, bits=4)))
    out += [("affine", dict(m=1, n=8192, k=2048, bits=8)), ("affine", dict(m=1, n=8192, k=2048, bits=16)),
            ("affine", dict(m=16, n=8192, k=2048, bits=4)), ("affine", dict(m=512, n=8192, k=2048, bits=4)),
            ("affine", dict(m=4096, n=8192, k=2048, bits=4)), ("affine", dict(m=4096, n=8192, k=2048, bits=16)),
            ("moe", dict(t=1)), ("moe", dict(t=4)), ("moe", dict(t=16)),
            ("gdn", dict(b=1)), ("gdn", dict(b=1, part="conv")), ("gdn", dict(b=1, part="step")),
            ("gdn", dict(b=8)), ("gdn", dict(b=32)),
            ("attn_decode", dict(b=1, ctx=4096)), ("attn_decode", dict(b=1, ctx=32768)),
            ("attn_decode", dict(b=32, ctx=4096)), ("attn_prefill", dict(t=4096)),
            ("conv", dict(t=4096)), ("fla", dict(t=4096)), ("norm", dict(rows=1)), ("norm", dict(rows=4096))]
    return out


def sweep_cases():
    """Configurations tried for the two bandwidth-critical decode kernels (results pick the defaults)."""
    out = [("affine", dict(m=1, n=8192, k=2048, bits=4, config=c)) for c in (
        (16, 512, 4, 3), (32, 512, 4, 3), (16, 256, 4, 3), (32, 256, 4, 4), (64, 256, 8, 3), (16, 512, 8, 3),
        (16, 1024, 8, 2), (32, 128, 4, 4))]
    out += [("affine", dict(m=1, n=2048, k=4096, bits=4, config=c)) for c in ((16, 512, 4, 3), (16, 1024, 8, 2))]
    for gu in ((16, 256, 4), (8, 256, 4), (32, 256, 4), (16, 512, 4), (16, 128, 4), (16, 256, 8)):
        out.append(("moe", dict(t=1, config={"gate_up": gu, "down": gu, "router": (16, 256, 4)})))
    out.append(("moe", dict(t=1, config={"router": (8, 512, 4)})))
    return out


RUNNERS = {"affine": case_affine, "moe": case_moe, "gdn": case_gdn_decode, "attn_decode": case_attn_decode,
           "attn_prefill": case_attn_prefill, "conv": case_conv_prefill, "fla": case_fla_prefill, "norm": case_norm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="append JSON lines here")
    ap.add_argument("--commit", default=os.environ.get("DELTASERVE_COMMIT", "unknown"))
    ap.add_argument("--only", nargs="*", help="case kinds to run (default: all)")
    ap.add_argument("--dry", action="store_true", help="toy sizes, each case once (use with TRITON_INTERPRET=1)")
    ap.add_argument("--sweep", action="store_true", help="time the configuration sweep instead of the table")
    args = ap.parse_args()
    import importlib

    import kernel_cases as kc

    if DRY:
        kc.interpreter_numpy_shim()
    dev = "cpu" if DRY else "cuda"
    mods = {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("affine", "quant.triton_affine"), ("moe", "moe.triton_decode"), ("gdn", "gated_delta.triton_decode"),
        ("attn", "attention.triton_paged"), ("norm", "triton_norm"))}
    gpu = "cpu-interpreter" if DRY else torch.cuda.get_device_name()
    print(f"| {'kernel':<24} | {'shape':<44} | {'us':>9} | {'GB/s':>7} | {'% 4.29TB/s':>10} | {'TFLOP/s':>7} |")
    print("|" + "-" * 26 + "|" + "-" * 46 + "|" + "-" * 11 + "|" + "-" * 9 + "|" + "-" * 12 + "|" + "-" * 9 + "|")
    for kind, kw in (sweep_cases() if args.sweep else cases(args.dry or DRY)):
        if args.only and kind not in args.only:
            continue
        torch.manual_seed(0)
        try:
            r = RUNNERS[kind](dev, mods, kc, **kw)
        except Exception as exc:  # keep timing the rest; the failure is printed in the table
            print(f"| {kind:<24} | {str(kw):<44} | FAILED: {exc!r}"[:400], flush=True)
            continue
        us = r["us"]
        gbps = r["bytes"] / us / 1e3 if us == us else float("nan")
        tflops = r["flops"] / us / 1e6 if us == us and r["flops"] else None
        print(f"| {r['kernel']:<24} | {r['shape']:<44} | {us:9.2f} | {gbps:7.0f} | {100 * gbps / CEILING_GBPS:10.1f} | "
              f"{'' if tflops is None else f'{tflops:7.1f}':>7} |", flush=True)
        rec = {"engine": "deltaserve", "commit": args.commit, "date": datetime.date.today().isoformat(), "gpu": gpu,
               "kernel": r["kernel"], "shape": r["shape"], "us": round(us, 3), "bytes": int(r["bytes"]),
               "gbps": round(gbps, 1), "roofline_pct": round(100 * gbps / CEILING_GBPS, 2),
               "tflops": None if tflops is None else round(tflops, 1), "notes": "CUDA graph replay, median of 5"}
        if args.out and not DRY:
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
        torch.cuda.empty_cache() if not DRY else None


if __name__ == "__main__":
    main()
