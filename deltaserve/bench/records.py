"""Benchmark result records: one JSON object per line under bench/results/ (bench/README.md: the method)."""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from pathlib import Path

from ..utils import tuning


def git_commit(cwd: str | Path | None = None) -> str:
    """The short commit of the tree being measured; $DELTASERVE_COMMIT wins (device copies carry no .git)."""
    if tuning.get("DELTASERVE_COMMIT"):
        return tuning.get("DELTASERVE_COMMIT")
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=cwd, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=cwd, timeout=10)
        commit = out.stdout.strip() or "unknown"
        return commit + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def make_record(engine: str, gpu: str, model: str, quant: str, test: str, n: int, depth: int, batch: int,
                tok_s: float, tok_s_std: float, reps: int, gbps: float | None = None,
                roofline_pct: float | None = None, notes: str = "", commit: str | None = None) -> dict:
    return {
        "engine": engine, "commit": commit or git_commit(), "date": _dt.date.today().isoformat(), "gpu": gpu,
        "model": model, "quant": quant, "test": test, "n": n, "depth": depth, "batch": batch,
        "tok_s": round(tok_s, 2), "tok_s_std": round(tok_s_std, 2),
        "gbps": None if gbps is None else round(gbps, 1),
        "roofline_pct": None if roofline_pct is None else round(roofline_pct, 2),
        "reps": reps, "notes": notes,
    }


def append_records(records: list[dict], results_dir: str | Path, gpu: str) -> Path:
    path = Path(results_dir)
    path.mkdir(parents=True, exist_ok=True)
    slug = gpu.lower().replace("nvidia ", "").replace(" ", "-") or "cpu"
    out = path / f"{slug}-{_dt.date.today().isoformat()}.jsonl"
    with out.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return out


def format_table(records: list[dict]) -> str:
    """A llama-bench-style table."""
    head = f"| {'engine':<11} | {'model':<16} | {'quant':<6} | {'test':<12} | {'B':>3} | {'t/s':>18} | {'GB/s':>7} | {'roof%':>6} |"
    rule = "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"
    rows = [head, rule]
    for r in records:
        test = f"{r['test']}{r['n']}" + (f" @ d{r['depth']}" if r["depth"] else "")
        tps = f"{r['tok_s']:.2f} ± {r['tok_s_std']:.2f}"
        gb = "" if r.get("gbps") is None else f"{r['gbps']:.0f}"
        rf = "" if r.get("roofline_pct") is None else f"{r['roofline_pct']:.1f}"
        rows.append(f"| {r['engine']:<11} | {r['model']:<16} | {r['quant']:<6} | {test:<12} | {r['batch']:>3} | {tps:>18} | {gb:>7} | {rf:>6} |")
    return "\n".join(rows)
