"""`deltaserve bench --profile`: one eager decode step broken down by kernel class (CUDA time per class)."""

from __future__ import annotations

from collections import defaultdict

import torch

from ..engine.cuda_graph import DecodeGraph
from ..model import ModelConfig

# kernel-name fragments -> class, first match wins
CLASSES = (
    ("router", "moe"), ("_topk", "moe"), ("gate_up", "moe"), ("down_combine", "moe"), ("_down_kernel", "moe"),
    ("_combine", "moe"), ("mma_experts", "moe"), ("_wg_experts", "moe"), ("_tiles_", "moe"),
    ("qk_prep", "attention"), ("affine_mm", "linear (affine/dense matmul)"), ("_gemv", "linear (affine/dense matmul)"),
    ("_dense_mm", "linear (affine/dense matmul)"), ("_dequant", "linear (affine/dense matmul)"),
    ("_prep", "linear (affine/dense matmul)"), ("l2norm", "deltanet prefill"), ("recompute_w_u", "deltanet prefill"),
    ("conv", "deltanet conv"), ("step_rows_kernel", "deltanet step"), ("gates", "deltanet step"),
    ("chunk", "deltanet prefill"),
    ("write_kv", "attention"), ("decode_split", "attention"), ("decode_merge", "attention"), ("prefill", "attention"),
    ("rms_norm", "norm"), ("gated_norm", "norm"),
)


def classify(name: str) -> str:
    low = name.lower()
    for frag, cls in CLASSES:
        if frag in low:
            return cls
    return "other (torch elementwise, copies, argmax)"


def _decode_step(model, depth: int, batch: int, block_size: int) -> DecodeGraph:
    """A DecodeGraph of `batch` sequences at context `depth` (a fresh cache, one block table each), loaded with a
    different random token per sequence (seeded) and not captured: the step both decode profiles run. Distinct
    tokens route to different experts, as the bench's streams do; one token for every row would send all of them
    to the same 8 experts and price the MoE of a batch as one token's."""
    blocks = -(-(depth + 8) // block_size)
    cache = model.make_cache(batch * blocks, block_size, batch, torch.bfloat16)
    dev = next(model.parameters()).device
    tables = torch.arange(batch * blocks, dtype=torch.int32, device=dev).view(batch, -1)
    dg = DecodeGraph(model, cache, batch, blocks, greedy_feedback=True)
    ctx = torch.full((batch,), depth, dtype=torch.int64, device=dev)
    ids = torch.randint(0, model.config.vocab_size, (batch,), generator=torch.Generator().manual_seed(batch))
    dg.load(ids.to(dev), ctx, ctx, tables, torch.arange(batch, device=dev))
    return dg


def profile_decode(model, config: ModelConfig, depth: int, batch: int = 1, block_size: int = 64, top: int = 14) -> str:
    from torch.profiler import ProfilerActivity, profile

    dg = _decode_step(model, depth, batch, block_size)
    for _ in range(2):
        dg.replay()  # eager warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dg.replay()
        torch.cuda.synchronize()
    per_class: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    kernels = []  # (GPU time, launches, name): the per-kernel view under the classes
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
        if t <= 0:
            continue
        cls = classify(evt.key)
        per_class[cls] += t
        counts[cls] += evt.count
        kernels.append((t, evt.count, evt.key))
    total = sum(per_class.values()) or 1.0
    lines = [f"# decode step profile (eager, batch {batch}, depth {depth}): {total / 1e3:.3f} ms GPU time"]
    for cls, t in sorted(per_class.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {cls:<42} {t / 1e3:8.3f} ms  {100 * t / total:5.1f}%  {counts[cls]:5d} launches")
    lines.append("  top kernels (GPU time, launches, us per launch):")
    for t, c, k in sorted(kernels, reverse=True)[:top]:
        lines.append(f"    {t / 1e3:8.3f} ms {c:5d}x {t / max(c, 1):7.2f} us  {k[:80]}")
    return "\n".join(lines)


def critical_path(kernels: list[tuple[str, float, float]], steps: int) -> tuple[float, dict[str, list[float]]]:
    """Where a graph replay's time goes when kernels overlap (PDL: a kernel starts, and waits, before the previous
    one ends). kernels: (name, start, duration) of `steps` replays of the same step, in any order; returns (the
    mean step span, {name: [launches a step, mean duration, mean critical time a step]}). A kernel's critical time
    is end - the previous kernel's end (kernels of one stream end in launch order: each waits for the previous to
    complete), floored at zero, so a step's critical times add up to its span from the first start; the first
    kernel's is its duration."""
    if steps < 1 or len(kernels) % steps:
        raise ValueError(f"critical_path: {len(kernels)} kernels do not split into {steps} equal steps")
    per = len(kernels) // steps
    order = sorted(kernels, key=lambda k: k[1])
    stats: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    span = 0.0
    for i in range(steps):
        step = order[i * per:(i + 1) * per]
        prev_end = step[0][1]
        for name, start, dur in step:
            end = start + dur
            st = stats[name]
            st[0] += 1
            st[1] += dur
            st[2] += max(end - prev_end, 0.0)
            prev_end = max(prev_end, end)
        span += prev_end - step[0][1]
    out = {name: [c / steps, d / c, crit / steps] for name, (c, d, crit) in stats.items()}
    return span / steps, out


def profile_decode_graph(model, config: ModelConfig, depth: int, batch: int = 1, block_size: int = 64,
                         steps: int = 5, top: int = 24) -> str:
    """The captured decode graph's replays under the profiler: per kernel its duration as the GPU ran it inside
    the graph (PDL overlap included) and its critical time (critical_path), by class and by kernel. The eager
    profile (profile_decode) times each kernel alone; this one shows what the overlap hides and what it does not."""
    dg = _decode_step(model, depth, batch, block_size)
    dg.capture()
    header = f"# decode graph profile (batch {batch}, depth {depth}, {steps} replays)"
    return _graph_report(_replayed_kernels(dg.replay, 3, steps), steps, header, "a step", top)


def profile_prefill_graph(model, config: ModelConfig, n: int, batch: int = 1, block_size: int = 64,
                          replays: int = 3, top: int = 24) -> str:
    """The captured prefill graph (engine/cuda_graph.PrefillGraph: `batch` fresh n-token prompts, as `deltaserve
    bench` times them) replayed under the profiler: per kernel its in-graph duration and critical time, as the
    decode graph's profile. Where the eager prefill profile's kernel times do not add up to the graph's rate, this
    says which kernels the graph's overlap (PDL) hides and which it does not. CUDA only."""
    from ..engine.cuda_graph import PrefillGraph, capturable

    if not capturable(model):
        return "# prefill graph profile: the model cannot be captured here (CUDA and the fast path only)"
    blocks = -(-(n + 8) // block_size)
    cache = model.make_cache(batch * blocks, block_size, batch, torch.bfloat16)
    tables = torch.arange(batch * blocks, dtype=torch.int32).view(batch, -1).tolist()
    ids = torch.randint(0, config.vocab_size, (batch, n), generator=torch.Generator().manual_seed(n)).tolist()
    g = PrefillGraph(model, cache, n, blocks, batch=batch)
    g.load_batch(ids, [0] * batch, tables, list(range(batch)))
    g.capture()
    header = f"# prefill graph profile (batch {batch} x {n} tokens, {replays} replays)"
    return _graph_report(_replayed_kernels(g.replay, 2, replays), replays, header, "a prefill", top)


def _replayed_kernels(replay, warm: int, replays: int) -> list[tuple[str, float, float]]:
    """(name with grid, start us, duration us) of every kernel of `replays` calls of replay() (a captured graph's)
    under the profiler, after `warm` calls outside it."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    return [(_with_grid(e), float(e["ts"]), float(e["dur"])) for e in trace.get("traceEvents", [])
            if e.get("cat") == "kernel" and "dur" in e]


def _graph_report(kernels: list[tuple[str, float, float]], steps: int, header: str, unit: str, top: int) -> str:
    """A graph profile's report: the span of one of `steps` replays, then by class and by kernel the in-graph and
    critical time (critical_path), each `unit` ("a step", "a prefill")."""
    if not kernels or len(kernels) % steps:
        return (f"{header}: {len(kernels)} kernel events for {steps} replays (the profiler did not record the "
                f"graph's kernels one by one)")
    span, per_kernel = critical_path(kernels, steps)
    by_class: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for name, (count, dur, crit) in per_kernel.items():
        c = by_class[classify(name)]
        c[0] += count
        c[1] += count * dur
        c[2] += crit
    lines = [f"{header}: span {span:.1f} us, {sum(v[0] for v in per_kernel.values()):.0f} kernels {unit}",
             f"  {'class':<42} {'in-graph us':>11} {'critical us':>11}  launches"]
    for cls, (count, dur, crit) in sorted(by_class.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"  {cls:<42} {dur:11.1f} {crit:11.1f}  {count:6.0f}")
    lines.append(f"  top kernels by critical time (us {unit}; launches, in-graph us each, critical us each):")
    for name, (count, dur, crit) in sorted(per_kernel.items(), key=lambda kv: -kv[1][2])[:top]:
        lines.append(f"    {crit:8.1f} us {count:5.0f}x {dur:7.2f} {crit / count:7.2f}  {name[:96]}")
    return "\n".join(lines)


def _with_grid(event: dict) -> str:
    """A trace kernel's name with its launch grid when the trace has it ("name grid [x, y, z]"), so one kernel
    launched for several weights (a GEMV over the in- and the out-projection) is listed once per shape."""
    grid = event.get("args", {}).get("grid")
    return f"{event['name']} grid {list(grid)}" if isinstance(grid, (list, tuple)) else event["name"]


def profile_prefill(model, config: ModelConfig, n: int, batch: int = 1, block_size: int = 64, top: int = 25) -> str:
    """One prefill of `batch` fresh n-token prompts (after a warm-up), CPU and GPU side: wall time vs summed GPU
    kernel time (a wall far above it means the host is the bottleneck), the host-blocking runtime calls (syncs,
    device-to-host copies), the kernels by GPU time and the host ops by self CPU time. Off CUDA (a reference model
    on the CPU, as the tests run it) the same report with the host side only and an fp32 cache."""
    import time

    from torch.profiler import ProfilerActivity, profile

    from ..model import ForwardBatch

    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    blocks = -(-(n + 8) // block_size)
    cache = model.make_cache(batch * blocks, block_size, batch, torch.bfloat16 if cuda else torch.float32)
    tables = torch.arange(batch * blocks, dtype=torch.int32).view(batch, -1).tolist()
    ids = torch.randint(0, config.vocab_size, (batch, n)).tolist()
    fb = ForwardBatch.build(ids, [0] * batch, tables, list(range(batch)), block_size, device=dev)
    with torch.no_grad():
        model(fb, cache)  # warm-up: compilation
        sync()
        start = time.perf_counter()
        model(fb, cache)
        sync()
        wall = time.perf_counter() - start
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof, _labelled_blocks():
            model(fb, cache)
            sync()
    events = prof.key_averages()
    by_label = {e.key: (getattr(e, "device_time_total", 0.0) or 0.0, e.cpu_time_total) for e in events
                if e.key.startswith("block: ")}
    gpu = [(getattr(e, "device_time_total", 0.0) or 0.0, e.count, e.key) for e in events]
    gpu_total = sum(t for t, _, k in gpu if t > 0 and not k.startswith("cuda"))
    blocking = [(e.count, e.key) for e in events
                if any(s in e.key for s in ("Synchronize", "cudaMemcpy", "aten::item", "aten::_local_scalar_dense"))]
    lines = [f"# prefill profile: batch {batch} x {n} tokens, wall {wall * 1e3:.1f} ms (unprofiled), kernels "
             f"{gpu_total / 1e3:.1f} ms GPU time"]
    for key, (dev_t, cpu_t) in sorted(by_label.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {key:<34} GPU {dev_t / 1e3:8.3f} ms   host {cpu_t / 1e3:8.3f} ms")
    lines.append("  host-blocking calls: " + (", ".join(f"{k} x{c}" for c, k in blocking) or "none"))
    lines.append("  top kernels by GPU time:")
    for t, c, k in sorted((g for g in gpu if g[0] > 0), reverse=True)[:top]:
        lines.append(f"    {t / 1e3:8.3f} ms {c:6d}x  {k[:90]}")
    lines.append("  top host ops by self CPU time:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        lines.append(f"    {e.self_cpu_time_total / 1e3:8.3f} ms {e.count:6d}x  {e.key[:90]}")
    return "\n".join(lines)


class _labelled_blocks:
    """While active, the model's blocks run inside profiler ranges ("block: ..."), so GPU time can be split by
    block even where one Triton kernel serves several (the affine matmul: projections and grouped experts)."""

    def __enter__(self):
        from ..model.attention import GatedAttention
        from ..model.gated_deltanet import GatedDeltaNet
        from ..model.mlp import SparseMoeBlock

        targets = [(GatedDeltaNet, "forward", "deltanet mixer"), (GatedAttention, "forward", "attention mixer"),
                   (SparseMoeBlock, "forward", "moe block"), (SparseMoeBlock, "_grouped", "moe experts+combine")]
        self.saved = []
        for cls, name, label in targets:
            orig = getattr(cls, name)
            self.saved.append((cls, name, orig))
            setattr(cls, name, _ranged(orig, f"block: {label}"))
        return self

    def __exit__(self, *exc):
        for cls, name, orig in self.saved:
            setattr(cls, name, orig)
        return False


def _ranged(fn, label: str):
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return wrapper
