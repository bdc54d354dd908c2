"""Does a latency-bound kernel warm the L2 for a later GEMV by prefetch instructions of its own (no launch of their
own, no side stream)? The decode step's kernels at batch 1 read DRAM at 15-60% of its bandwidth (lab/NOTES.md);
the weights of the dense GEMVs do not depend on the step's values, so a kernel one or two launches earlier could
request them into the L2 while it runs. Wave 29 measured the ceiling (the in_proj GEMV 9.26 us cold, 7.17 L2-hot)
and that bulk prefetches (`cp.async.bulk.prefetch.L2`) from a kernel of their own did not leave the bytes where
the GEMV hits. This probe asks the per-thread forms.

A CUDA graph of 8 rounds: a carrier kernel (P programs spinning ~S us on a dependent FMA chain, issuing, at its
start, per-thread prefetches over weight copy i: words, scales and biases) then the model's one-row GEMV
(triton_gemv.affine_gemv, the prep path as in the model) over copy i; 8 copies of the 35B-A3B's in_proj (12352 x
2048 q4 g64, ~14 MB each) are past the L2. Per-kernel durations from the profiler (median over the replays).

Modes (MODES): none, pf (prefetch.global.L2), pf_last (prefetch.global.L2::evict_last), touch (ld.global.cg,
summed into the carrier's result after its spin), touch2 / touch4 (each line read by 2 / 4 programs), touch32 (a
4-byte load every 32-byte sector: the L2 fills sectors), touch128 / touch256 (ld.global.cg.L2::128B / ::256B, the
L2's prefetch-size hint, a load every 128 / 256 bytes), and hot (no prefetch, the GEMV reading copy 0 every round:
the ceiling).

  python lab/probe_l2_inkernel.py [--spin-us 8,3] [--programs 132] [--shape 12352:2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

LINE = 128  # bytes a prefetch instruction covers (one L2 line)


def _request(op: str, load: bool) -> str:
    """One predicated per-thread L2 request ($1 the address, $2 the predicate), its register $0 the loaded word (0
    where not loaded) or 0 for a prefetch."""
    if load:
        return f"{{ .reg .pred p; setp.ne.u32 p, $2, 0; mov.u32 $0, 0; @p {op}.u32 $0, [$1]; }}"
    return f"{{ .reg .pred p; setp.ne.u32 p, $2, 0; @p {op} [$1]; mov.u32 $0, 0; }}"


# mode -> (the request's PTX, programs a line, bytes between requests); none and hot request nothing
MODES = {
    "none": ("", 1, LINE), "hot": ("", 1, LINE),
    "pf": (_request("prefetch.global.L2", False), 1, LINE),
    "pf_last": (_request("prefetch.global.L2::evict_last", False), 1, LINE),
    "touch": (_request("ld.global.cg", True), 1, LINE),
    "touch2": (_request("ld.global.cg", True), 2, LINE),
    "touch4": (_request("ld.global.cg", True), 4, LINE),
    "touch32": (_request("ld.global.cg", True), 1, 32),  # every 32-byte sector (a 4-byte load may fill one)
    "touch128": (_request("ld.global.cg.L2::128B", True), 1, LINE),  # the L2 fills the whole 128-byte line
    "touch256": (_request("ld.global.cg.L2::256B", True), 1, 256),  # 256 bytes a load (two lines)
}


@triton.jit
def _issue(addr, ok, ASM: tl.constexpr):
    """One per-thread L2 request (ASM: a MODES entry's PTX) per element where ok; the loaded word or 0."""
    return tl.inline_asm_elementwise(ASM, "=r,l,r", [addr, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _region(base, nbytes, pid, P, acc, ASM: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
            STRIDE: tl.constexpr = 128):
    """Program pid's share of [base, base + nbytes): lines (it * P + pid) * BLOCK + lane, it < ITERS. P is the
    number of shares: with REPLICAS programs a share (touch2 / touch4), programs pid, pid + P, ... read the same
    lines (so that, if the L2 keeps a line near the SMs that read it, more of the GEMV's SMs find it near)."""
    lane = tl.arange(0, BLOCK)
    base = base.to(tl.pointer_type(tl.int8))  # byte addresses, whatever the tensor's dtype
    for it in tl.static_range(ITERS):
        line = ((it * P + pid) * BLOCK + lane).to(tl.int64)
        ok = (line * STRIDE < nbytes).to(tl.int32)
        acc += _issue(base + tl.minimum(line * STRIDE, nbytes - 4), ok, ASM)  # in bounds even where not ok
    return acc


@triton.jit
def _carrier_kernel(out_ptr, a0, n0, a1, n1, a2, n2, spin, ASM: tl.constexpr, BLOCK: tl.constexpr,
                    I0: tl.constexpr, I1: tl.constexpr, I2: tl.constexpr, REPLICAS: tl.constexpr = 1,
                    STRIDE: tl.constexpr = 128):
    P = tl.num_programs(0) // REPLICAS
    pid = tl.program_id(0) % P
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    if ASM != "":
        acc = _region(a0, n0, pid, P, acc, ASM, BLOCK, I0, STRIDE)
        acc = _region(a1, n1, pid, P, acc, ASM, BLOCK, I1, STRIDE)
        acc = _region(a2, n2, pid, P, acc, ASM, BLOCK, I2, STRIDE)
    v = tl.full((BLOCK,), 1.0, tl.float32) + pid
    for _ in range(spin):
        v = v * 1.0000001 + 0.5
    tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), v + acc.to(tl.float32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spin-us", default="8,3")
    ap.add_argument("--programs", default="132")
    ap.add_argument("--shape", default="12352:2048")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--modes", default="none,hot,pf,pf_last,touch")
    args = ap.parse_args(argv)
    from deltaserve.bench.profile import _replayed_kernels
    from deltaserve.kernels.quant.triton_gemv import affine_gemv, prep_x

    dev = torch.device("cuda")
    n, k = (int(v) for v in args.shape.split(":"))
    copies = 8
    torch.manual_seed(0)
    ws = [torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=dev) for _ in range(copies)]
    ss = [(torch.rand(n, k // 64, device=dev) * 0.01).to(torch.bfloat16) for _ in range(copies)]
    bs = [(torch.rand(n, k // 64, device=dev) * 0.01 - 0.005).to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    prep = prep_x(x, 4, 64)
    outs = [torch.empty(1, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    ref = affine_gemv(x, ws[0], ss[0], bs[0], 4, 64, prep=prep).float()
    block = 128
    sink = torch.empty(1024 * block, device=dev)

    def iters(t, p, stride=LINE):
        return max(1, -(-t.numel() * t.element_size() // (stride * block * p)))

    def spin_count(us: float) -> int:  # calibrate the spin: one FMA ~ 4 cycles at ~1.7 GHz
        return max(1, int(us * 1e3 * 1.7 / 4))

    rows = []
    for p in (int(v) for v in args.programs.split(",")):
        for spin_us in (float(v) for v in args.spin_us.split(",")):
            spin = spin_count(spin_us)
            torch.cuda.synchronize()
            for mode_name in args.modes.split(","):
                asm, reps, stride = MODES[mode_name]

                def step(asm=asm, mode_name=mode_name, reps=reps, stride=stride):
                    for i in range(copies):
                        c = 0 if mode_name == "hot" else i
                        w, s, b = ws[c], ss[c], bs[c]
                        _carrier_kernel[(p,)](sink, w, w.numel() * 4, s, s.numel() * 2, b, b.numel() * 2, spin,
                                              ASM=asm, BLOCK=block, I0=iters(w, p // reps, stride),
                                              I1=iters(s, p // reps, stride), I2=iters(b, p // reps, stride),
                                              REPLICAS=reps, STRIDE=stride, num_warps=4)
                        affine_gemv(x, w, s, b, 4, 64, out=outs[i], prep=prep)
                step()
                torch.cuda.synchronize()
                bad = [i for i in range(copies) if mode_name == "hot" and not torch.equal(outs[i].float(), ref)]
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
                kern = _replayed_kernels(g.replay, 3, args.replays)
                carrier = [d for nm, _, d in kern if "carrier" in nm]
                gemv = [d for nm, _, d in kern if "gemv" in nm and "carrier" not in nm]
                span = (max(st + d for _, st, d in kern) - min(st for _, st, _ in kern)) / args.replays / copies
                row = (p, spin_us, mode_name, statistics.median(carrier), statistics.median(gemv), span, bad)
                rows.append(row)
                print(f"P {p:4d} spin {spin_us:4.1f} us {mode_name:8s} carrier {row[3]:7.2f} us  gemv {row[4]:6.2f} us"
                      f"  round {span:7.2f} us{'  BAD' if bad else ''}", flush=True)
    print("\n| programs | spin us | mode | carrier us | GEMV us | round us |\n|---|---|---|---|---|---|")
    for p, sp, m, c, gm, span, bad in rows:
        print(f"| {p} | {sp} | {m} | {c:.2f} | {gm:.2f} | {span:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
