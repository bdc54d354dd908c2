"""Where do drafted replies first differ from drafting off? (At 8 streams, Qwen3.6-35B-A3B q4 shapes, simulated
acceptance 0.8, the H100 gave other tokens than drafting off; 1, 2 and 4 streams gave the same, and
lab/probe_row_bits.py cleared the forward's kernels.)

Runs the bench's workload (bench/engine_bench.decode_run: B streams at depth d, n tokens, greedy) with drafting off,
then with k drafts a step under bench/spec_bench.SimulatedAcceptance, in several variants, and logs every step of
the drafting run: drafting steps (graph shape, followed or scheduled, per request its start, drafts verified and
tokens kept) and plain decode steps. For each request whose reply differs it prints the first differing output
index, its cache position, and the steps around it; a table of the variants last.

  PYTHONPATH=/tmp/site:$PWD python3 lab/probe_spec_divergence.py --batch 8 --k 2 --variants default,no-follow,k1

--logits: also a checksum of the bits of every row's fp32 logits (a decode step's row, or a verify row whose token
was kept), in both runs, keyed by (request, cache position of the row's input token): the first position whose
logits' bits differ may come long before the first token that differs (a near tie), and names the step that made
them (a verify row j of graph (B, k), or a plain step) and what the step before it was.
  python3 lab/probe_spec_divergence.py --preset tiny-moe --quant bf16 --device cpu --depth 40 -n 24   (smoke test)
"""

from __future__ import annotations

import argparse

import torch

from deltaserve.bench import engine_bench as eb
from deltaserve.bench import spec_bench as sb
from deltaserve.bench.random_model import build_random_model
from deltaserve.model.config import ModelConfig
from deltaserve.synthetic.presets import get_preset

VARIANTS = ("default", "no-follow", "k1")


def row_checksums(logits: torch.Tensor) -> torch.Tensor:
    """[R] int64: a position-weighted sum of each fp32 row's bit patterns (equal rows give equal sums; a one-bit
    difference anywhere changes it), computed on the logits' stream before the next replay overwrites them."""
    bits = logits.float().view(torch.int32).to(torch.int64)
    w = (torch.arange(bits.shape[-1], device=bits.device) % 1009) + 1
    return (bits * w).sum(-1)


class LogitBits:
    """(request, position) -> (checksum tensor row, producer): filled by the wrappers, resolved to ints at the end."""

    def __init__(self):
        self.rows: dict = {}

    def add(self, rid, position: int, ck: torch.Tensor, producer: str) -> None:
        self.rows[(rid, position)] = (ck, producer)

    def resolved(self) -> dict:
        return {key: (int(ck), producer) for key, (ck, producer) in self.rows.items()}


def wrap_plain_decode(runner, bits: LogitBits | None, log: list | None, clock: list):
    """runner._decode logged (and its rows' logits checksummed when bits)."""
    real = runner._decode

    def decode(rows):
        if log is not None:
            log.append(("plain", clock[0], {s.request.request_id: s.start for s in rows}))
        logits, ids = real(rows)
        if bits is not None:
            ck = row_checksums(logits[: len(rows)])
            for i, s in enumerate(rows):
                bits.add(s.request.request_id, s.start, ck[i], f"plain step of {len(rows)} rows")
        return logits, ids

    runner._decode = decode


def logged_run(model, batch: int, depth: int, n: int, k: int, rate: float, recorded: dict, variant: str,
               bits: LogitBits | None = None):
    """The drafting run's outputs and its step log: ("draft", step, followed, (graph batch, graph k), {rid: (start,
    kcap, tokens)}) or ("plain", step, {rid: start}). bits: the kept rows' logits checksums go there."""
    vocab = model.config.vocab_size
    engine = sb.make_spec_engine(model, None, batch, sb.max_len(depth, n), 1 if variant == "k1" else k,
                                 cuda_graphs=True)
    if engine.device.type != "cuda":
        engine.runner.graphs_off_device = True  # (the smoke test: the graph path run eagerly)
    engine.spec.source = sb.SimulatedAcceptance(engine.spec.source, recorded, rate, vocab, seed=depth + batch)
    spec, runner, log, followed, clock = engine.spec, engine.runner, [], set(), [0]
    if variant == "no-follow":
        spec.follow = lambda *a, **kw: None
    real_follow, real_finish, real_step = spec.follow, spec.finish, engine.step

    def follow(step, *a, **kw):
        nxt = real_follow(step, *a, **kw)
        if nxt is not None:
            followed.add(id(nxt))
        return nxt

    def finish(step):
        first = step.result is None
        res = real_finish(step)
        if first:
            rows = {s.request.request_id: (s.start, kcap, res.tokens[s.request.request_id])
                    for s, kcap in zip(step.seqs, step.kcaps)}
            log.append(("draft", clock[0], id(step) in followed, (step.graph.batch, step.graph.k), rows))
            if bits is not None and step.graph.logits is not None:  # the verify's rows, before the next replay
                k1 = step.graph.k + 1
                ck = row_checksums(step.graph.logits[: len(step.seqs) * k1])
                shape = (step.graph.batch, step.graph.k)
                for b, s in enumerate(step.seqs):
                    kept = len(res.tokens[s.request.request_id])
                    for j in range(kept):
                        bits.add(s.request.request_id, s.start + j, ck[b * k1 + j],
                                 f"verify row {j} of graph {shape} ({'followed' if id(step) in followed else 'scheduled'})")
        return res

    def step():
        clock[0] += 1
        return real_step()

    if variant != "no-follow":
        spec.follow = follow
    spec.finish, engine.step = finish, step
    wrap_plain_decode(runner, bits, log, clock)
    out = eb.decode_run(engine, batch, depth, n, "greedy", vocab)
    return out["outputs"], log, engine


def first_difference(got: list[int], want: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def covering(log, rid: str, position: int) -> list:
    """The log entries of request rid around the one that produced the token at cache position `position`."""
    hits = []
    for i, e in enumerate(log):
        if e[0] == "draft" and rid in e[4]:
            start, _, tokens = e[4][rid]
            if start < position <= start + len(tokens):
                hits.append(i)
        elif e[0] == "plain" and rid in e[2] and e[2][rid] + 1 == position:
            hits.append(i)
    if not hits:
        return []
    i = hits[0]
    return [e for e in log[max(0, i - 2): i + 2] if (e[0] == "draft" and rid in e[4]) or (e[0] == "plain"
                                                                                          and rid in e[2])]


def report_bits(want: dict, got: dict, depth: int) -> None:
    """Per request: the first position whose logits' bits differ (and the step that made them, and the one before),
    the number of compared and differing positions."""
    by_rid: dict = {}
    for (rid, pos), (ck, producer) in got.items():
        if (rid, pos) in want:
            by_rid.setdefault(rid, []).append((pos, ck != want[(rid, pos)][0], producer))
    for rid in sorted(by_rid, key=str):
        rows = sorted(by_rid[rid])
        diff = [r for r in rows if r[1]]
        if not diff:
            print(f"  logits request {rid}: {len(rows)} positions compared, all bits equal")
            continue
        pos, _, producer = diff[0]
        before = [r for r in rows if r[0] < pos]
        prev = f"; the row before (position {before[-1][0]}): {before[-1][2]}" if before else ""
        print(f"  logits request {rid}: {len(rows)} positions compared, {len(diff)} differ; first at position {pos} "
              f"(output {pos - depth}) from {producer}{prev}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3.6-35b-a3b")
    p.add_argument("--quant", default="q4")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--rate", type=float, default=0.8)
    p.add_argument("--depth", type=int, default=512)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--logits", action="store_true", help="compare the bits of every row's logits too")
    p.add_argument("--max-verify-rows", type=int, default=0,
                   help="the verify forward's row limit (engine/speculative.MAX_VERIFY_ROWS, 16) for this run: "
                        "is a wider verify exact too? (24 at 8 streams and k = 2, 192 at 64)")
    args = p.parse_args()
    if args.max_verify_rows:
        from deltaserve.engine import engine as engine_mod, speculative

        # the limit as the engine reads it: drafts_that_fit's module global and the engine's own binding
        speculative.MAX_VERIFY_ROWS = engine_mod.MAX_VERIFY_ROWS = args.max_verify_rows
    config = ModelConfig.from_dict(get_preset(args.preset).config)
    model = build_random_model(config, args.quant, args.device, mtp_layers=max(1, config.mtp_num_hidden_layers))
    off = eb.make_engine(model, None, args.batch, sb.max_len(args.depth, args.n), caching=False)
    if off.device.type != "cuda":
        off.runner.graphs_off_device = True
    want_bits = LogitBits() if args.logits else None
    if want_bits is not None:
        wrap_plain_decode(off.runner, want_bits, None, [0])
    want = eb.decode_run(off, args.batch, args.depth, args.n, "greedy", config.vocab_size)["outputs"]
    want_ck = want_bits.resolved() if want_bits is not None else None
    print(f"{args.preset} {args.quant} on {args.device}: {args.batch} streams, k={args.k}, a={args.rate}, "
          f"d{args.depth}, n={args.n}; drafting off under plan {off.plan.describe()}"
          + (f"; verify rows up to {args.max_verify_rows}" if args.max_verify_rows else ""))
    del off
    rows = []
    for variant in args.variants.split(","):
        got_bits = LogitBits() if args.logits else None
        got, log, engine = logged_run(model, args.batch, args.depth, args.n, args.k, args.rate, want, variant,
                                      got_bits)
        drafts = [e for e in log if e[0] == "draft"]
        diffs = {rid: first_difference(got[rid], want[rid]) for rid in want}
        bad = {rid: o for rid, o in diffs.items() if o is not None}
        print(f"## {variant}: plan {engine.plan.describe()}; {len(drafts)} drafting steps "
              f"({sum(e[2] for e in drafts)} followed; graphs (batch, k) {sorted({e[3] for e in drafts})}), "
              f"{sum(e[0] == 'plain' for e in log)} plain; "
              f"{len(bad)} of {len(want)} replies differ")
        for rid, o in sorted(bad.items(), key=lambda kv: kv[1])[:4]:
            position = args.depth + 1 + o  # the prompt holds depth + 1 tokens
            print(f"  request {rid}: first difference at output {o} (cache position {position}): "
                  f"{got[rid][o:o + 3]} against {want[rid][o:o + 3]}")
            for e in covering(log, rid, position):
                if e[0] == "draft":
                    start, kcap, tokens = e[4][rid]
                    print(f"    step {e[1]}: draft graph {e[3]} {'followed' if e[2] else 'scheduled'}, start "
                          f"{start}, kcap {kcap}, kept {tokens}; rows beside: {len(e[4])}")
                else:
                    print(f"    step {e[1]}: plain decode at start {e[2][rid]} ({len(e[2])} rows)")
        if got_bits is not None:
            report_bits(want_ck, got_bits.resolved(), args.depth)
        first = min(bad.values()) if bad else None
        rows.append((variant, len(bad), first, len(drafts)))
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print("| variant | replies differing | earliest output index | drafting steps |\n|---|---|---|---|")
    for variant, nbad, first, steps in rows:
        print(f"| {variant} | {nbad} | {'-' if first is None else first} | {steps} |")


if __name__ == "__main__":
    main()
