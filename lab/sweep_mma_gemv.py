"""The tensor-core GEMV (kernels/quant/mma_gemv.py) against the CUDA-core GEMV (triton_gemv.affine_gemv, the decode
default) at the decode linears of Qwen3.6-35B-A3B (q4 g64), for 1, 8 and 64 rows of x.

Every configuration is checked before it is timed: NaN-poisoned output against fp64 (within 2 bf16 ulps of
max|ref|), and batch invariance (the first and last rows computed alone equal, bit for bit, to the same rows in the
full launch). Timing: a CUDA graph of 40 calls cycling weight copies past the L2 (sweep_common.time_graph). The
CUDA-core GEMV serves at most 16 rows per call, so its 64-row time is 4 calls of 16 rows (what the model's decode
does at 64 streams). --after-norm times norm + GEMV pairs instead: in a chain of identical GEMVs
each one's PDL prologue overlaps the previous one's tail, which the model (a one-program norm before each GEMV) does
not give it (lab/NOTES.md: the tensor-core GEMV lost in the model what it won in the plain sweep).

  python lab/sweep_mma_gemv.py [--ms 1,8,64] [--out FILE] [--budget-s 300] [--after-norm]
  python lab/sweep_mma_gemv.py --moe [--moe-tiles] [--ms 1,8,64,512]   # the MoE block: CUDA vs tensor cores
  python lab/sweep_mma_gemv.py --experts [--ms 1,8,64,512] [--wstages 3,5]   # the experts kernel: W x AHEAD x
                                        # LOOP x own sums x the weight words' shared-memory slots
  python lab/sweep_mma_gemv.py --compile-only [--quick]   # no GPU: compiles the configurations for sm_90,
                                        # checks the repack's round trip, prints registers and SASS counts
Exit status 1 when any configuration fails its checks.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--compile-only" in sys.argv:
    os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported

import torch
from sweep_common import ROOT, RecordSink, fmt_timed, rel_err, time_graph

SHAPES = ((12352, 2048), (248320, 2048), (2048, 4096), (9216, 2048))
EPS = 2.0**-8
L2_BYTES = 256 << 20
ROUTINGS = 16  # the experts section's calls per graph, each with its own routing (its experts past the L2)
CALLS = 40


def configs(n: int, k: int, m: int = 1) -> list[tuple[int, int, int]]:
    """(W, RB, AHEAD) at m rows of x: the default first, then the others (W changes bits, RB and AHEAD do not);
    AHEAD = every chunk (the weight requested whole before the PDL wait) only at one row block and up to 8 rows."""
    from deltaserve.kernels.quant import mma_gemv as mg

    g, nb = k // mg.GROUP, n // mg.ROW_BLOCK
    w0 = mg.default_warps(k)
    rest = [(w, rb, ah) for w in (w0,) for rb in (1, 2, 4, 8) for ah in (1, 2, 4, g // w0 - 1, g // w0)
            if g % w == 0 and nb % rb == 0 and (ah <= 2 or (rb == 1 and m <= 8))]  # 3 .. chunks - 1: the ring
    base = mg.default_config(k, m, nb)
    return [base] + [c for c in dict.fromkeys(rest) if c != base]


def compile_only(quick: bool = False) -> int:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from kernel_cases import affine_weight
    from sass_report import _tool, install, instructions

    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, _ = affine_weight((64, 256), 4, 64, "cpu")
    words, sb = mg.repack_q4(p, s, b)
    q, s2, b2 = mg.unpack_q4(words, sb)
    codes = ((p.view(torch.int32)[..., None] >> (torch.arange(8, dtype=torch.int32) * 4)) & 15).reshape(64, 256)
    assert torch.equal(q, codes.long()) and torch.equal(s2, s) and torch.equal(b2, b), "repack round trip"
    compiled = install(pdl=True)
    for n, k in SHAPES[:1] if quick else SHAPES[:3]:
        g = k // mg.GROUP
        for m in (1, 64) if quick else (1, 8, 64):
            for w, rb, ah in configs(n, k)[: 1 if quick else 3]:
                before = set(compiled)
                x = torch.empty(m, k, dtype=torch.bfloat16)
                xsum = torch.empty(m, g, dtype=torch.float32)
                wq = torch.empty(n // 16, g, 128, dtype=torch.int32)
                sbq = torch.empty(n // 16, g, 8, 2, 2, dtype=torch.bfloat16)
                out = torch.empty(m, n, dtype=torch.bfloat16)
                for self_xs in (False, True):  # the loaded group sums, and the kernel's own (MMA with ones)
                    mg._mma_gemv_kernel[(n // 16 // rb,)](x, xsum, wq, sbq, out, m, k, g, n, x, x, x, x, 0, 0, 0, 0,
                                                          0, 0, K=k, W=w, RB=rb, NT=mg.column_tiles(m), AHEAD=ah,
                                                          PDL=True, SELF_XS=self_xs, num_warps=w)
                for label in set(compiled) - before:
                    lines = instructions(compiled[label])
                    ops = [re.sub(r"^.*\*/\s+(@!?U?P\w+\s+)?", "", ln).split()[0] for ln in lines]
                    regs = re.search(r"REG:(\d+)", _tool(["cuobjdump", "-res-usage"], compiled[label].asm["cubin"]))
                    count = {op: sum(o.startswith(op) for o in ops) for op in ("HMMA", "LDG", "LOP3", "STS", "LDS")}
                    print(f"N={n} K={k} W={w} RB={rb} AHEAD={ah} M={m}: {regs.group(1) if regs else '?'} registers, "
                          f"{len(lines)} SASS, {count}")
    # weights of one or two chunks per warp (small K: the tiny test models), where AHEAD 1 / 2 reach the chunk count
    # and take the whole-slice form, with and without PDL
    for n, k, ah, pdl in ((64, 128, 1, True), (64, 128, 2, False), (64, 64, 1, True), (64, 64, 1, False)):
        before = set(compiled)
        g, m = k // mg.GROUP, 1
        x, out = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(m, n, dtype=torch.bfloat16)
        mg._mma_gemv_kernel[(n // 16,)](x, x, torch.empty(n // 16, g, 128, dtype=torch.int32),
                                        torch.empty(n // 16, g, 8, 2, 2, dtype=torch.bfloat16), out, m, k, g, n, x,
                                        x, x, x, 0, 0, 0, 0, 0, 0, K=k, W=1, RB=1, NT=1, AHEAD=ah, PDL=pdl,
                                        SELF_XS=True, num_warps=1)
        for label in set(compiled) - before:
            hmma = sum("HMMA" in ln for ln in instructions(compiled[label]))
            print(f"FEW N={n} K={k} AHEAD={ah} PDL={pdl}: {hmma} HMMA")
    # the experts kernel at the MoE's gate/up (K = 2048, gated: SiLU(g) * u) and down (K = 512, scaled fp32), 64
    # tokens x top-8 + the shared expert stacked last: sorted tiles of 8 rows and single-row tiles, 1 and 4 row blocks
    e, t, slots = 257, 64, 9
    m = t * slots
    # (down's own group sums (SELF_XS) in both tile forms, and its combine at the last arrival in the single form)
    for n, k, xrep, gated, single, rb, self_xs, comb in (
            (512, 2048, slots, True, False, 4, False, False), (2048, 512, 1, False, False, 4, True, False),
            (512, 2048, slots, True, True, 1, False, False), (2048, 512, 1, False, True, 1, True, True),
            (2048, 512, 1, False, True, 1, False, False)):
        if quick and single and not comb:
            continue
        before = set(compiled)
        tiles = m if single else -(-m // 8) + e
        wq = torch.empty(e, n // 16, k // 64, 128, dtype=torch.int32)
        sbq = torch.empty(e, n // 16, k // 64, 8, 2, 2, dtype=torch.bfloat16)
        comb_out = torch.empty(t, n, dtype=torch.bfloat16)
        mx._mma_experts_kernel[(tiles, n // 16 // rb)](
            torch.empty(m // xrep, k, dtype=torch.bfloat16), torch.empty(m // xrep, k // 64), wq, sbq, wq, sbq,
            torch.empty(m, n, dtype=torch.bfloat16 if gated else torch.float32), torch.empty(m),
            *(torch.empty(tiles, dtype=torch.int32) for _ in range(3)), torch.empty(m, dtype=torch.int32), k,
            k // 64, n, n // 16, comb_out, comb_out, torch.zeros(t * n // 16, dtype=torch.int32), n, n, XREP=xrep,
            K=k, W=mg.default_warps(k), NT=1, RB=rb, SINGLE=single, GATED=gated, SCALED=not gated, PDL=True,
            SELF_XS=self_xs, COMBINE=comb, SLOTS=slots, HAS_RES=comb, num_warps=mg.default_warps(k))
        for label in set(compiled) - before:
            lines = instructions(compiled[label])
            hmma = sum("HMMA" in ln for ln in lines)
            sts = sum(" STS" in ln for ln in lines)
            atom = sum("ATOM" in ln or "RED" in ln for ln in lines)
            print(f"EXPERTS N={n} K={k} {'gated' if gated else 'scaled'} {'single' if single else 'sorted'} RB={rb}"
                  f"{' self-xs' if self_xs else ''}{' combine' if comb else ''}: {len(lines)} SASS, {hmma} HMMA, "
                  f"{sts} STS, {atom} ATOM")
    # the plain launch over [gate; up] rows with h at each block pair's second arrival (the split gate/up layout the
    # model no longer uses; the kernel keeps the forms)
    # (PAIR), and down making h from g | u as it loads (GLU), single-row tiles at one token
    t1 = slots
    for n, k, pair, glu in ((1024, 2048, 32, 0), (2048, 512, 0, 512)):
        before = set(compiled)
        wq = torch.empty(e, n // 16, k // 64, 128, dtype=torch.int32)
        sbq = torch.empty(e, n // 16, k // 64, 8, 2, 2, dtype=torch.bfloat16)
        xw = 2 * k if glu else k
        h = torch.empty(t1, 512, dtype=torch.bfloat16)
        mx._mma_experts_kernel[(t1, n // 16)](
            torch.empty(t1, xw, dtype=torch.bfloat16), torch.empty(t1, k // 64), wq, sbq, wq, sbq,
            torch.empty(t1, n, dtype=torch.float32 if glu else torch.bfloat16), torch.empty(t1),
            *(torch.empty(t1, dtype=torch.int32) for _ in range(3)), torch.empty(t1, dtype=torch.int32), xw, k // 64,
            n, n // 16, h, h, torch.zeros(mx.PAIR_COUNTERS, dtype=torch.int32), 512, 512, XREP=1 if glu else slots,
            K=k, W=mg.default_warps(k), NT=1, RB=1, SINGLE=True, GATED=False, SCALED=bool(glu), PDL=True,
            SELF_XS=bool(glu), AHEAD=mx.default_ahead(t1, not glu, k // 64 // mg.default_warps(k)), GLU=glu,
            PAIR=pair, num_warps=mg.default_warps(k))
        for label in set(compiled) - before:
            lines = instructions(compiled[label])
            atom = sum("ATOM" in ln or "RED" in ln for ln in lines)
            print(f"SPLIT N={n} K={k} {'pair' if pair else 'glu'}: {len(lines)} SASS, "
                  f"{sum('HMMA' in ln for ln in lines)} HMMA, {atom} ATOM")
    # the DeltaNet in_proj's conv epilogue (CONV): 8192 conv channels of 12352 features, 8 tokens
    n, k, m, c = 12352, 2048, 8, 8192
    before = set(compiled)
    mg._mma_gemv_kernel[(n // 16,)](torch.empty(m, k, dtype=torch.bfloat16), torch.empty(m, k // 64),
                                    torch.empty(n // 16, k // 64, 128, dtype=torch.int32),
                                    torch.empty(n // 16, k // 64, 8, 2, 2, dtype=torch.bfloat16),
                                    torch.empty(m, n, dtype=torch.bfloat16), m, k, k // 64, n,
                                    torch.empty(c, 4, dtype=torch.bfloat16), torch.empty(9, c, 3, dtype=torch.bfloat16),
                                    torch.zeros(m, dtype=torch.int32), torch.zeros(m, dtype=torch.int32), c, 4, 1,
                                    3 * c, 3, 1, K=k, W=mg.default_warps(k), RB=1, NT=1, AHEAD=1, CONV=True, KCONV=4,
                                    PDL=True, num_warps=mg.default_warps(k))
    for label in set(compiled) - before:
        lines = instructions(compiled[label])
        print(f"CONV N={n} K={k} M={m} C={c}: {len(lines)} SASS, {sum('BAR' in ln for ln in lines)} barriers")
    return 0


def fmt(r: dict) -> str:
    return fmt_timed(f"{r['kernel']:12s} {r['shape']:26s} {r['config']:10s}", r,
                     lambda r: f"err {r['err']:.2e} inv {'yes' if r['inv'] else 'NO'}")


def moe_section(args, sink) -> None:
    """The whole decode MoE block at the 35B-A3B shapes (router, top-8 of 256 experts of 512, a shared expert of
    512): the CUDA-core moe_decode_v2 (the default) against moe_route + moe_block_mma (tensor cores, repacked
    weights), each checked against the fp64 block and for invariance (token 0 alone, bit for bit), then timed in a
    graph of 10 calls on 10 inputs (other experts each call)."""
    import torch.nn.functional as F
    from kernel_cases import moe_problem

    from deltaserve.kernels.moe.mma_moe import moe_block_mma, pack_mma_experts
    from deltaserve.kernels.moe.triton_decode import moe_route
    from deltaserve.kernels.moe.triton_moe_gemv import moe_decode_v2

    dev = torch.device("cuda")
    tmax = max(int(v) for v in args.ms.split(","))
    x0, kw, ref = moe_problem(dev, tmax, 2048, 256, 512, 512, 4, 64)
    parts = [kw[k] for k in ("gate", "up", "down", "shared_gate_proj", "shared_up", "shared_down")]
    experts = pack_mma_experts(*parts)
    res_all = kw.pop("residual")
    inputs = [x0] + [torch.randn_like(x0) for _ in range(9)]

    def cuda_block(x, res):
        return moe_decode_v2(x, top_k=8, residual=res, **kw)

    def mma_block(x, res, rows=None, ex=None):  # as the model runs it: the shared expert routed as slot k
        r = moe_route(x, kw["router"], 8, True, kw["shared_gate"], shared_slot=256)
        return moe_block_mma(x, r.ids, r.weights, r.shared_weight, experts if ex is None else ex, residual=res,
                             tile_rows=rows, shared_slotted=True)

    def mlp(v, a, b, c):
        return (F.silu(v @ a.t()) * (v @ b.t())) @ c.t()

    def reference(t):
        # fp64 block on the kernels' own routing (the same contract and logits for both paths), so a near-tie
        # in the 8-bit router cannot count as an error of either
        r = moe_route(x0[:t], kw["router"], 8, True, kw["shared_gate"])
        xd = x0[:t].double()
        out = ref["res"][:t] + r.shared_weight.double()[:, None] * mlp(xd, ref["sg"], ref["su"], ref["sd"])
        for tok in range(t):
            for j in range(8):
                e = int(r.ids[tok, j])
                out[tok] += r.weights[tok, j].double() * mlp(xd[tok], ref["g"][e], ref["u"][e], ref["d"][e])
        return out

    for t in (int(v) for v in args.ms.split(",")):
        want = reference(t)
        variants = [("moe_decode_v2", "default", cuda_block)] if t <= 64 else []
        variants += [("moe_block_mma", "default", mma_block)]
        variants += [("moe_block_mma", f"tiles{rows}", lambda x, res, rows=rows: mma_block(x, res, rows))
                     for rows in (1, 8, 16, 32) if args.moe_tiles]
        for kernel, config, fn in variants:
            rec = dict(kernel=kernel, shape=f"T={t} H=2048 E=256 I=512 k=8", config=config)
            try:
                got = fn(x0[:t], res_all[:t])
                alone = fn(x0[:1].clone(), res_all[:1].clone())
                inv = torch.equal(got[:1], alone)
                err = rel_err(got, want)
                fns = [lambda x=x, fn=fn, t=t: fn(x[:t], res_all[:t]) for x in inputs]
                us, how = time_graph(fns, dev, args.replays)
                sink.emit({**rec, "us": us, "timing": how, "gbs": 0.0, "err": err, "inv": inv, "ok": err <= 8 * EPS and inv})
            except Exception as exc:  # noqa: BLE001
                sink.emit({**rec, "ok": False, "error": repr(exc)[:400]})


def experts_section(args, sink) -> None:
    """The experts kernel alone at the MoE's shapes (257 experts: 256 routed + the shared one stacked last, top-8 +
    the shared slot): the gated gate/up (I = 512, K = 2048) and the scaled down (H = 2048, K = 512) over W x RB x
    tile rows, at each T of --ms. Checked first: each configuration against its W's reference configuration (single
    rows, RB 1) bit for bit (tile rows and RB never change bits) and that against fp64; then a graph of ROUTINGS
    calls, each on its own input and routing, replayed --replays times. Why its own routing: with one routing every
    call read the same 9 experts (~10 MB of gate/up), which stay in the 50 MB L2 across calls, so T = 1 was timed
    from L2 (gated 6.3 us, down 3.6) while the model reads each layer's experts from DRAM; 16 routings touch ~140
    experts (~150 MB of gate/up) per replay. An earlier form of it (W x RB x tile
    rows) chose mma_gemv.default_warps (K < 1024), default_row_blocks and default_tile_rows (lab/NOTES.md); this
    one takes those tiles and row blocks and varies W, the chunks in flight (AHEAD) and, for down, whether the
    group sums are loaded (prep_x's) or the kernel's own."""
    import torch.nn.functional as F
    from kernel_cases import affine_weight

    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant.triton_gemv import prep_x

    dev = torch.device("cuda")
    num_e, h, i, slots = 257, 2048, 512, 9
    torch.manual_seed(0)

    def stack(n, k):
        p, s, b, wd = affine_weight((num_e, n, k), 4, 64, dev)
        return mx.repack_q4_experts(p, s, b), wd

    gate, g64 = stack(i, h)
    up, u64 = stack(i, h)
    down, d64 = stack(h, i)
    for t in (int(v) for v in args.ms.split(",")):
        routes = [torch.cat([torch.rand(t, 256, device=dev).topk(8, dim=1).indices.sort(dim=1).values,
                             torch.full((t, 1), 256, device=dev)], 1).int() for _ in range(ROUTINGS)]
        flat = routes[0].reshape(-1).long()
        m = t * slots
        xs_in = [torch.randn(t, h, device=dev).bfloat16() for _ in range(ROUTINGS)]
        hs = [torch.randn(m, i, device=dev).bfloat16() for _ in range(ROUTINGS)]
        scale = torch.rand(m, device=dev)
        xr = xs_in[0].double().repeat_interleave(slots, 0)
        def per_expert(inp, w64):  # fp64 row r = inp[r] W[flat[r]]^T, one expert at a time (no [M, N, K] gather)
            res = torch.empty(m, w64.shape[1], dtype=torch.float64, device=dev)
            for e in flat.unique().tolist():
                sel = (flat == e).nonzero().flatten()
                res[sel] = inp[sel] @ w64[e].t()
            return res

        want = {"gated": F.silu(per_expert(xr, g64)) * per_expert(xr, u64),
                "scaled": scale.double()[:, None] * per_expert(hs[0].double(), d64)}
        row_choices = ([int(v) for v in args.tile_rows.split(",")] if args.tile_rows
                       else [mx.default_tile_rows(m, num_e)])
        tables = {rows: [mx.mma_expert_tiles(ids, num_e, rows) for ids in routes] for rows in row_choices}
        # W: the defaults (W 8 for gate/up and W 2 for down were slower at every T, lab/NOTES.md)
        forms = [f for f in (("gated", h, (mg.default_warps(h),)), ("scaled", i, (mg.default_warps(i),)))
                 if f[0] in args.forms.split(",")]
        for form, k, warps in forms:
            ins = xs_in if form == "gated" else hs
            sums = [prep_x(v, 4, 64)[1] for v in ins]
            rep = slots if form == "gated" else 1
            extra = {"up": up} if form == "gated" else {"scale": scale}
            weight = gate if form == "gated" else down
            nbe = weight[0].shape[1]
            rbs = ([int(v) for v in args.rbs.split(",")] if args.rbs
                   else [mx.default_row_blocks(nbe, m, k)])
            for w in warps:
                owns = [v == "own" for v in args.own_xs.split(",")]
                for own in owns if form == "scaled" else (False,):  # down's group sums: loaded or its own
                    base = None  # every tile shape, RB, AHEAD and LOOP must give the same bits
                    # AHEAD = every chunk (the whole weight slice at once) only for decode-sized batches; LOOP
                    # (rounds of row blocks over x staged once) where tiles share experts
                    # and the register ring (3 .. chunks - 1 in flight; chunks - 1: the whole slice up front)
                    nch = k // 64 // w
                    plans = []
                    for rows in row_choices:
                        for rb in rbs:
                            if nbe % rb:
                                continue
                            aheads = tuple(int(v) for v in args.aheads.split(",") if v)
                            loops = tuple(int(v) for v in args.loops.split(",") if v)
                            wstages = tuple(int(v) for v in args.wstages.split(",") if v)
                            plans += [(rows, rb, ahead, 1, 0) for ahead in aheads + ((nch - 1, nch) if t <= 8 else ())]
                            plans += [(rows, rb, 1, loop, 0) for loop in loops if rows > 1 and nbe % (rb * loop) == 0]
                            plans += [(rows, rb, 2, 1, ws) for ws in wstages]
                    for rows, rb, ahead, loop, ws in plans:
                        rec = dict(kernel=f"experts_{form}", shape=f"T={t} E={num_e} k={slots} K={k}",
                                   config=f"W{w} RB{rb} rows{rows} ahead{ahead} loop{loop}{' own-xs' if own else ''}"
                                          + (f" wstage{ws}" if ws else ""))
                        if time.monotonic() > args.deadline:
                            sink.emit({**rec, "skipped": True})
                            continue
                        try:
                            def call(j, w=w, ahead=ahead, own=own, loop=loop, rows=rows, rb=rb, ws=ws):
                                return mx.mma_matmul_experts(ins[j], *weight, routes[j], rep,
                                                             xs=None if own else sums[j], tiles=tables[rows][j],
                                                             config=(w, rb, ahead, loop, ws), **extra)
                            got = call(0)
                            base = got if base is None else base
                            same = torch.equal(got, base)
                            err = rel_err(got, want[form])
                            us, how = time_graph([lambda j=j: call(j) for j in range(ROUTINGS)], dev,
                                                 args.replays)
                            sink.emit({**rec, "us": us, "timing": how, "gbs": 0.0, "err": err, "inv": same,
                                       "ok": same and err <= 8 * EPS})
                        except Exception as exc:  # noqa: BLE001  a configuration that does not compile is reported
                            sink.emit({**rec, "ok": False, "error": repr(exc)[:400]})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="compile-only: the default configuration at M = 1 and 64")
    ap.add_argument("--ms", default="1,8,64")
    ap.add_argument("--shapes", help="N:K,N:K instead of the four decode linears")
    ap.add_argument("--out")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--moe", action="store_true", help="the whole decode MoE block instead of the GEMVs")
    ap.add_argument("--moe-tiles", action="store_true", help="--moe: also each tile shape of the tensor-core block")
    ap.add_argument("--experts", action="store_true",
                    help="the experts kernel alone (gated gate/up, scaled down) over W x RB x tile rows")
    ap.add_argument("--tile-rows", help="--experts: rows per tile to try (e.g. 8,16,32; default: the library's)")
    ap.add_argument("--rbs", help="--experts: row blocks per program to try (default: the library's)")
    ap.add_argument("--forms", default="gated,scaled", help="--experts: which of gated, scaled")
    ap.add_argument("--aheads", default="1,2,4", help="--experts: chunks in flight to try past 8 tokens")
    ap.add_argument("--loops", default="2,4,8", help="--experts: LOOP rounds to try with sorted tiles")
    ap.add_argument("--wstages", default="", help="--experts: the weight words' shared-memory slots to try (WSTAGE)")
    ap.add_argument("--own-xs", default="loaded,own", help="--experts, scaled: the group sums loaded, own, or both")
    ap.add_argument("--after-norm", action="store_true",
                    help="time each GEMV after the RMSNorm that makes its input and group sums (as in the model: a "
                         "one-program kernel before every GEMV, not the previous GEMV's tail)")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(args.quick)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gpu")]
    from kernel_cases import affine_weight

    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import triton_gemv as tg
    from deltaserve.kernels.triton_norm import rms_norm

    out = args.out or (os.path.join(os.environ["OUT"], "sweep_mma_gemv.jsonl") if os.environ.get("OUT") else None)
    sink = RecordSink(out, fmt, {"gpu": torch.cuda.get_device_name()})
    deadline = time.monotonic() + args.budget_s
    args.deadline = deadline
    if args.experts:
        experts_section(args, sink)
        return sink.finish()
    if args.moe:
        moe_section(args, sink)
        return sink.finish()
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    ms = [int(v) for v in args.ms.split(",")]
    torch.manual_seed(0)
    dev = torch.device("cuda")
    for n, k in shapes:
        p, s, b, wd = affine_weight((n, k), 4, 64, dev)
        words, sb = mg.repack_q4(p, s, b)
        size = sum(t.numel() * t.element_size() for t in (p, s, b))
        copies = max(1, min(CALLS, -(-L2_BYTES // size)))
        packed = [(p, s, b)] + [(p.clone(), s.clone(), b.clone()) for _ in range(copies - 1)]
        repacked = [(words, sb)] + [(words.clone(), sb.clone()) for _ in range(copies - 1)]
        xs_all = [torch.randn(max(ms), k, device=dev).bfloat16() for _ in range(CALLS)]
        norm_w = (1 + 0.1 * torch.randn(k, device=dev)).bfloat16()
        want = (xs_all[0].double() @ wd.t()).cpu()
        del wd
        for m in ms:
            xs = [x[:m].contiguous() for x in xs_all]
            shape = f"M={m} N={n} K={k}"

            def base(x, w):
                if x.shape[0] <= tg.MAX_ROWS:
                    return tg.affine_gemv(x, *w, 4, 64)
                return torch.cat([tg.affine_gemv(x[i : i + 16], *w, 4, 64) for i in range(0, x.shape[0], 16)])

            def base_after_norm(x, w):
                y, (xp, xsum) = rms_norm(x, norm_w, 1e-6, prep=(4, 64))
                return torch.cat([tg.affine_gemv(y[i : i + 16], *w, 4, 64, prep=(xp[i : i + 16], xsum[i : i + 16]))
                                  for i in range(0, y.shape[0], 16)])

            def mma_after_norm(x, w, c):
                y, (_, xsum) = rms_norm(x, norm_w, 1e-6, prep=(4, 64))
                return mg.mma_gemv(y, *w, xs=xsum, config=c)

            # (kernel, label, checked call, timed call, weights); the group sums come with x (the model's norm
            # writes them): timed without their prep launch, or (--after-norm) with the norm that makes them
            runs = [("affine_gemv", "default", base, base_after_norm if args.after_norm else base, packed)]
            sums = {x.data_ptr(): tg.prep_x(x, 4, 64)[1] for x in xs}
            for w, rb, ah in configs(n, k, m):
                def plain(x, wt, c=(w, rb, ah)):
                    return mg.mma_gemv(x, *wt, xs=sums.get(x.data_ptr()), config=c)

                def normed(x, wt, c=(w, rb, ah)):
                    return mma_after_norm(x, wt, c)

                runs.append(("mma_gemv", f"W{w}R{rb}A{ah}", plain, normed if args.after_norm else plain, repacked))
            for kernel, label, fn, timed, weights in runs:
                label = label + ("+norm" if args.after_norm else "")
                rec = dict(kernel=kernel, shape=shape, config=label)
                if time.monotonic() > deadline:
                    sink.emit({**rec, "skipped": "budget"})
                    continue
                try:
                    got = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
                    got.copy_(fn(xs[0], weights[0]))
                    torch.cuda.synchronize()
                    rows = {}
                    for r in sorted({0, m - 1}):  # the row alone, in its own tensor, with its own slice of the sums
                        alone = xs[0][r : r + 1].clone()
                        sums[alone.data_ptr()] = sums[xs[0].data_ptr()][r : r + 1].clone()
                        rows[r] = fn(alone, weights[0])
                        del sums[alone.data_ptr()]
                    inv = all(torch.equal(got[r : r + 1], y) for r, y in rows.items())
                    err = rel_err(got, want[:m])
                    fns = [lambda x=x, w=weights[j % len(weights)]: timed(x, w) for j, x in enumerate(xs)]
                    us, how = time_graph(fns, dev, args.replays)
                    sink.emit({**rec, "us": us, "timing": how, "gbs": size / us / 1e3, "err": err, "inv": inv,
                               "ok": err <= 2 * EPS and inv})
                except Exception as exc:  # noqa: BLE001  a failing configuration is a result
                    sink.emit({**rec, "ok": False, "error": repr(exc)[:400]})
        del packed, repacked
    print("\n# summary (us per call; best mma_gemv config vs affine_gemv)")
    for shape in dict.fromkeys(r["shape"] for r in sink.records):
        rs = [r for r in sink.records if r["shape"] == shape and r.get("us")]
        a = [r for r in rs if r["kernel"] == "affine_gemv"]
        t = sorted((r for r in rs if r["kernel"] == "mma_gemv" and r["ok"]), key=lambda r: r["us"])
        if a and t:
            print(f"{shape:26s} affine {a[0]['us']:8.2f}  mma {t[0]['us']:8.2f} ({t[0]['config']})  "
                  f"x{a[0]['us'] / t[0]['us']:.2f}")
    return sink.finish()


if __name__ == "__main__":
    sys.exit(main())
