"""What the device sweeps (sweep_decode_kernels.py, sweep_prefill_kernels.py, sweep_mma_gemv.py) share: the dry
run's re-execution under Triton's interpreter, the error measure their checks use, the CUDA-graph timing of a list
of calls, and the JSON-lines record sink."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def start(dry_run: bool, script: str, argv: list[str]) -> int | None:
    """A dry run must have TRITON_INTERPRET=1 before triton is imported: outside it, re-run `script` with `argv` in a
    child that has it and return its exit status. Inside (or for a GPU run), put the repository and tests/gpu on
    sys.path, install the interpreter's numpy shim for a dry run, and return None: the caller goes on."""
    if dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_REFERENCE="0")
        return subprocess.call([sys.executable, script, *argv], env=env)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gpu")]
    if dry_run:
        from kernel_cases import interpreter_numpy_shim

        interpreter_numpy_shim()
    return None


def fmt_timed(head: str, rec: dict, checks) -> str:
    """A timed record's line: `head` (its identifying columns), then "skipped", "ERROR <error>", or the time and
    GB/s, checks(rec) (the sweep's own verdict columns) and ok / FAIL."""
    if rec.get("skipped"):
        return f"{head} skipped"
    if "error" in rec:
        return f"{head} ERROR {rec['error']}"
    us = f"{rec['us']:8.2f} us {rec['gbs']:6.0f} GB/s" if rec.get("us") else ""
    return f"{head} {us} {checks(rec)} {'ok' if rec['ok'] else 'FAIL'}"


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (inf if got holds NaN/inf: a poisoned or broken output)."""
    g = got.double().cpu()
    r = ref.double().cpu()
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    return (g - r).abs().max().item() / max(r.abs().max().item(), 1e-30)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b hold the same bytes (the same dtype and shape; NaNs compared as bits, -0.0 unequal to 0.0): the
    probes' check that two schedules of the same launches give the same outputs."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


class RecordSink:
    """Records as they come: kept in `records`, printed (elapsed seconds, then fmt(record)) and written as JSON
    lines to `path` (flushed per line, so a run cut by a device limit keeps what it measured). `extra` fields are
    added to every record."""

    def __init__(self, path: str | None, fmt, extra: dict | None = None):
        self.path, self.fmt, self.extra = path, fmt, extra or {}
        self.file = open(path, "w") if path else None  # noqa: SIM115  closed with the process
        self.records: list[dict] = []
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def emit(self, rec: dict) -> None:
        rec = dict(rec, **self.extra)
        self.records.append(rec)
        print(f"[{self.elapsed():6.1f}s] " + self.fmt(rec), flush=True)
        if self.file:
            self.file.write(json.dumps(rec) + "\n")
            self.file.flush()

    def finish(self) -> int:
        """Print the closing count (records, failing, skipped, seconds, where the JSON lines went); the exit
        status: 1 when any record failed its checks."""
        bad = sum(r.get("ok") is False for r in self.records)
        skipped = sum(bool(r.get("skipped")) for r in self.records)
        print(f"\n{len(self.records)} records, {bad} failing, {skipped} skipped, {self.elapsed():.0f} s"
              + (f"; JSON lines in {self.path}" if self.path else ""))
        return 1 if bad else 0


def time_graph(fns, device, replays: int) -> tuple[float | None, str | None]:
    """us per call of the zero-argument callables fns (one per "layer"): a CUDA graph of all of them replayed
    `replays` times, or, if capture fails, 200 eager calls; (None, None) off CUDA (the dry run checks only)."""
    if device.type != "cuda":
        return None, None
    from graph_capture import capture_calls

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        graph = capture_calls(fns)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        us, how = start.elapsed_time(end) * 1e3 / (replays * len(fns)), f"graph{len(fns)}"
        del graph
        return us, how
    except Exception:  # noqa: BLE001  capture unsupported here: back-to-back eager calls instead
        torch.cuda.synchronize()
        start.record()
        for j in range(200):
            fns[j % len(fns)]()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / 200, "eager200"


def time_graph_median(fn, replays: int, repeats: int) -> float:
    """Median over `repeats` of the mean ms of a replay of the zero-argument call fn captured in one CUDA graph (run
    once eagerly first: compiles, allocates; the graph replayed once before timing). fn may fork side streams that
    it joins back (the probes of two streams)."""
    import statistics

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    del graph
    return statistics.median(times)
