"""Peers beside our numbers (bench/README.md: the method): llama.cpp and transformers results as our JSON records, and
one side-by-side table.

  python -m deltaserve.bench.peers llama-bench RESULT.json --model qwen3.6-35b-a3b   # llama-bench -o json/jsonl
  python -m deltaserve.bench.peers transformers --preset qwen3.6-35b-a3b -p 512 -n 128 -d 0,512 -r 3
  python -m deltaserve.bench.peers table [bench/results/*.jsonl]

llama.cpp: `llama-bench -o json` (or jsonl) output, one record per test: pp (n_prompt, n_gen 0), tg (n_gen,
n_prompt 0), or pg (both). tok_s is the median of llama-bench's per-repetition samples (its own `avg_ts` is a mean,
kept in the notes); llama-bench lays depth down with a real prefill before every repetition.

transformers: the preset's text model (`Qwen3_5MoeForCausalLM` / `Qwen3_5ForCausalLM`) built on the meta device,
moved to the device uninitialised (`to_empty`) and filled with cheap random values in place, in bf16. Prefill (pp N
@ d): one forward call over N new tokens into a DynamicCache that a real, untimed prefill of d tokens filled first
(fresh for every repetition). Decode (tg N @ d): N single-token forward calls, greedy feedback, after the same
untimed d-token prefill. One warm-up run, then R repetitions; median and standard deviation, as in our bench.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path

from . import records, roofline
from .transformers_peer import (  # noqa: F401 (re-exported: the peer's pieces)
    TransformersRunner, _sync, build_transformers_model, force_torch_kernels, transformers_notes,
)

# ---- llama.cpp ---------------------------------------------------------------------------------------------------
# llama.cpp's model_type ends in the file type's description (llama_model_ftype_name) -> our quant name.
GGUF_FTYPES = {"all F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q6_K": "q6_k",
               "Q4_K - Small": "q4_k_s", "Q4_K - Medium": "q4_k_m", "Q5_K - Small": "q5_k_s", "Q5_K - Medium": "q5_k_m"}
# Bits per stored weight for the roofline of a peer's decode (bulk matrices, routers): GGUF routers are F32.
PEER_FORMATS = {"q4_k_m": (4.5, 32.0), "q8_0": (8.5, 32.0), "f16": (16.0, 32.0), "bf16": (16.0, 16.0)}


def read_llama_bench(text: str, source: str = "llama-bench output") -> list[dict]:
    """The test objects of `llama-bench -o json` (an array) or `-o jsonl` (one object per line)."""
    text = text.strip()
    if not text:
        raise ValueError(f"{source}: empty")
    try:
        data = json.loads(text)
        entries = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        entries = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    entries.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{source}: line {i} is neither a JSON array nor a JSON line ({e.msg})") from None
    for i, e in enumerate(entries):
        missing = [k for k in ("n_prompt", "n_gen", "avg_ts") if not isinstance(e, dict) or k not in e]
        if missing:
            raise ValueError(f"{source}: test {i} lacks {', '.join(missing)} (is this llama-bench -o json output?)")
    return entries


def quant_of(model_type: str) -> str:
    """'qwen35moe 35B.A3B Q4_K - Medium' -> 'q4_k_m' (unknown descriptions are kept, lower-cased)."""
    for desc, name in sorted(GGUF_FTYPES.items(), key=lambda kv: -len(kv[0])):
        if model_type.endswith(desc):
            return name
    return model_type.rsplit(" ", 1)[-1].lower() if model_type else "unknown"


def llama_bench_records(entries: list[dict], model: str | None = None, quant: str | None = None,
                        commit: str | None = None, peer_version: str = "") -> list[dict]:
    """Our records of llama-bench's tests; peer_version (e.g. "llama-cpp-python 0.3.36 sdist") goes into the
    notes, since a llama.cpp built outside git reports its build_commit as "unknown"."""
    out = []
    for e in entries:
        p, g, d = int(e["n_prompt"]), int(e["n_gen"]), int(e.get("n_depth", 0))
        test, n = ("pp", p) if g == 0 else ("tg", g) if p == 0 else ("pg", p + g)
        samples = [float(s) for s in e.get("samples_ts") or []]
        tok_s = statistics.median(samples) if samples else float(e["avg_ts"])
        name = model or Path(e.get("model_filename", "model")).stem
        q = quant or quant_of(e.get("model_type", ""))
        gpu = e.get("gpu_info") or e.get("cpu_info") or "unknown"
        notes = (f"llama-bench {e.get('build_commit', '?')} (build {e.get('build_number', '?')})"
                 f"{' ' + peer_version if peer_version else ''}, "
                 f"{e.get('backends', '?')}, ngl {e.get('n_gpu_layers', '?')}, fa {e.get('flash_attn', '?')}, "
                 f"ubatch {e.get('n_ubatch', '?')}, kv {e.get('type_k', '?')}/{e.get('type_v', '?')}, "
                 f"{e.get('model_type', '?')}, mean {float(e['avg_ts']):.2f}; depth by real prefill")
        if test == "pg":
            notes += f"; pp{p}+tg{g} in one timing"
        gbps = pct = None
        if test == "tg" and tok_s > 0 and roofline.copy_ceiling(gpu):  # a GPU whose copy bandwidth we measured
            gbps, pct = _peer_roofline(name, q, 1, d + n // 2, 1.0 / tok_s, gpu)
        rec = records.make_record("llama.cpp", gpu, name, q, test, n, d, 1, tok_s, float(e.get("stddev_ts", 0.0)),
                                  len(samples) or 1, gbps, pct, notes, commit)
        if str(e.get("test_time", ""))[:4].isdigit():
            rec["date"] = str(e["test_time"])[:10]
        out.append(rec)
    return out


def _peer_roofline(model: str, quant: str, batch: int, depth: int, step_s: float, gpu: str):
    """(GB/s, % of roofline) of a decode step when the model is one of our presets and the format is known."""
    from ..model.config import ModelConfig
    from ..synthetic.presets import PRESETS

    if model not in PRESETS or quant not in PEER_FORMATS:
        return None, None
    config = ModelConfig.from_dict(PRESETS[model].config)
    fmt = roofline.WeightFormat(quant, *PEER_FORMATS[quant])
    return roofline.roofline(step_s, roofline.decode_step_bytes(config, fmt, batch, depth), roofline.copy_ceiling(gpu))


# ---- transformers ------------------------------------------------------------------------------------------------
def run_transformers(args) -> list[dict]:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, _ = build_transformers_model(args.preset, args.device, dtype, args.seed)
    _sync(args.device)
    gpu = torch.cuda.get_device_name() if str(args.device).startswith("cuda") else "cpu"
    print(f"# transformers {args.preset} {args.dtype} on {gpu}, built in {time.perf_counter() - t0:.1f}s", flush=True)
    kernels = args.kernels or ("torch" if str(args.device) == "cpu" else "auto")
    if kernels == "torch":
        force_torch_kernels(model)
    runner, notes, recs = TransformersRunner(model, args.device, args.seed), transformers_notes(model, kernels), []

    def keep(rec: dict) -> None:
        # appended as soon as measured: a run cut short by a time limit keeps the configurations it finished
        recs.append(rec)
        if not args.no_record:
            records.append_records([rec], args.results, rec["gpu"])

    for b in args.batch:
        for d in args.depth:
            for n in args.n_prompt:
                keep(_record(gpu, args, "pp", n, d, b, runner.prefill(n, d, b, args.reps), notes))
            for n in args.n_gen:
                keep(_record(gpu, args, "tg", n, d, b, runner.decode(n, d, b, args.reps), notes))
    return recs


def _record(gpu, args, test, n, depth, batch, times, notes) -> dict:
    rates = [n * batch / t for t in times]
    tok_s = statistics.median(rates)
    sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
    gbps = pct = None
    if test == "tg" and args.dtype == "bf16" and roofline.copy_ceiling(gpu):
        gbps, pct = _peer_roofline(args.preset, "bf16", batch, depth + n // 2, batch / tok_s, gpu)
    rec = records.make_record("transformers", gpu, args.preset, args.dtype, test, n, depth, batch, tok_s, sd,
                              args.reps, gbps, pct, notes)
    print(records.format_table([rec]).splitlines()[-1], flush=True)
    return rec


# ---- the side-by-side table --------------------------------------------------------------------------------------
ENGINE_ORDER = ("deltaserve", "llama.cpp", "transformers")
RECORD_KEYS = ("engine", "model", "quant", "test", "n", "depth", "batch", "tok_s")


def load_records(paths: list[str | Path]) -> list[dict]:
    """Every throughput record (pp/tg/pg) of the given JSON-line files, in file order; other lines (kernel
    timings) are skipped. A line that is not JSON is an error naming the file and line."""
    out = []
    for path in paths:
        for i, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON line ({e.msg})") from None
            if isinstance(rec, dict) and all(k in rec for k in RECORD_KEYS):
                out.append(rec)
    return out


def side_by_side(recs: list[dict], gpu: str | None = None, commit: str | None = None) -> str:
    """One row per (model, test, n, depth, batch); one column per (engine, quant), deltaserve first; the latest
    record (by date, then file order) fills a cell. Ratio columns: the first deltaserve column / each peer column
    (> 1: deltaserve is faster). commit: keep only deltaserve records of that commit (prefix), so one table never
    mixes our commits; a footer names the commits (and peer versions) each column's cells come from."""
    if gpu:
        recs = [r for r in recs if r.get("gpu") == gpu]
    if commit:
        recs = [r for r in recs if r["engine"] != "deltaserve" or str(r.get("commit", "")).startswith(commit)]
    if not recs:
        return "no benchmark records" + (f" for gpu {gpu!r}" if gpu else "")
    latest: dict[tuple, dict] = {}
    for r in sorted(enumerate(recs), key=lambda ir: (str(ir[1].get("date", "")), ir[0])):
        latest[_row_key(r[1]) + ((r[1]["engine"], r[1]["quant"]),)] = r[1]
    cols = sorted({k[-1] for k in latest}, key=lambda c: (_engine_rank(c[0]), c))
    rows = OrderedDict((k[:-1], None) for k in sorted(latest, key=lambda k: k[:-1]))
    ours = next((c for c in cols if c[0] == "deltaserve"), None)
    peers = [c for c in cols if c[0] != "deltaserve"] if ours else []
    head = ["model", "test", "B"] + [f"{e} {q}" for e, q in cols] + [f"ds/{e} {q}" for e, q in peers]
    table = [head]
    for key in rows:
        model, test, n, depth, batch = key
        label = f"{test}{n}" + (f" @ d{depth}" if depth else "")
        cells = [latest.get(key + (c,)) for c in cols]
        row = [model, label, str(batch)] + [_cell(r) for r in cells]
        base = latest.get(key + (ours,)) if ours else None
        for c in peers:
            peer = latest.get(key + (c,))
            ok = base is not None and peer is not None and peer["tok_s"] > 0
            row.append(f"{base['tok_s'] / peer['tok_s']:.2f}x" if ok else "")
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"
             for r in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines.append("")  # the footer is prose, not a table row
    for c in cols:
        used = [r for k, r in latest.items() if k[-1] == c]
        commits = sorted({str(r.get("commit", "?")) for r in used})
        dates = sorted({str(r.get("date", "?")) for r in used})
        lines.append(f"{c[0]} {c[1]}: records of deltaserve tree {', '.join(commits)}; {', '.join(dates)}; "
                     f"{str(used[0].get('notes', ''))[:120]}")
    return "\n".join(lines)


def _row_key(r: dict) -> tuple:
    return (str(r["model"]), str(r["test"]), int(r["n"]), int(r["depth"]), int(r["batch"]))


def _engine_rank(engine: str) -> int:
    return ENGINE_ORDER.index(engine) if engine in ENGINE_ORDER else len(ENGINE_ORDER)


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    std = r.get("tok_s_std")
    return f"{r['tok_s']:.2f}" + (f" ± {std:.2f}" if isinstance(std, (int, float)) and math.isfinite(std) else "")


# ---- command line ------------------------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m deltaserve.bench.peers", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    lb = sub.add_parser("llama-bench", help="turn llama-bench -o json/jsonl output into our records")
    lb.add_argument("result", help="llama-bench output file ('-' = stdin)")
    lb.add_argument("--model", help="model name for the records (default: the GGUF file's stem), e.g. qwen3.6-35b-a3b")
    lb.add_argument("--quant", help="quant name (default: from llama-bench's model_type, e.g. q4_k_m)")
    lb.add_argument("--peer-version", default="", help="llama.cpp version for the notes, e.g. 'llama-cpp-python "
                    "0.3.36 sdist' (a build outside git reports build_commit 'unknown')")
    tf = sub.add_parser("transformers", help="time transformers on a preset's shapes (random bf16 weights)")
    tf.add_argument("--preset", required=True)
    tf.add_argument("-p", "--n-prompt", type=_ints, default=[512])
    tf.add_argument("-n", "--n-gen", type=_ints, default=[128])
    tf.add_argument("-d", "--depth", type=_ints, default=[0])
    tf.add_argument("-b", "--batch", type=_ints, default=[1])
    tf.add_argument("-r", "--reps", type=int, default=5)
    tf.add_argument("--device", default="cuda")
    tf.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    tf.add_argument("--seed", type=int, default=0)
    tf.add_argument("--threads", type=int, help="CPU threads for torch")
    tf.add_argument("--kernels", choices=["auto", "torch"], help="DeltaNet functions: transformers' choice (fla "
                    "when installed) or its pure-torch ones (default: torch on cpu, auto elsewhere)")
    tb = sub.add_parser("table", help="side-by-side table of the records")
    tb.add_argument("files", nargs="*", help="JSON-line files (default: bench/results/*.jsonl)")
    tb.add_argument("--gpu", help="only records of this gpu, e.g. 'NVIDIA H200'")
    tb.add_argument("--commit", help="only deltaserve records of this commit (sha prefix); peers are kept")
    for s in (lb, tf):
        s.add_argument("--results", default="bench/results", help="directory for the JSON-line records")
        s.add_argument("--no-record", action="store_true", help="print only, append nothing")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "table":
        files = args.files or sorted(Path("bench/results").glob("*.jsonl"))
        print(side_by_side(load_records(files), args.gpu, args.commit))
        return 0
    if args.command == "llama-bench":
        text = sys.stdin.read() if args.result == "-" else Path(args.result).read_text()
        recs = llama_bench_records(read_llama_bench(text, args.result), args.model, args.quant,
                                   peer_version=args.peer_version)
    else:
        recs = run_transformers(args)  # records appended one by one as measured
        print(records.format_table(recs))
        return 0
    print(records.format_table(recs))
    if not args.no_record and recs:
        path = records.append_records(recs, args.results, recs[0]["gpu"])
        print(f"# {len(recs)} records appended to {path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, OSError) as e:
        print(f"peers: error: {e}", file=sys.stderr)
        sys.exit(2)
