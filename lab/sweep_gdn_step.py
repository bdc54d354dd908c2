"""The DeltaNet decode step (kernels/gated_delta/triton_decode.gdn_decode_step) at the 35B-A3B's shapes (Hk 16,
Hv 32, dk = dv = 128, fp32 state) for 1 / 8 / 64 sequences, over state columns per program (dv_block: None = one
program per head, 16, 32 = the default, 64) and warps per program. At 64 streams the step is 90 us a layer against
~60 us of state traffic at the copy ceiling (lab/NOTES.md); this sweep is where its launch shape gets chosen.

Every configuration is checked before it is timed: the output (poisoned first) and the new state of the first and
last rows against the fp64 step reference (tests/gpu/kernel_cases.gdn_step_reference), one row fresh (no state read)
and the rest resumed. Timing: a CUDA graph of 30 calls, one per DeltaNet layer of the model, each on its own state
pool, so the states come from DRAM as in a decode step. GB/s counts the state read and written (2 x B x Hv x dk x
dv x 4 bytes per call). --dry-run: the checks only, under Triton's interpreter on CPU at tiny shapes.

  python lab/sweep_gdn_step.py [--bs 1,8,64] [--out FILE] [--budget-s 120] [--replays 20] [--dry-run]
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

LAYERS = 30  # DeltaNet layers of the 35B-A3B: one state pool each in the timed graph


def fmt(r: dict) -> str:
    return fmt_timed(f"{r['shape']:22s} {r['config']:14s}", r,
                     lambda r: f"err out {r['err_out']:.2e} state {r['err_state']:.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bs", default="1,8,64")
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--configs", default=None, help="only these dv_block x warps, e.g. 32x4,64x4 (0 = a head)")
    ap.add_argument("--dry-run", action="store_true", help="checks only, under the interpreter, tiny shapes")
    args = ap.parse_args(argv)
    code = start(args.dry_run, __file__, sys.argv[1:] if argv is None else argv)
    if code is not None:
        return code
    from kernel_cases import BF16_EPS, SLACK, gdn_inputs, gdn_step_reference

    from deltaserve.kernels.gated_delta.triton_decode import gdn_decode_step

    dev = torch.device("cpu" if args.dry_run else "cuda")
    hk, hv, dk, dv = (2, 4, 32, 32) if args.dry_run else (16, 32, 128, 128)
    blocks = (None, 8, 16) if args.dry_run else (None, 16, 32, 64)
    warps = (4,) if args.dry_run else (2, 4, 8)
    bs = [int(v) for v in args.bs.split(",")]
    pairs = [(bv, w) for bv in blocks for w in warps]
    if args.configs:
        pairs = [(int(c.split("x")[0]) or None, int(c.split("x")[1])) for c in args.configs.split(",")]
    if args.dry_run:
        bs = [min(b, 3) for b in bs]
    sink = RecordSink(args.out, fmt, {"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"})
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    for b in dict.fromkeys(bs):
        inp = gdn_inputs(dev, b, hk, hv, dk, dv, b)
        slots = torch.arange(b, device=dev, dtype=torch.int32)
        ctx = torch.tensor([0] + [7] * (b - 1), device=dev, dtype=torch.int32)  # row 0 fresh, the rest resumed
        inp["ssm"][slots[0]] = float("nan")  # a fresh sequence must not read its slot
        pools = [inp["ssm"]] + ([] if args.dry_run else [inp["ssm"].clone() for _ in range(LAYERS - 1)])
        shape = f"B={b} Hv={hv} dk={dk} dv={dv}"
        state_bytes = 2 * b * hv * dk * dv * 4
        for bv, w in pairs:
            if bv is None and w < 4:
                continue  # one program per head: a [dk, dv] tile, 4 or 8 warps
            rec = dict(shape=shape, config=f"dv{bv or dv} w{w}")
            if time.monotonic() > deadline:
                sink.emit({**rec, "skipped": True})
                continue
            try:
                pool = pools[0].clone()
                out = torch.full((b, hv * dv), float("nan"), dtype=torch.bfloat16, device=dev)

                def step(pl, o=None, bv=bv, w=w):
                    return gdn_decode_step(inp["qkv"], inp["z"], inp["a"], inp["b"], inp["a_log"],
                                           inp["dt_bias"], inp["norm_w"], pl, slots, ctx, hk, 1e-6, out=o,
                                           dv_block=bv, num_warps=w)

                y = step(pool, out)
                err_out = err_state = 0.0
                for i in sorted({0, b - 1}):
                    st = None if int(ctx[i]) == 0 else pools[0][slots[i]].double()
                    ry, rs = gdn_step_reference(inp, i, hk, dk, st)
                    err_out = max(err_out, rel_err(y[i], ry))  # (inf for NaN: the poison, a NaN state)
                    err_state = max(err_state, rel_err(pool[slots[i]], rs))
                # the check_gdn_decode bounds: 4 bf16 roundings in the norm, the state to fp32 rounding
                ok = bool(torch.isfinite(y).all()) and err_out <= 4 * BF16_EPS * SLACK and err_state <= 1e-5
                us = how = None
                if dev.type == "cuda":
                    from sweep_common import time_graph

                    us, how = time_graph([lambda pl=pl: step(pl) for pl in pools], dev, args.replays)
                sink.emit({**rec, "us": us, "timing": how, "gbs": state_bytes / us / 1e3 if us else 0.0,
                           "err_out": err_out, "err_state": err_state, "ok": ok})
            except Exception as exc:  # noqa: BLE001  a configuration that does not launch is a result
                sink.emit({**rec, "ok": False, "error": repr(exc)[:400]})
        del pools
    return sink.finish()


if __name__ == "__main__":
    sys.exit(main())
