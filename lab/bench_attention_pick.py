"""Pick a decode attention launch shape from a lab/sweep_decode_attention.py record file and run `deltaserve
bench` with it set (an in-model A/B before the shape becomes the library's default; no records are written unless
the bench arguments ask for them, and a record would carry the commit's defaults, so pass --no-record).

The pick, per cache kind: among the configurations that passed their checks at every shape they ran, the fastest at
batch 1 and the deepest context swept, provided it is no slower than the library's default (the file's first
configuration) by more than --slack-us at batch 1 and the shallowest depth, nor by more than 5% at any other shape.

  python lab/bench_attention_pick.py SWEEP.jsonl --kv fp8 [--slack-us 0.3] [--print-only] -- BENCH ARGS...
  python lab/bench_attention_pick.py --set MERGE_BSP=32 --set "DECODE_STAGES={'bf16': None}" -- BENCH ARGS...
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

KNOBS = {"split": "SPLIT_TOKENS", "bn": "DECODE_BN", "warps": "DECODE_WARPS", "stages": "DECODE_STAGES",
         "merge_bsp": "MERGE_BSP", "merge_bd": "MERGE_BD", "programs": "DECODE_PROGRAMS", "long_split": "LONG_SPLIT"}


def pick(records: list[dict], kv: str, slack_us: float = 0.3) -> dict | None:
    """The chosen record's knobs {field: value} (None when nothing beats the default by the rules above)."""
    times: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    failed, order, knobs = set(), [], {}
    for r in records:
        if r.get("kv") != kv or r.get("skipped"):
            continue
        c = r["config"]
        if c not in knobs:
            order.append(c)
            knobs[c] = {f: r.get(f) for f in KNOBS}
        if not r.get("ok") or not r.get("us"):
            failed.add(c)
            continue
        times[c][(r["batch"], r["depth"])] = r["us"]
    if not order or order[0] in failed:
        return None
    base = times[order[0]]
    deep = max(d for b, d in base if b == 1)
    shallow = min(d for b, d in base if b == 1)
    best, best_us = None, base[(1, deep)]
    for c in order[1:]:
        t = times[c]
        if c in failed or set(t) != set(base):
            continue
        if t[(1, shallow)] > base[(1, shallow)] + slack_us:
            continue
        if any(t[k] > 1.05 * base[k] for k in base if k not in ((1, deep), (1, shallow))):
            continue
        if t[(1, deep)] < best_us:
            best, best_us = c, t[(1, deep)]
    return None if best is None else {"config": best, **knobs[best]}


def knob_settings(chosen: dict) -> dict:
    """A picked record's fields as triton_paged module values (its stages and warps for both cache dtypes)."""
    values = {name: chosen.get(field) for field, name in KNOBS.items()}
    values["DECODE_STAGES"] = {"bf16": chosen["stages"], "fp8": chosen["stages"]}
    values["DECODE_WARPS"] = {"bf16": chosen["warps"], "fp8": chosen["warps"]}
    return values


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", nargs="?", help="a sweep record file to pick from (or give --set)")
    ap.add_argument("--kv", choices=("bf16", "fp8"))
    ap.add_argument("--slack-us", type=float, default=0.3)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a decode attention knob (lab/attention_knobs.py) to a Python literal instead of picking, e.g. MERGE_BSP=32")
    ap.add_argument("--print-only", action="store_true")
    args = ap.parse_args(own)
    if args.set:
        values = {}
        for item in args.set:
            name, _, text = item.partition("=")
            values[name] = ast.literal_eval(text)
        print(f"set: {values}")
    else:
        if not args.sweep or not args.kv:
            ap.error("give a sweep file and --kv, or --set")
        records = [json.loads(ln) for ln in Path(args.sweep).read_text().splitlines() if ln.strip()]
        chosen = pick(records, args.kv, args.slack_us)
        print(f"pick ({args.kv}): {chosen['config'] if chosen else 'the default (nothing better by the rules)'}")
        if chosen is None:
            return 0
        values = knob_settings(chosen)
    if args.print_only:
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import attention_knobs
    from deltaserve.cli import main as cli_main

    try:
        attention_knobs.check(values)
    except KeyError as e:
        raise SystemExit(str(e)) from None
    with attention_knobs.applied(values):
        return cli_main(["bench", *bench_args])


if __name__ == "__main__":
    sys.exit(main())
