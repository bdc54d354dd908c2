"""Two source trees side by side on one GPU: the same bits and the same speed, before and after a refactor.

  python3 lab/ab_trees.py bits  --old OLD_TREE [--new .] [--preset qwen3.6-35b-a3b] [--quant q4] [--no-graphs]
  python3 lab/ab_trees.py speed --old OLD_TREE [--new .] [--rounds 2] [--out DIR]
  python3 lab/ab_trees.py series TREE [TREE ...] [--bench "-p 16 -n 128 -d 512 -b 1,8"] [--out DIR]

Each tree runs in a child process of its own with PYTHONPATH=<tree>:<the rest>, so each imports its own deltaserve
(the old tree is a plain folder, e.g. `git archive <commit> | tar -x -C .old`, carried to the device as an ignored
path: only the working tree travels, not .git).

bits: in each tree, the preset's random model (the bench's build_random_model, seed 0: the same weights in both
trees) served by an LLM engine of max_num_seqs B for B in 1, 8, 64 (each its own deployment, so its own kernel
plan), greedy: B prompts of random ids (a fixed generator), 16 new tokens each, and the logits of one 37-token
prompt at every position. The two trees' token ids must be equal and their logits bit for bit (torch.equal).
--no-graphs runs both engines without CUDA graphs (graph == eager bit for bit, tests/gpu/test_engine_graph_gpu.py):
for an old tree whose prefill graphs fault (before 8c8c3c2, fla's memoised chunk index).

speed: `deltaserve bench` in each tree, alternating old / new for --rounds rounds (drift hits both alike):
pp512 B=1 @ d0, and tg128 at B = 1, 8, 64 @ d512 (-r 3 each); records under --out/<old|new>/ (copy them into
bench/results/), then one table: each row's tok/s in both trees (median over rounds), new / old, and the larger of
the two runs' own spreads, so a difference inside the spread reads as none.

series: where a speed A/B found a difference, the commits between (each a tree, e.g. `git archive C | tar -x -C
.ab/C`) timed one after another with one bench command (a tree may repeat: the first again at the end shows the
drift), and one table: each row's tok/s per tree and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
DEPLOYMENTS = (1, 8, 64)
BENCH_RUNS = (("-p", "512", "-n", "0", "-d", "0", "-b", "1"),
              ("-p", "16", "-n", "128", "-d", "512", "-b", ",".join(map(str, DEPLOYMENTS))))


def tree_env(tree: Path, label: str) -> dict:
    """The environment of a child that imports `tree`'s deltaserve (the other PYTHONPATH entries kept, e.g. the
    carried wheels' /tmp/site; any other deltaserve tree dropped)."""
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not (Path(p) / "deltaserve" / "__init__.py").exists()]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *keep]), DELTASERVE_COMMIT=label,
                PYTHONUNBUFFERED="1")


def child_bits(preset: str, quant: str, out: str, device: str = "cuda", graphs: str = "graphs") -> None:
    """(In the tree's own process) the greedy tokens and logits of `bits` into `out` (a torch file)."""
    import torch

    import deltaserve
    from deltaserve import LLM, SamplingParams
    from deltaserve.bench.random_model import build_random_model
    from deltaserve.model import ModelConfig
    from deltaserve.synthetic.presets import get_preset

    config = ModelConfig.from_dict(get_preset(preset).config)
    model = build_random_model(config, quant, device)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 60, (max(DEPLOYMENTS),), generator=gen)]
    probe = torch.randint(0, config.vocab_size, (37,), generator=gen).tolist()
    result = {"tree": str(Path(deltaserve.__file__).parents[1])}
    for b in DEPLOYMENTS:
        llm = LLM.from_model(model, None, max_num_seqs=b, max_model_len=256, num_blocks=64 * b,
                             cuda_graphs=None if graphs == "graphs" else False)
        outs = llm.generate(prompts[:b], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        result[f"tokens_b{b}"] = [o.token_ids for o in outs]
        result[f"logits_b{b}"] = llm.logits(probe).cpu()
        del llm
        if device == "cuda":
            torch.cuda.empty_cache()
    torch.save(result, out)


def run_bits(args) -> int:
    import torch

    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, tree in (("old", args.old), ("new", args.new)):
            out = Path(tmp) / f"{label}.pt"
            cmd = [sys.executable, str(HERE), "_child_bits", args.preset, args.quant, str(out), args.device,
                   "eager" if args.no_graphs else "graphs"]
            proc = subprocess.run(cmd, env=tree_env(tree, label), cwd=tree, timeout=args.timeout)
            if proc.returncode:
                print(f"{label} ({tree}): the child failed with status {proc.returncode}")
                return 1
            got[label] = torch.load(out)
    old, new = got["old"], got["new"]
    assert old["tree"] != new["tree"], f"both children imported {old['tree']}"
    ok = True
    for b in DEPLOYMENTS:
        same_tokens = old[f"tokens_b{b}"] == new[f"tokens_b{b}"]
        same_logits = torch.equal(old[f"logits_b{b}"], new[f"logits_b{b}"])
        ok &= same_tokens and same_logits
        diff = (old[f"logits_b{b}"] - new[f"logits_b{b}"]).abs().max().item()
        print(f"B={b}: greedy tokens {'equal' if same_tokens else 'DIFFER'}; logits "
              f"{'bit for bit' if same_logits else f'DIFFER (max abs {diff:.3g})'}")
    print("same bits" if ok else "BITS DIFFER")
    return 0 if ok else 1


def bench_in(tree: Path, commit: str, bench_args, results: Path, args, head: str) -> None:
    """One `deltaserve bench` in `tree`'s own process (its records under `results`, their commit `commit`); prints
    its table rows once each, or the tail of its output where it made none."""
    cmd = [sys.executable, "-m", "deltaserve", "bench", "--preset", args.preset, "--quant", args.quant, *bench_args,
           "--results", str(results)]
    print(f"# {head}: {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, env=tree_env(tree, commit), cwd=tree, timeout=args.timeout, capture_output=True,
                          text=True)
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| deltaserve")]
    print("\n".join(dict.fromkeys(rows)) if rows else proc.stdout[-2000:] + proc.stderr[-2000:], flush=True)


def records(folder: Path):
    """The bench records under `folder` (its *.jsonl files, one record a line)."""
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            yield json.loads(line)


def run_speed(args) -> int:
    out = Path(args.out)
    for r in range(args.rounds):
        for label, tree in (("old", args.old), ("new", args.new)):
            for extra in BENCH_RUNS:
                bench_in(tree, label, [*extra, "-r", "3"], out / label, args, f"round {r + 1}, {label}")
    print(table(out))
    return 0


def run_series(args) -> int:
    out = Path(args.out)
    labels = []
    for i, tree in enumerate(args.trees):
        label = f"{i}-{tree.name}"
        labels.append(label)
        bench_in(tree, tree.name, args.bench.split(), out / label, args, label)
    print(series_table(out, labels))
    return 0


def series_table(out: Path, labels: list[str]) -> str:
    """Each row's tok/s per tree (label columns) and as a ratio to the first tree's."""
    got: dict[tuple, dict[str, float]] = {}
    for label in labels:
        for rec in records(out / label):
            got.setdefault((rec["test"], rec["n"], rec["depth"], rec["batch"]), {})[label] = rec["tok_s"]
    lines = ["| test | B | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for (test, n, depth, batch), by in sorted(got.items()):
        first = by.get(labels[0])
        cells = [f"{by[lb]:,.1f}" + (f" ({by[lb] / first:.3f})" if first and lb != labels[0] else "")
                 if lb in by else "-" for lb in labels]
        lines.append(f"| {test}{n} @ d{depth} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(out: Path) -> str:
    """Old and new side by side from the records under out/old and out/new."""
    recs: dict[tuple, dict[str, list[dict]]] = {}
    for label in ("old", "new"):
        for rec in records(out / label):
            key = (rec["test"], rec["n"], rec["depth"], rec["batch"])
            recs.setdefault(key, {"old": [], "new": []})[label].append(rec)
    lines = ["| test | B | old tok/s | new tok/s | new/old | spread |", "|---|---|---|---|---|---|"]
    for (test, n, depth, batch), both in sorted(recs.items()):
        if not both["old"] or not both["new"]:
            continue
        med = {k: statistics.median(r["tok_s"] for r in v) for k, v in both.items()}
        spread = max(r["tok_s_std"] / r["tok_s"] for v in both.values() for r in v if r["tok_s"])
        lines.append(f"| {test}{n} @ d{depth} | {batch} | {med['old']:,.1f} | {med['new']:,.1f} | "
                     f"{med['new'] / med['old']:.3f} | ±{100 * spread:.1f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child_bits":
        child_bits(*argv[1:6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("bits", "speed", "series"))
    ap.add_argument("trees", nargs="*", type=Path, help="series: the trees, in order")
    ap.add_argument("--bench", default="-p 16 -n 128 -d 512 -b 1,8 -r 3", help="series: the bench's arguments")
    ap.add_argument("--old", type=Path, help="the tree before (a folder holding deltaserve/)")
    ap.add_argument("--new", type=Path, default=HERE.parents[1], help="the tree after (default: this one)")
    ap.add_argument("--preset", default="qwen3.6-35b-a3b")
    ap.add_argument("--quant", default="q4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="bits: cpu for a dry run of the script (tiny presets)")
    ap.add_argument("--no-graphs", action="store_true", help="bits: both engines without CUDA graphs")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out") + "/ab")
    ap.add_argument("--timeout", type=int, default=400, help="seconds for each child")
    args = ap.parse_args(argv)
    if args.what == "series":
        if not args.trees:
            ap.error("series: give the trees to time")
        args.trees = [t.resolve() for t in args.trees]
        trees = args.trees
    else:
        if args.old is None or args.trees:
            ap.error(f"{args.what}: give --old (and --new), not positional trees")
        args.old, args.new = args.old.resolve(), args.new.resolve()
        trees = [args.old, args.new]
    for tree in trees:
        if not (tree / "deltaserve" / "__init__.py").exists():
            ap.error(f"{tree}: no deltaserve/ package there")
    return {"bits": run_bits, "speed": run_speed, "series": run_series}[args.what](args)


if __name__ == "__main__":
    raise SystemExit(main())
