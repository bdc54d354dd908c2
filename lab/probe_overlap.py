"""Whether a 64-stream decode step's DeltaNet mixer gains from running as two halves of 32 sequences on two streams,
so that one half's issue-bound projections overlap the other half's state-bound step (lab/NOTES.md wave 45).

Why: at 64 streams the state-bound DeltaNet step runs near its bytes (~83%), while the in-projection and the out
projection around it run far from theirs (issue-bound wgmma programs at low occupancy). Within one stream every
kernel of a layer waits for the one before; two halves of the batch are independent until the MoE, so their
kernels may share the SMs. Every row's bits stay the same (rows alone == rows among others: each launch is batch
invariant), the projections' weights are read twice (+17.6 MB a layer, ~4 us at the copy rate).

Per DeltaNet layer at the 35B-A3B's shapes (in_proj 12352 x 2048 q4 with the decode conv in its epilogue, the step
at 64 state columns a program with the out projection's prep, out_proj 2048 x 4096 q4), 30 layers each with its
own weights and state pools (so weights and states come from DRAM, as in a decode step), in one CUDA graph:
  joint       in_proj(64) -> step(64) -> out(64): today's schedule
  serial      the three launches for rows 0-31, then for rows 32-63, one stream
  forked      the halves on two streams from the layer's start, joined at its end
  forked4     four quarters of the rows on four streams
  after_in    one in_proj over all rows, then each half's step and out projection on a stream of its own
  steps       one in_proj, the halves' steps on two streams, one out projection (their outputs concatenated)
  staggered   half B's chain waits for half A's in_proj, so B's in_proj meets A's step and A's out meets B's step
  staggered+  the same with half B's stream at high priority (its programs dispatched first as SMs free up)
  staggered-  half A's stream at high priority instead
Checked first: the forked and staggered forms' outputs, conv pools and state pools == joint's, bit for bit (one
layer, eager, from the same pools). Kernels that count arrivals get counters of their own per stream (two
launches at once must not share them); the probe installs that for itself.
Prints us a layer for each form (median of --repeats graph timings of --replays replays) and each launch alone.

  python lab/probe_overlap.py [--rows 64] [--replays 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from deltaserve.kernels import triton_sync  # noqa: E402
from sweep_common import same_bits, time_graph_median  # noqa: E402

LAYERS = 30
QUARTER_STREAMS: list = []  # the forked4 form's four streams (made in main)
H, HK, HV, DK, DV, KCONV = 2048, 16, 32, 128, 128, 4
CONV_DIM = 2 * HK * DK + HV * DV  # 8192
N_IN = CONV_DIM + HV * DV + 2 * HV  # 12352: q|k|v, z, b, a


def per_stream_counters(streams) -> None:
    """arrival_counters of their own for the side streams: each stream's launches run one after another and leave
    their counters at zero, as the library's one buffer a device assumes of its one stream. Made before any
    capture (a buffer allocated inside one would belong to that graph's pool)."""
    base = triton_sync.arrival_counters
    bufs = {s.stream_id: torch.zeros(triton_sync.MIN_COUNTERS, dtype=torch.int32, device="cuda") for s in streams}

    def counters(device, n):
        buf = bufs.get(torch.cuda.current_stream().stream_id)
        if buf is None:
            return base(device, n)
        if buf.numel() < n:
            raise RuntimeError(f"probe: {n} counters asked for on a side stream, {buf.numel()} made")
        return buf

    for mod in list(sys.modules.values()):
        if getattr(mod, "arrival_counters", None) is base:
            mod.arrival_counters = counters


def q4_weight(n: int, k: int, dev):
    from deltaserve.kernels.quant.mma_gemv import repack_q4

    w = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=dev)
    scales = (torch.rand(n, k // 64, device=dev) * 0.004 + 0.001).bfloat16()
    biases = (-7.5 * scales.float()).bfloat16()
    return repack_q4(w, scales, biases)


class Layer:
    """One DeltaNet layer's decode mixer: weights, conv and state pools of `rows` sequences (slots 0 .. rows-1)."""

    def __init__(self, rows: int, dev):
        self.win, self.sbin = q4_weight(N_IN, H, dev)
        self.wout, self.sbout = q4_weight(H, HV * DV, dev)
        self.conv_w = (torch.randn(CONV_DIM, KCONV, device=dev) * 0.3).bfloat16()
        self.conv_pool = torch.randn(rows, CONV_DIM, KCONV - 1, device=dev).bfloat16()
        self.ssm = torch.randn(rows, HV, DK, DV, device=dev) * 0.05
        self.a_log = torch.randn(HV, device=dev) * 0.5
        self.dt_bias = torch.randn(HV, device=dev).bfloat16()
        self.norm_w = (1 + 0.1 * torch.randn(DV, device=dev)).bfloat16()
        self.slots = torch.arange(rows, device=dev, dtype=torch.int64)
        self.ctx = torch.full((rows,), 100, device=dev, dtype=torch.int64)

    def in_proj(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Rows lo .. hi-1 through the in-projection with the decode conv in its epilogue: [rows, N_IN]."""
        from deltaserve.kernels.quant.mma_gemv import mma_gemv

        return mma_gemv(x[lo:hi], self.win, self.sbin,
                        conv=(self.conv_w, self.conv_pool, self.slots[lo:hi], self.ctx[lo:hi], CONV_DIM))

    def step(self, proj: torch.Tensor, lo: int, hi: int):
        """The DeltaNet step of rows lo .. hi-1 from their in-projection: (y, (xp, xs)), the out projection's prep."""
        from deltaserve.kernels.gated_delta.triton_decode import gdn_decode_step

        mixed, z, b, a = proj.split([CONV_DIM, HV * DV, HV, HV], dim=-1)
        return gdn_decode_step(mixed, z, a, b, self.a_log, self.dt_bias, self.norm_w, self.ssm, self.slots[lo:hi],
                               self.ctx[lo:hi], HK, 1e-6, prep=(4, 64), dv_block=64)

    def out_proj(self, stepped, out: torch.Tensor) -> None:
        from deltaserve.kernels.quant.mma_gemv import mma_gemv

        y, (_, xs) = stepped
        mma_gemv(y, self.wout, self.sbout, xs=xs, out=out)

    def chain(self, x: torch.Tensor, lo: int, hi: int, out: torch.Tensor, proj: torch.Tensor | None = None):
        """Rows lo .. hi-1 through in_proj (+conv) -> step -> out_proj into out[lo:hi] (proj: the in-projection
        already made)."""
        proj = self.in_proj(x, lo, hi) if proj is None else proj
        self.out_proj(self.step(proj, lo, hi), out[lo:hi])


def schedule(form: str, layers, x, outs, streams):
    """The calls of one pass over the layers in `form`, on the current stream and streams (s_a, s_b)."""
    m = x.shape[0]
    half = m // 2
    main = torch.cuda.current_stream()
    s_a, s_b = streams
    for layer, out in zip(layers, outs):
        if form == "joint":
            layer.chain(x, 0, m, out)
        elif form == "serial":
            layer.chain(x, 0, half, out)
            layer.chain(x, half, m, out)
        elif form == "forked":
            s_a.wait_stream(main)
            s_b.wait_stream(main)
            with torch.cuda.stream(s_a):
                layer.chain(x, 0, half, out)
            with torch.cuda.stream(s_b):
                layer.chain(x, half, m, out)
            main.wait_stream(s_a)
            main.wait_stream(s_b)
        elif form == "forked4":  # four quarters on four streams
            quarter = m // 4
            for i, stream in enumerate(QUARTER_STREAMS):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    layer.chain(x, i * quarter, (i + 1) * quarter, out)
            for stream in QUARTER_STREAMS:
                main.wait_stream(stream)
        elif form in ("after_in", "steps"):
            # one in_proj over all rows, then the halves' steps (and out projections: "after_in") on two streams
            proj = layer.in_proj(x, 0, m)
            stepped = [None, None]
            for i, (stream, lo, hi) in enumerate(((s_a, 0, half), (s_b, half, m))):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    stepped[i] = layer.step(proj[lo:hi], lo, hi)
                    if form == "after_in":
                        layer.out_proj(stepped[i], out[lo:hi])
            main.wait_stream(s_a)
            main.wait_stream(s_b)
            if form == "steps":
                y = torch.cat([stepped[0][0], stepped[1][0]])
                xs = torch.cat([stepped[0][1][1], stepped[1][1][1]])
                layer.out_proj((y, (None, xs)), out)
        else:  # staggered: B's chain starts once A's in_proj is done
            s_a.wait_stream(main)
            with torch.cuda.stream(s_a):
                proj_a = layer.in_proj(x, 0, half)
            s_b.wait_stream(s_a)
            with torch.cuda.stream(s_a):
                layer.chain(x, 0, half, out, proj=proj_a)
            with torch.cuda.stream(s_b):
                layer.chain(x, half, m, out)
            main.wait_stream(s_a)
            main.wait_stream(s_b)


def check_bits(dev, rows: int, streams_by_form) -> list[str]:
    """Each two-half form's outputs and pools == joint's, one layer, eager, from copies of the same pools."""
    torch.manual_seed(1)
    layer = Layer(rows, dev)
    x = torch.randn(rows, H, device=dev).bfloat16()
    conv0, ssm0 = layer.conv_pool.clone(), layer.ssm.clone()
    ref = torch.full((rows, H), float("nan"), device=dev, dtype=torch.bfloat16)
    schedule("joint", [layer], x, [ref], streams_by_form["joint"])
    torch.cuda.synchronize()
    want = (ref.clone(), layer.conv_pool.clone(), layer.ssm.clone())
    bad = []
    for form, streams in streams_by_form.items():
        if form == "joint":
            continue
        layer.conv_pool.copy_(conv0)
        layer.ssm.copy_(ssm0)
        got = torch.full((rows, H), float("nan"), device=dev, dtype=torch.bfloat16)
        schedule(form.rstrip("+-"), [layer], x, [got], streams)
        torch.cuda.synchronize()
        for name, a, b in (("out", got, want[0]), ("conv pool", layer.conv_pool, want[1]),
                           ("state", layer.ssm, want[2])):
            if not same_bits(a, b):
                bad.append(f"{form}: {name} differs from joint's ({(a != b).sum().item()} elements)")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    lo_prio, hi_prio = torch.cuda.Stream.priority_range()
    plain = (torch.cuda.Stream(), torch.cuda.Stream())
    b_first = (torch.cuda.Stream(priority=lo_prio), torch.cuda.Stream(priority=hi_prio))
    a_first = (torch.cuda.Stream(priority=hi_prio), torch.cuda.Stream(priority=lo_prio))
    QUARTER_STREAMS[:] = [torch.cuda.Stream() for _ in range(4)]
    per_stream_counters([*plain, *b_first, *a_first, *QUARTER_STREAMS])
    forms = {**{f: plain for f in ("joint", "serial", "forked", "forked4", "after_in", "steps", "staggered")},
             "staggered+": b_first, "staggered-": a_first}
    print(f"{torch.cuda.get_device_name()}; stream priorities {lo_prio} (low) .. {hi_prio} (high)")
    bad = check_bits(dev, args.rows, forms)
    print("bits: " + ("; ".join(bad) if bad else "every form == joint (outputs, conv pools, states)"))

    torch.manual_seed(0)
    layers = [Layer(args.rows, dev) for _ in range(LAYERS)]
    x = torch.randn(args.rows, H, device=dev).bfloat16()
    outs = [torch.empty(args.rows, H, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    rows = []
    for form, streams in forms.items():
        ms = time_graph_median(lambda f=form, s=streams: schedule(f.rstrip("+-"), layers, x, outs, s), args.replays,
                       args.repeats)
        rows.append((form, ms * 1e3 / LAYERS))

    alone = []
    for m in (args.rows // 2, args.rows):
        projs = [ly.in_proj(x, 0, m) for ly in layers]
        stepped = [ly.step(p, 0, m) for p, ly in zip(projs, layers)]
        launches = {"in_proj+conv": lambda m=m: [ly.in_proj(x, 0, m) for ly in layers],
                    "step": lambda m=m: [ly.step(p, 0, m) for p, ly in zip(projs, layers)],
                    "out_proj": lambda m=m: [ly.out_proj(st, o[:m]) for st, ly, o in zip(stepped, layers, outs)]}
        for name, fn in launches.items():
            alone.append((f"{name} {m} rows", time_graph_median(fn, args.replays, args.repeats) * 1e3 / LAYERS))

    def in_pair(parts: int):
        """Each layer's in_proj+conv as `parts` launches of rows/parts on as many streams, joined per layer: whether
        the forked form's gain is the projections' alone (then one launch could have it)."""
        main, size = torch.cuda.current_stream(), args.rows // parts
        streams = (list(plain) + QUARTER_STREAMS[2:])[:parts]
        for ly in layers:
            for i, stream in enumerate(streams):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    ly.in_proj(x, i * size, (i + 1) * size)
            for stream in streams:
                main.wait_stream(stream)

    for parts in (2, 4):
        alone.append((f"in_proj+conv {args.rows} rows as {parts} launches at once",
                      time_graph_median(lambda p=parts: in_pair(p), args.replays, args.repeats) * 1e3 / LAYERS))

    print("\n| form | us a layer |\n|---|---|")
    base = rows[0][1]
    for form, us in rows:
        print(f"| {form} | {us:.2f} ({(us / base - 1) * 100:+.1f}%) |")
    print("\n| launch alone | us a layer |\n|---|---|")
    for name, us in alone:
        print(f"| {name} | {us:.2f} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
