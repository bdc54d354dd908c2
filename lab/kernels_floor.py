"""How fast can one decode-sized kernel read its bytes at all? The floor under each decode GEMV / MoE launch.

A batch-1 decode step is ~400 kernels that each read 0.5-15 MB (the lm_head: 286 MB). At those sizes a kernel's
fixed costs (launch ramp, the first DRAM latency, the tail of its last wave) are a large part of its time, and the
question "is the GEMV slow, or is any kernel of this size this slow?" decides what to do next: make the GEMV
itself cheaper, or make fewer, bigger kernels. This script answers it on the H200:

  stream   a Triton kernel that only reads the same number of bytes (int32 words, 128-bit loads) and XOR-folds
           them into one word per program, with the GEMV's program size (4 KB, 2 warps) and with bigger
           programs (16 KB / 4 warps, 64 KB / 8 warps); +x: every program also reads an x row of fp32 as the
           prep-path GEMV does (the x cost alone); PDL like the decode kernels
  split    the same bytes in two launches of half the size (the price of one more launch in a graph)
  gemv     `affine_gemv` at the model's shapes, default configuration: with its prep launch, and with the prep
           given (the in-model case after the prepped norm)

  python lab/kernels_floor.py [--out floor.jsonl] [--commit abc1234]
  TRITON_INTERPRET=1 python lab/kernels_floor.py --dry     (every case once at toy sizes, on CPU)

Timing as lab/kernels_timing.py: copies past the L2, R calls cycling over them in one CUDA graph, median of 5
replays, microseconds per call. GB/s counts the bytes one call must read.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

from kernels_timing import CEILING_GBPS, DRY, copies_for, q_bytes, time_graph  # noqa: E402

from deltaserve.kernels.triton_pdl import pdl_args, pdl_open, pdl_wait  # noqa: E402

# (name, N, K) of the q4 g64 decode weights of Qwen3.6-35B-A3B, and the MoE blocks' bytes per token (9 experts)
GEMVS = [("deltanet in_proj", 12352, 2048), ("attn q|k|v", 9216, 2048), ("out proj", 2048, 4096),
         ("lm_head", 248320, 2048)]
MOE_BYTES = [("moe gate|up x9", 9 * q_bytes(1024, 2048, 4)), ("moe down x9", 9 * q_bytes(2048, 512, 4))]
# (words per program, warps): the GEMV's row-run program (4 rows x 1 KB), and two bigger ones
PROGRAMS = [(1024, 2), (4096, 4), (16384, 8)]


@triton.jit
def _stream_kernel(w_ptr, x_ptr, out_ptr, WORDS: tl.constexpr, XW: tl.constexpr, PDL: tl.constexpr = False):
    # grid (programs,): program p XOR-folds words [p*WORDS, (p+1)*WORDS) (and, XW > 0, XW fp32 words of x, the
    # same for every program) into out[p]: the loads cannot be optimised away, the arithmetic is negligible
    pdl_open(PDL)
    p = tl.program_id(0).to(tl.int64)
    w = tl.load(w_ptr + p * WORDS + tl.arange(0, WORDS))
    acc = tl.reduce(w, 0, _xor)
    pdl_wait(PDL)
    if XW > 0:
        xv = tl.load(x_ptr + tl.arange(0, XW)).to(tl.int32, bitcast=True)
        acc = acc ^ tl.reduce(xv, 0, _xor)
    tl.store(out_ptr + p, acc)


@triton.jit
def _xor(a, b):
    return a ^ b


def stream(buf: torch.Tensor, x: torch.Tensor, out: torch.Tensor, words: int, warps: int, xw: int) -> None:
    _stream_kernel[(buf.numel() // words,)](buf, x, out, WORDS=words, XW=xw, num_warps=warps, **pdl_args(buf))


def stream_cases(dev, name: str, nbytes: int, dry: bool) -> list[dict]:
    rows = []
    words_total = max(nbytes // 4 // 16384, 1) * 16384  # a multiple of every program size
    if dry:
        words_total = 16384
    bufs = [torch.randint(-2**31, 2**31 - 1, (words_total,), dtype=torch.int32, device=dev)
            for _ in range(1 if dry else copies_for(words_total * 4))]
    x = torch.randn(2048 if not dry else 256, device=dev)
    out = torch.empty(words_total // 1024, dtype=torch.int32, device=dev)
    moved = words_total * 4
    for words, warps in PROGRAMS:
        for xw in (0, x.numel()):
            if xw and words != PROGRAMS[0][0]:
                continue  # the x cost is asked of the GEMV-sized program only
            us = time_graph([lambda b=b: stream(b, x, out, words, warps, xw) for b in bufs])
            stream(bufs[0], x, out, words, warps, xw)  # the graph's last call read another copy
            ref = _fold(bufs[0].view(-1, words))
            if xw:
                ref = ref ^ _fold(x.view(torch.int32)[None, :xw])
            ok = torch.equal(out[: ref.numel()].cpu(), ref.cpu())
            rows.append(dict(kernel="stream", shape=f"{name} {moved / 1e6:.1f} MB",
                             config=f"{words * 4 // 1024} KB/program w={warps}{' +x' if xw else ''}", us=us,
                             bytes=moved, ok=ok))
    # the same bytes in two launches of half the size, GEMV-sized programs
    half, h_out = words_total // 2, words_total // 2048

    def split(b):
        stream(b[:half], x, out[:h_out], 1024, 2, 0)
        stream(b[half:], x, out[h_out:], 1024, 2, 0)
    us = time_graph([lambda b=b: split(b) for b in bufs])
    split(bufs[0])
    ok = torch.equal(out.cpu(), _fold(bufs[0].view(-1, 1024)).cpu())
    rows.append(dict(kernel="stream", shape=f"{name} {moved / 1e6:.1f} MB", config="2 launches of half, 4 KB w=2",
                     us=us, bytes=moved, ok=ok))
    return rows


def _fold(t: torch.Tensor) -> torch.Tensor:
    acc = t[:, 0].clone()
    for j in range(1, t.shape[1]):
        acc ^= t[:, j]
    return acc


def gemv_cases(dev, name: str, n: int, k: int, dry: bool) -> list[dict]:
    import kernel_cases as kc

    from deltaserve.kernels.quant import triton_gemv as tg

    if dry:
        n, k = 64, 256
    wbytes = q_bytes(n, k, 4)
    ws = []
    for _ in range(1 if dry else copies_for(wbytes)):
        p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
        ws.append((p, s, b))
    x = torch.randn(1, k, device=dev).bfloat16()
    out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
    prep = tg.prep_x(x, 4, 64)
    base = tg.affine_gemv(x, *ws[0], 4, 64)
    given = tg.affine_gemv(x, *ws[0], 4, 64, prep=prep)
    ok = torch.equal(base, given)
    cfg = tg.default_config(tg.gemv_spec(*ws[0], 4, 64, "w"))
    rows = []
    for label, kw in (("with prep launch", {}), ("prep given", {"prep": prep})):
        us = time_graph([lambda w=w, kw=kw: tg.affine_gemv(x, *w, 4, 64, out=out, **kw) for w in ws])
        rows.append(dict(kernel="affine_gemv", shape=f"{name} M=1 N={n} K={k} q4g64 {wbytes / 1e6:.1f} MB",
                         config=f"default {cfg}, {label}", us=us, bytes=wbytes, ok=ok))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="append one JSON line per row here")
    ap.add_argument("--commit", default=os.environ.get("DELTASERVE_COMMIT", ""))
    ap.add_argument("--dry", action="store_true", help="toy sizes, each case once (with TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    dry = args.dry or DRY
    dev = torch.device("cpu" if dry and not torch.cuda.is_available() else "cuda")
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)"
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"# {gpu}  commit {args.commit or '?'}  (GB/s against the {CEILING_GBPS:.0f} copy ceiling)")
    print(f"{'kernel':<12} {'shape':<46} {'config':<36} {'us':>8} {'GB/s':>7} {'%':>5} ok", flush=True)
    rows = []
    sizes = [(nm, q_bytes(n, k, 4)) for nm, n, k in GEMVS] + MOE_BYTES
    cases = [lambda nm=nm, nb=nb: stream_cases(dev, nm, nb, dry) for nm, nb in (sizes[:1] if dry else sizes)]
    cases += [lambda nm=nm, n=n, k=k: gemv_cases(dev, nm, n, k, dry) for nm, n, k in (GEMVS[:1] if dry else GEMVS)]
    for case in cases:  # each row printed (and appended) as it comes: a cut run keeps what it measured
        for r in case():
            us = r["us"]
            gbs = r["bytes"] / us / 1e3 if us == us and us and r["bytes"] else float("nan")
            r.update(gbs=gbs, commit=args.commit, gpu=gpu, time=stamp)
            print(f"{r['kernel']:<12} {r['shape']:<46} {r['config']:<36} {us:8.2f} {gbs:7.0f} "
                  f"{100 * gbs / CEILING_GBPS:5.1f} {'ok' if r['ok'] else 'MISMATCH'}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
            rows.append(r)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
