"""One-call device sweep of the decode kernels' launch shapes: moe_decode_v2 (MoeLaunch, top-k placement, inline_prep)
and affine_gemv ((BN, CG, num_warps), inline_prep) at the Qwen3.6-35B-A3B decode shapes (H 2048, E 256, top-8,
I 512, shared I 512, q4 g64 experts, 8-bit g64 router and shared-expert gate; GEMVs 12352x2048, 2048x4096,
9216x2048, 248320x2048 q4 g64), T / M in (1, 8).

Every configuration is CHECKED before it is timed: against the fp64 reference (computed once per shape), against
the default configuration's output (bit equality reported: `bits` column; expected where only the launch shape
changes and each weight's chunking CG is unchanged, see below), and for batch invariance (rows 0 and T-1 of the
T-row call equal to the same rows run alone, bit for bit). Timing: a CUDA graph of 40 calls (one per "layer",
each on its own input and, for the GEMVs, on its own weight copy so that the weights are not L2-resident) replayed
after warm-up, CUDA events; us per call and GB/s of the weight bytes the call reads (MoE: the router, the shared
gate and expert, and the distinct routed experts of the call's tokens; GEMV: the packed weight + scales + biases).

Bit equality across configurations: a feature's reduction is acc[BN, CG] over chunks, then a sum over CG (and over
a group's words inside each chunk). BN alone changes which features a program owns, not the per-feature order, but
(a) the default CG = chunk_groups(w, BN) shrinks as BN grows, which regroups the sum, and (b) tl.sum's tree follows
the register layout, which depends on the tile shape and num_warps. So the sweep reports bit equality rather than
assuming it; configurations with `cg` held at the BN = 8 value isolate (a) from (b). inline_prep=False sums x's
groups in another fixed order (within 1 bf16 ulp, not bitwise).

  python lab/sweep_decode_kernels.py [--quick] [--out FILE] [--budget-s 400] [--only moe|gemv] [--ts 1,8,64]
  python lab/sweep_decode_kernels.py --dry-run   # CPU, TRITON_INTERPRET=1, tiny shapes, checks only
Exit status 1 when any configuration fails its checks. Configurations reached after --budget-s (MoE gets the first
55% of it) are listed as skipped, so one device call stays under its limit whatever the compile times are; the
order of each grid is the order of interest (default first). Not yet run on a GPU: compile times are unmeasured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import RecordSink, rel_err, start, time_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(h=2048, e=256, k=8, i=512, i_s=512, ts=(1, 8), gemv=((12352, 2048), (2048, 4096), (9216, 2048),
                                                                  (248320, 2048)), calls=40)
# the dry run's GEMVs: one K = H weight and one wider-K weight (the four FULL shapes differ only in N and K)
TINY = dict(h=128, e=4, k=2, i=64, i_s=64, ts=(1, 3), gemv=((96, 128), (64, 256)), calls=1)
BITS, GROUP, GATE_BITS = 4, 64, 8
EPS = 2.0**-8  # bf16 ulp at 1
L2_BYTES = 256 << 20  # GEMV weight copies cycled per graph: more than the H200's 50 MB L2 several times over


# ------------------------------------------------------------------ judging (pure torch: unit-tested on CPU)


def judge(got, ref64, base, alone_rows, rel_ref: float, rel_base: float) -> dict:
    """Verdict for one configuration's output `got` [T, N]: vs the fp64 reference (tolerance rel_ref of max|ref|),
    vs the default configuration's output `base` (rel_base, and whether bit-identical), batch invariance
    (alone_rows: {row index: that row computed alone}, compared bit for bit)."""
    err_ref = rel_err(got, ref64)
    err_base = rel_err(got, base)
    invariant = all(torch.equal(got[r : r + 1], y) for r, y in alone_rows.items())
    ok = err_ref <= rel_ref and err_base <= rel_base and invariant
    return dict(ok=ok, err_ref=err_ref, err_base=err_base, same_bits=bool(torch.equal(got, base)),
                batch_invariant=invariant)


# ------------------------------------------------------------------ configuration grids


def moe_grid(quick: bool, cg_gu: int, cg_dn: int) -> list[dict]:
    """MoE configurations, the default first. Keys: gu/dn (bn, warps, cg or None), cb (bc, warps), topk ("router":
    at the router's last arrival, "split": its own launch; the top-k in every gate/up program lost and is gone), inline, regs
    (maxnreg of gate/up, of down; None: the compiler's).
    cg_gu / cg_dn: the default chunking (BN = 8) of the gate/up and down weights, for the CG-held variants.
    The quick grid: the default, the chunked gate/up that was the default before the row runs, and the row-run
    shapes the 2026-11-30 sweep left close (lab/NOTES.md); register caps, other BN/warps and BC (slower on 2026-11-29)
    are in the full grid. The default top-k is the model's: its own launch
    (moe_route(separate_topk=True), the model's)."""
    base = dict(gu=(4, 2, "row"), dn=(8, 2, None), cb=(256, 4), topk="split", inline=True, regs=(None, None))
    out = [base]
    if quick:
        # the default before row runs (gu 8/4, chunked), and the row-run shapes the 2026-11-30 sweep left close
        # ("row": CG = the weight's K / GROUP, "half": half that; resolved by moe_call)
        return out + [{**base, "gu": (8, 4, None)}, {**base, "gu": (8, 2, "row")}, {**base, "dn": (16, 1, "row")},
                      {**base, "topk": "router"}, {**base, "inline": False}]
    pairs = [(bn, w) for bn in (4, 8, 16, 32) for w in (2, 4, 8)]
    out += [{**base, "regs": r} for r in ((128, None), (96, None), (None, 64))]
    out += [{**base, "gu": (bn, w, None)} for bn, w in pairs if (bn, w) != base["gu"][:2]]
    out += [{**base, "dn": (bn, w, None)} for bn, w in pairs if (bn, w) != base["dn"][:2]]
    out += [{**base, "gu": (bn, 4, cg_gu)} for bn in (4, 16, 32)] + [{**base, "gu": (4, 1, "half")}]
    out += [{**base, "dn": (bn, 4, cg_dn)} for bn in (4, 16, 32)]
    out += [{**base, "cb": cb} for cb in [(128, 4), (512, 4), (1024, 4), (256, 2), (1024, 8)]]
    out += [{**base, "topk": "router"}, {**base, "inline": False},
            {**base, "topk": "router", "inline": False}]
    return out


def gemv_grid(quick: bool) -> list[dict]:
    """GEMV configurations (bn, warps, inline: None = the library's auto choice; rowrun: CG and warps from
    triton_gemv.row_run_config, "half": half that chunk at half the warps), the default first. Without rowrun, CG is
    chunk_groups(weight, bn) as the library's chunked rule would pick for that BN. Quick: the default, the two
    chunked shapes that were the default before the row runs (8/4, and 4/2 for the out projections) and row runs
    of 8 rows."""
    out = [dict(bn=None, warps=None, inline=None), dict(bn=None, warps=None, inline=True),
           dict(bn=8, warps=4, inline=None), dict(bn=4, warps=2, inline=None),
           dict(bn=8, warps=None, inline=None, rowrun=True)]
    if quick:
        return out
    out += [dict(bn=bn, warps=w, inline=None) for bn in (2, 4, 8, 16, 32) for w in (1, 2, 4, 8)
            if (bn, w) not in ((8, 4), (4, 2))]
    out += [dict(bn=bn, warps=None, inline=None, rowrun=True) for bn in (2, 16)]
    out += [dict(bn=bn, warps=None, inline=None, rowrun="half") for bn in (4, 8)]
    return out + [dict(bn=bn, warps=None, inline=True, rowrun=True) for bn in (4, 8)]


def gemv_config(tg, spec, c: dict) -> tuple[int, int, int]:
    """(BN, CG, warps) of a gemv_grid entry for one weight. Row-run entries on rows too short for
    row_run_config (the dry run's tiny weights) take the whole row in one warp."""
    if c["bn"] is None:
        return tg.default_config(spec)
    if c.get("rowrun"):
        bn, cg, warps = tg.row_run_config(spec, c["bn"]) or (c["bn"], spec.k // tg.unit(spec), 1)
        if c["rowrun"] == "half" and warps > 1:
            return bn, cg // 2, warps // 2
        return bn, cg, warps
    return c["bn"], tg.chunk_groups(spec, c["bn"]), c["warps"]


def moe_label(c: dict) -> str:
    def part(v):
        return "/".join(str(a) for a in v if a is not None) + ("" if len(v) < 3 or v[2] is None else "cg")
    regs = c.get("regs", (None, None))
    flags = (
        "" if c["topk"] == "router" else f" topk-{c['topk']}") + ("" if c["inline"] else " prep") + (
        "" if regs == (None, None) else f" regs={regs[0] or '-'}/{regs[1] or '-'}")
    return f"gu={part(c['gu'])} dn={part(c['dn'])} cb={part(c['cb'])}{flags}{' CANARY' if c.get('corrupt') else ''}"


def moe_bits_expected(c: dict, gu_cg_of, dn_cg_of, base: dict | None = None) -> bool:
    """Only the launch shape changes (each weight's CG as the base configuration's, the same x path): bit
    equality with the base (default: moe_grid's first) is expected. *_cg_of(bn, cg): the CG a (bn, cg) entry
    gives that weight (cg None: chunk_groups at bn; "row"/"half": the whole or half K; an int: itself)."""
    base = base or moe_grid(True, 1, 1)[0]
    same_cg = all(cg_of(*c[key][::2]) == cg_of(*base[key][::2]) for key, cg_of in (("gu", gu_cg_of), ("dn", dn_cg_of)))
    return same_cg and c["inline"] == base["inline"]


def named_cg(spec, cg):
    """A MoE grid entry's cg for a WeightSpec: "row" = the whole K in one chunk (K / GROUP groups), "half" = half
    of it; None (the library's chunk_groups) and ints as given."""
    groups = spec.k // GROUP
    return {"row": groups, "half": max(1, groups // 2)}.get(cg, cg)


def resolve_cg(spec):
    """cg_of for moe_bits_expected: (bn, cg) -> the CG moe_call gives `spec` (a WeightSpec)."""
    from deltaserve.kernels.quant.triton_gemv import chunk_groups

    def cg_of(bn, cg):
        return named_cg(spec, cg) or chunk_groups(spec, bn)
    return cg_of


# ------------------------------------------------------------------ MoE


def moe_setup(shp, device):
    """Weights (built once), the kwargs of moe_decode_v2 less x/residual, and the fp64 pieces of the reference."""
    from kernel_cases import affine_weight

    from deltaserve.kernels.triton_common import WeightSpec

    h, e, i, i_s = shp["h"], shp["e"], shp["i"], shp["i_s"]

    def weight(shape, bits):
        p, s, b, wd = affine_weight(shape, bits, GROUP, device)
        return WeightSpec(p, s, b, bits, GROUP), wd

    (router, r64), (sgate, sgate64) = weight((e, h), GATE_BITS), weight((1, h), GATE_BITS)
    (gate, g64), (up, u64), (down, d64) = weight((e, i, h), BITS), weight((e, i, h), BITS), weight((e, h, i), BITS)
    (sg, sg64), (su, su64), (sd, sd64) = weight((i_s, h), BITS), weight((i_s, h), BITS), weight((h, i_s), BITS)
    kw = dict(router=router, gate=gate, up=up, down=down, shared_gate_proj=sg, shared_up=su, shared_down=sd,
              shared_gate=sgate)
    ref = dict(r=r64, g=g64, u=u64, d=d64, sg=sg64, su=su64, sd=sd64, sgate=sgate64)
    return kw, ref


def spec_bytes(spec, rows: slice | None = None) -> int:
    ts = (spec.w, spec.scales, spec.biases)
    return sum((t[rows] if rows is not None else t).numel() * t.element_size() for t in ts)


def moe_bytes(kw, ids) -> float:
    """Weight bytes one call reads: router + shared gate + shared expert + each distinct routed expert once."""
    per_expert = sum(spec_bytes(kw[n], slice(0, 1)) for n in ("gate", "up", "down"))
    fixed = sum(spec_bytes(kw[n]) for n in ("router", "shared_gate", "shared_gate_proj", "shared_up", "shared_down"))
    return fixed + per_expert * len(set(ids.reshape(-1).tolist()))


def moe_call(m2, kw, top_k, c):
    from deltaserve.kernels.moe.triton_moe_gemv import MoeLaunch

    regs = c.get("regs", (None, None))
    launch = MoeLaunch(gate_up_bn=c["gu"][0], gate_up_warps=c["gu"][1], gate_up_cg=named_cg(kw["gate"], c["gu"][2]),
                       gate_up_row_run=False,
                       down_bn=c["dn"][0], down_warps=c["dn"][1], down_cg=named_cg(kw["down"], c["dn"][2]),
                       combine_bc=c["cb"][0], combine_warps=c["cb"][1], gate_up_maxnreg=regs[0], down_maxnreg=regs[1])

    def run(x, res):
        y = m2.moe_decode_v2(x, top_k=top_k, residual=res, launch=launch,
                             separate_topk=c["topk"] == "split", inline_prep=c["inline"], **kw)
        if c.get("corrupt"):  # the canary: a deliberately wrong output the checks must flag
            y[0, 0] += 0.25 * y.float().abs().max().to(y.dtype)
        return y
    return run


def moe_section(args, shp, device, deadline, emit) -> None:
    """Per T: the default configuration's output and the fp64 reference once, then every configuration checked
    (judge) and timed over shp["calls"] distinct inputs (distinct expert picks: the experts are not L2-resident)."""
    from kernel_cases import moe_reference

    from deltaserve.kernels import launch_table
    from deltaserve.kernels.moe import triton_moe_gemv as m2
    from deltaserve.kernels.quant.triton_gemv import chunk_groups

    kw, ref = moe_setup(shp, device)
    bn = launch_table.value("moe_gemv.bn")
    cg_gu, cg_dn = chunk_groups(kw["gate"], bn), chunk_groups(kw["down"], bn)
    grid = moe_grid(args.quick, cg_gu, cg_dn)
    if args.canary:
        grid.append({**grid[0], "corrupt": True})
    k = shp["k"]
    for t in shp["ts"]:
        shape = f"T={t} H={shp['h']} E={shp['e']} k={k} I={shp['i']} IS={shp['i_s']} q{BITS}g{GROUP} gates q{GATE_BITS}"
        xs = [torch.randn(t, shp["h"], device=device).bfloat16() for _ in range(shp["calls"])]
        rs = [torch.randn(t, shp["h"], device=device).bfloat16() for _ in range(shp["calls"])]
        want, _, _ = moe_reference(xs[0], {**ref, "res": rs[0].double()}, k)
        default = moe_call(m2, kw, k, grid[0])
        base = default(xs[0], rs[0])
        nbytes = 0.0
        if device.type == "cuda":  # only timed runs report GB/s
            nbytes = sum(moe_bytes(kw, m2.moe_decode_v2(x, top_k=k, return_routing=True, **kw)[1].ids) for x in xs)
            nbytes /= len(xs)
        for c in grid:
            rec = dict(kernel="moe_decode_v2", shape=shape, config=moe_label(c), cfg=c,
                       bits_expected=moe_bits_expected(c, resolve_cg(kw["gate"]), resolve_cg(kw["down"]),
                                                       grid[0]))
            if time.monotonic() > deadline:
                emit({**rec, "ok": None, "skipped": "budget"})
                continue
            try:
                run = moe_call(m2, kw, k, c)
                got = run(xs[0], rs[0])
                rows = {r: run(xs[0][r : r + 1], rs[0][r : r + 1]) for r in sorted({0, t - 1})}
                verdict = judge(got, want, base, rows, 8 * EPS * args.slack, 2 * EPS * args.slack)
                fns = [lambda x=x, r=r, run=run: run(x, r) for x, r in zip(xs, rs)]
                us, how = time_graph(fns, device, args.replays)
                emit({**rec, **verdict, "us": us, "timing": how, "gbs": nbytes / us / 1e3 if us else None})
            except Exception as exc:  # noqa: BLE001  a config that fails to compile or launch is a result
                emit({**rec, "ok": False, "error": repr(exc)[:300]})
    del kw, ref


# ------------------------------------------------------------------ GEMV


def gemv_weights(n, k, device):
    """(copies [(p, s, b)], fp64 W): enough clones that cycling them through a graph of calls overflows L2."""
    from kernel_cases import affine_weight

    p, s, b, wd = affine_weight((n, k), BITS, GROUP, device)
    size = sum(t.numel() * t.element_size() for t in (p, s, b))
    copies = 1 if device.type != "cuda" else max(1, min(40, -(-L2_BYTES // size)))
    return [(p, s, b)] + [(p.clone(), s.clone(), b.clone()) for _ in range(copies - 1)], wd, size


def gemv_section(args, shp, device, deadline, emit) -> None:
    from deltaserve.kernels.quant import triton_gemv as tg

    grid = gemv_grid(args.quick)
    for n, kk in shp["gemv"]:
        ws, wd, size = gemv_weights(n, kk, device)
        spec = tg.gemv_spec(*ws[0], BITS, GROUP, "sweep weight")
        m_max = max(shp["ts"])
        x_all = [torch.randn(m_max, kk, device=device).bfloat16() for _ in range(shp["calls"])]
        want = (x_all[0].double() @ wd.t()).cpu()
        del wd
        for m in shp["ts"]:
            xs = [x[:m].contiguous() for x in x_all]
            base = tg.affine_gemv(xs[0], *ws[0], BITS, GROUP)
            for c in grid:
                # bn None: the library's default_config for this weight
                config = gemv_config(tg, spec, c)
                inl = tg.use_inline_prep(spec, c["inline"])
                base_cfg = tg.default_config(spec)
                rec = dict(kernel="affine_gemv", shape=f"M={m} N={n} K={kk} q{BITS}g{GROUP}",
                           config=f"bn={config[0]} cg={config[1]} w={config[2]} {'inline' if inl else 'prep'}"
                                  f"{'' if c['inline'] is not None else '(auto)'}"
                                  f"{' default' if c['bn'] is None else ''}",
                           cfg=c, bits_expected=config[1] == base_cfg[1] and inl == tg.use_inline_prep(spec, None))
                if time.monotonic() > deadline:
                    emit({**rec, "ok": None, "skipped": "budget"})
                    continue
                try:
                    def run(x, w, config=config, inl=c["inline"]):
                        return tg.affine_gemv(x, *w, BITS, GROUP, config=config, inline_prep=inl)
                    got = run(xs[0], ws[0])
                    rows = {r: run(xs[0][r : r + 1], ws[0]) for r in sorted({0, m - 1})}
                    verdict = judge(got, want[:m], base, rows, 2 * EPS * args.slack, EPS * args.slack)
                    pairs = [(x, ws[j % len(ws)]) for j, x in enumerate(xs)]  # call j on weight copy j % copies
                    fns = [lambda x=x, w=w, run=run: run(x, w) for x, w in pairs]
                    us, how = time_graph(fns, device, args.replays)
                    emit({**rec, **verdict, "us": us, "timing": how, "gbs": size / us / 1e3 if us else None})
                except Exception as exc:  # noqa: BLE001  a failing configuration is a result
                    emit({**rec, "ok": False, "error": repr(exc)[:300]})
        del ws


# ------------------------------------------------------------------ driver


def fmt(rec: dict) -> str:
    us = f"{rec['us']:8.2f}" if rec.get("us") else "       -"
    gbs = f"{rec['gbs']:7.0f}" if rec.get("gbs") else "      -"
    if rec.get("skipped"):
        verdict = "skipped"
    elif rec.get("error"):
        verdict = "FAIL " + rec["error"][:60]
    else:
        bits = "=" if rec["same_bits"] else ("~!" if rec["bits_expected"] else "~")
        verdict = (f"{'ok  ' if rec['ok'] else 'FAIL'} bits{bits:2} err {rec['err_ref']:.1e} "
                   f"inv {'y' if rec['batch_invariant'] else 'N'}")
    return f"{rec['kernel']:14} {rec['shape'][:44]:44} {rec['config'][:44]:44} {us} {gbs}  {verdict}"


def summary(records: list[dict]) -> None:
    """Per (kernel, shape): the default's time and the fastest passing configuration's."""
    print("\n# best per shape (ok configurations only)")
    keys = dict.fromkeys((r["kernel"], r["shape"]) for r in records)
    for key in keys:
        mine = [r for r in records if (r["kernel"], r["shape"]) == key]
        rs = [r for r in mine if r.get("ok") and r.get("us")]
        if not rs or rs[0] is not mine[0]:  # untimed (dry run), or the default itself failed or was skipped
            continue
        dflt, best = rs[0], min(rs, key=lambda r: r["us"])
        print(f"{key[0]:14} {key[1][:44]:44} default {dflt['us']:.2f} us -> {best['us']:.2f} us "
              f"({dflt['us'] / best['us']:.2f}x) {best['config']}")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes, no timing")
    ap.add_argument("--quick", action="store_true", help="the smaller grid")
    ap.add_argument("--only", choices=("moe", "gemv", "all"), default="all")
    ap.add_argument("--out", help="JSON lines file (default $OUT/sweep_decode_kernels.jsonl if $OUT is set)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="configurations past this are skipped")
    ap.add_argument("--replays", type=int, default=10, help="graph replays timed (x 40 calls each)")
    ap.add_argument("--ts", help="comma-separated T (= GEMV M) values instead of 1,8 (dry run: 1,3)")
    ap.add_argument("--canary", action="store_true", help="add a deliberately corrupted MoE config (must FAIL)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    args = parse(argv)
    status = start(args.dry_run, __file__, argv)
    if status is not None:
        return status
    device = torch.device("cpu" if args.dry_run else "cuda")
    shp = dict(TINY if args.dry_run else FULL)
    if args.ts:
        shp["ts"] = tuple(int(v) for v in args.ts.split(","))
    args.slack = 2.0 if args.dry_run else 1.0  # the interpreter truncates fp32 -> bf16 (kernel_cases.SLACK)
    out = args.out or (os.path.join(os.environ["OUT"], "sweep_decode_kernels.jsonl") if os.environ.get("OUT") else None)
    sink = RecordSink(out, fmt)
    records, emit, t0 = sink.records, sink.emit, sink.t0

    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU, Triton interpreter (checks only)'}; "
          f"columns: kernel, shape, config, us/call, GB/s, verdict (bits: '=' same as default, '~' not, '~!' not "
          f"though only the launch shape changed; err: vs fp64 / max|ref|; inv: batch invariant)", flush=True)
    torch.manual_seed(0)
    budget = float("inf") if args.dry_run else args.budget_s
    if args.only in ("moe", "all"):
        moe_section(args, shp, device, t0 + (0.55 * budget if args.only == "all" else budget), emit)
    if args.only in ("gemv", "all"):
        gemv_section(args, shp, device, t0 + budget, emit)
    summary(records)
    return sink.finish()


if __name__ == "__main__":
    sys.exit(main())
