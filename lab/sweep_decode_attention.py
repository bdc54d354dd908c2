"""Decode attention over the paged cache (kernels/attention/triton_paged.paged_decode_attention, split + merge) at the
35B-A3B's attention shapes (Hq 16, Hkv 2, D 256, the output gate on) for B sequences at context depth d: the bf16
cache against the fp8 one (kernels/attention/kv_fp8.py), the split length (SPLIT_TOKENS: a constant, so a row's
merge order depends on its length only), the split program's step (DECODE_BN) and pipeline stages, and the merge's
launch shape (MERGE_BSP splits per step x MERGE_BD columns per program). Each record has the split kernel alone too
(split_us: the merge's share is the difference). This sweep chose c16863d's defaults; the model A/Bs the picks
(lab/bench_attention_pick.py), because a graph of attention calls alone misjudged two of them (lab/NOTES.md).

Every configuration is checked before it is timed: rows 0 and B-1 (output poisoned first) against fp64 attention
over the cache as it reads (the fp8 one dequantised), and row 0 launched alone == row 0 of the batch, bit for bit.
Timing: a CUDA graph of 10 calls, one per attention layer of the model, each on its own cache, so K/V come from
DRAM as in a decode step. GB/s counts the K/V bytes read (and the fp8 scales). --dry-run: the checks only, under
Triton's interpreter on CPU at tiny shapes.

  python lab/sweep_decode_attention.py [--depths 32768,4096,512] [--bs 1,8] [--out FILE] [--budget-s 150]
                                           [--replays 20] [--dry-run]
Exit status 1 when any configuration fails its checks.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from sweep_common import RecordSink, fmt_timed, rel_err, start

LAYERS = 10  # full-attention layers of the 35B-A3B: one cache each in the timed graph
# A configuration: (SPLIT_TOKENS, DECODE_BN, DECODE_WARPS, stages, MERGE_BSP, MERGE_BD), the library's first. The
# split program: longer splits halve the merge's work at long context and double each split program's chain of loop
# steps; BN sets the bytes requested per step; stages (DECODE_STAGES for the cache's dtype; None: Triton's 3) how
# many steps ahead the pipeliner requests them through shared memory. The merge: wider steps and narrower column
# blocks shorten and multiply its chains. programs (DECODE_PROGRAMS): split programs per launch to aim for, each
# looping over its row's splits (None: one program per split). long (LONG_SPLIT): (FROM, TILES), rows of more than
# FROM tokens in splits of TILES x SPLIT_TOKENS tokens (LONG_BN a step), so the merge reads TILES x fewer partials.
KNOBS = ("SPLIT_TOKENS", "DECODE_BN", "DECODE_WARPS", "DECODE_STAGES", "MERGE_BSP", "MERGE_BD", "DECODE_PROGRAMS",
         "LONG_SPLIT")


def cfg(split, bn=None, warps=4, stages=None, bsp=128, bd=32, programs=None, long=None) -> tuple:
    return (split, bn, warps, stages, bsp, bd, programs, long)


SHAPES = (
    cfg(64, 64, warps="lib", stages="lib"), cfg(64, 64, 8, 1), cfg(64, 64, 4, 1, programs=264),
    cfg(64, 64, 4, 2, programs=264), cfg(64, 64, 4, 3, programs=264), cfg(64, 64, 4, 2, programs=132),
    cfg(64, 64, 4, 2, programs=528), cfg(64, 64, 8, 2, programs=264), cfg(64, 64, 8, 3, programs=264),
    cfg(128, 32, bsp=32, bd=64), cfg(64, 64, warps="lib", stages="lib", long=(8192, 2)),
    cfg(64, 64, warps="lib", stages="lib", long=(8192, 4)), cfg(64, 64, warps="lib", stages="lib", long=(2048, 2)),
)
DRY_SHAPES = (cfg(64, 64, warps="lib", stages="lib", bsp=2, bd=16), cfg(128, 16, stages=2, bsp=4),
              cfg(256, 32, 8, bsp=2, bd=16), cfg(64, 64, stages=2, bsp=4, bd=16, programs=3),
              cfg(64, 64, warps="lib", stages="lib", bsp=2, bd=16, long=(128, 2)))


def knob_values(knobs: tuple, saved: dict) -> dict:
    """The triton_paged module values for a configuration: stages or warps "lib" keep the library's per-dtype
    values, another value (None included) applies to both cache dtypes."""
    values = dict(zip(KNOBS, knobs))
    for name in ("DECODE_STAGES", "DECODE_WARPS"):
        v = values[name]
        values[name] = dict(saved[name]) if v == "lib" else {"bf16": v, "fp8": v}
    return values


def parse_shapes(text: str) -> tuple:
    """'S,BN,W,ST,BSP,BD[,P[,LONG]];...' -> configurations (BN 'auto' -> None, ST 'lib' kept, 'dflt' -> None; P the
    split programs to aim for, DECODE_PROGRAMS, '-' for none; LONG 'FROMxTILES', LONG_SPLIT)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        f = item.split(",")
        if len(f) not in (6, 7, 8):
            raise SystemExit(f"--shapes: {item!r} needs the fields S,BN,W,ST,BSP,BD[,P[,LONG]]")
        st = f[3] if f[3] == "lib" else None if f[3] == "dflt" else int(f[3])
        w = f[2] if f[2] == "lib" else int(f[2])
        programs = int(f[6]) if len(f) >= 7 and f[6] != "-" else None
        long = tuple(int(v) for v in f[7].split("x")) if len(f) == 8 else None
        if long is not None and len(long) != 2:
            raise SystemExit(f"--shapes: {item!r}: LONG must be FROMxTILES, e.g. 8192x2")
        out.append(cfg(int(f[0]), None if f[1] == "auto" else int(f[1]), w, st, int(f[4]), int(f[5]), programs,
                       long))
    return tuple(out)


class _NoLaunch:
    """Stands in for the merge kernel to time the split kernel alone (`kernel[grid](...)` does nothing)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def config_name(kind, split, bn, warps, stages, bsp, bd, programs=None, long=None) -> str:
    return (f"{kind} s{split} n{bn or 'auto'} w{warps} st{stages or 'dflt'} m{bsp}x{bd}"
            + (f" p{programs}" if programs else "") + (f" L{long[0]}x{long[1]}" if long else ""))


def fmt(r: dict) -> str:
    return fmt_timed(f"{r['shape']:30s} {r['config']:32s}", r,
                     lambda r: (f"split {r['split_us']:6.2f} " if r.get("split_us") else "")
                     + f"err {r['err']:.2e} inv {'yes' if r['inv'] else 'NO'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", default="32768,4096,512")
    ap.add_argument("--bs", default="1,8")
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--dry-run", action="store_true", help="checks only, under the interpreter, tiny shapes")
    ap.add_argument("--shapes", default=None, metavar="S,BN,W,ST,BSP,BD[,P];...",
                    help="configurations instead of SHAPES (W: a number or 'lib'; ST: a number, 'lib' or 'dflt'; BN "
                         "'auto'), the first the "
                         "base, e.g. '64,64,4,lib,128,32;64,64,8,1,128,32'")
    args = ap.parse_args(argv)
    code = start(args.dry_run, __file__, sys.argv[1:] if argv is None else argv)
    if code is not None:
        return code
    from kernel_cases import BF16_EPS, SLACK
    from kv_fp8_cases import fp64_cache

    from deltaserve.kernels.attention import reference as attn_ref
    import attention_knobs
    from deltaserve.kernels.attention import triton_paged as tp
    from deltaserve.kernels.attention.kv_fp8 import quantize_rows

    dev = torch.device("cpu" if args.dry_run else "cuda")
    hq, hkv, d, bs_tok = (4, 2, 32, 8) if args.dry_run else (16, 2, 256, 64)
    shapes = parse_shapes(args.shapes) if args.shapes else DRY_SHAPES if args.dry_run else SHAPES
    depths = [int(v) for v in args.depths.split(",")]
    batches = [int(v) for v in args.bs.split(",")]
    if args.dry_run:
        depths = sorted({min(v, 700) for v in depths})  # ~6 splits of 128, 3 of 256: several merge steps at BSP 2
        batches = sorted({min(v, 3) for v in batches})
    sink = RecordSink(args.out, fmt, {"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"})
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    saved = {k: attention_knobs.get(k) for k in KNOBS}
    for depth in depths:
        for b in batches:
            blocks = -(-(depth + 1) // bs_tok)
            tables = torch.randperm(b * blocks, device=dev, dtype=torch.int32).view(b, blocks)
            lens = torch.tensor([depth + 1 - (i % 3) for i in range(b)], device=dev, dtype=torch.int32)
            q = torch.randn(b, hq, d, device=dev).bfloat16()
            gate = torch.randn(b, hq, d, device=dev).bfloat16()
            k16 = torch.randn(b * blocks, bs_tok, hkv, d, device=dev).bfloat16()
            v16 = torch.randn(b * blocks, bs_tok, hkv, d, device=dev).bfloat16()
            for kind in ("bf16", "fp8"):
                if kind == "fp8":
                    (k8, ks), (v8, vs) = quantize_rows(k16), quantize_rows(v16)
                    cache = (k8, v8, ks.contiguous(), vs.contiguous())
                    kd, vd = fp64_cache(k8, ks), fp64_cache(v8, vs)
                else:
                    cache = (k16, v16, None, None)
                    kd, vd = k16.double(), v16.double()
                caches = [cache] + ([] if args.dry_run else
                                    [tuple(None if t is None else t.clone() for t in cache)
                                     for _ in range(LAYERS - 1)])
                row_bytes = d * cache[0].element_size() + (4 if kind == "fp8" else 0)  # a K or V row + scale
                kv_bytes = int(lens.sum()) * hkv * 2 * row_bytes  # what one call reads
                rows = sorted({0, b - 1})
                ref = {}
                for i in rows:
                    want = attn_ref.paged_attention(q[i : i + 1].double().view(1, hq, d), kd, vd, tables[i : i + 1],
                                                    [int(lens[i]) - 1], [1], d**-0.5)[0]
                    sig = torch.sigmoid(gate[i].double()).bfloat16().double()
                    ref[i] = want.bfloat16().double() * sig  # the kernel's gate rounding: bf16(o) * bf16(sig)
                shape = f"B={b} d={depth} Hq={hq} D={d}"
                for knobs in shapes:
                    values = knob_values(knobs, saved)  # "lib" resolved to the library's per-dtype values
                    split, bn, _, _, bsp, bd, programs, long = knobs
                    warps = values["DECODE_WARPS"].get(kind, 4)
                    stages = values["DECODE_STAGES"].get(kind)
                    rec = dict(shape=shape, config=config_name(kind, split, bn, warps, stages, bsp, bd, programs,
                                                               long),
                               kv=kind, split=split, bn=bn, warps=warps, stages=stages, merge_bsp=bsp,
                               merge_bd=bd, programs=programs, long_split=long, depth=depth, batch=b)
                    if time.monotonic() > deadline:
                        sink.emit({**rec, "skipped": True})
                        continue
                    try:
                        with attention_knobs.applied(values):
                            def call(c, out=None, rows=slice(None)):
                                kc, vc, ksc, vsc = c
                                return tp.paged_decode_attention(
                                    q[rows], kc, vc, tables[rows], lens[rows], d**-0.5, blocks * bs_tok, out=out,
                                    gate=gate[rows], k_scale=ksc, v_scale=vsc)

                            out = torch.full((b, hq, d), float("nan"), dtype=torch.bfloat16, device=dev)
                            y = call(caches[0], out)
                            err = max(rel_err(y[i], ref[i]) for i in rows)
                            inv = torch.equal(call(caches[0], rows=slice(0, 1)), y[:1])
                            ok = err <= 4 * BF16_EPS * SLACK and inv
                            us = how = split_us = None
                            if dev.type == "cuda":
                                from sweep_common import time_graph

                                calls = [lambda c=c: call(c) for c in caches]
                                us, how = time_graph(calls, dev, args.replays)
                                if blocks * bs_tok > split:  # the split kernel alone: the merge's share by difference
                                    merge, tp._decode_merge_kernel = tp._decode_merge_kernel, _NoLaunch()
                                    try:
                                        split_us, _ = time_graph(calls, dev, args.replays)
                                    finally:
                                        tp._decode_merge_kernel = merge
                            sink.emit({**rec, "us": us, "split_us": split_us, "timing": how,
                                       "gbs": kv_bytes / us / 1e3 if us else 0.0, "err": err, "inv": inv, "ok": ok})
                    except Exception as exc:  # noqa: BLE001  a configuration that does not launch is a result
                        sink.emit({**rec, "ok": False, "error": repr(exc)[:400]})
                del caches
    return sink.finish()


if __name__ == "__main__":
    sys.exit(main())
