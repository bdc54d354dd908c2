"""Count what one decode step launches on the fast path, per decoder layer: Triton kernels by name and torch ops
that would run a device kernel. Runs on CPU under Triton's interpreter (TRITON_INTERPRET=1 and
DELTASERVE_FAST_INTERPRET=1 must be set before triton is imported), so the counts are what the GPU path launches
without needing a GPU.

  python tests/launch_counter.py      prints the table (the test in test_launch_count.py runs this as a child)

Counting:
  triton   every `kernel[grid](...)` launch (InterpretedFunction.run / JITFunction.run wrapped), keyed by the
           kernel's function name. Torch ops the interpreter itself runs to copy arguments in and out are not
           counted (counting is paused inside a launch).
  torch    every aten op seen by a TorchDispatchMode except those that launch nothing on a device: views
           (every return aliases an input and is not written), allocations (empty*), and metadata queries.
Scope: a forward pre/post hook on each DecoderLayer labels its launches "layer N"; everything else (embedding,
RoPE tables, final norm, lm head) is "outside".
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that allocate or only read metadata: nothing runs on the device.
NO_KERNEL = {
    "aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default", "aten.new_empty.default",
    "aten.new_empty_strided.default", "aten.detach.default", "aten.lift_fresh.default", "aten.sym_size.int",
    "aten.sym_stride.int", "aten.sym_numel.default", "aten.sym_storage_offset.default", "aten.is_same_size.default",
    "aten.is_contiguous.default", "aten.is_contiguous.memory_format", "aten._unsafe_view.default",
}  # fmt: skip


def _is_view(func) -> bool:
    """Every return aliases an input without writing it (view/slice/split/select/reshape-as-view...)."""
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


class LaunchCounter(TorchDispatchMode):
    """counts[scope][("triton" | "torch", name)] = launches."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.scope = "outside"
        self._in_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not self._in_triton and name not in NO_KERNEL and not _is_view(func):
            self.counts[self.scope][("torch", name)] += 1
        return func(*args, **(kwargs or {}))

    def triton_launch(self, name: str) -> None:
        self.counts[self.scope][("triton", name)] += 1


@contextmanager
def _wrapped_triton_runs(counter: LaunchCounter):
    """Patch the launch entry of Triton's (interpreted or compiled) kernels to count and pause torch counting."""
    from triton.runtime import jit

    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - every Triton 3.x has it
        pass
    saved = {cls: cls.__dict__["run"] for cls in classes if "run" in cls.__dict__}

    def make(orig):
        def run(self, *args, grid, warmup, **kwargs):
            if warmup:
                return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            counter.triton_launch(getattr(self.fn, "__name__", str(self.fn)))
            counter._in_triton += 1
            try:
                return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                counter._in_triton -= 1

        return run

    for cls, orig in saved.items():
        cls.run = make(orig)
    try:
        yield
    finally:
        for cls, orig in saved.items():
            cls.run = orig


def _scope_hooks(model, counter: LaunchCounter):
    handles = []
    for i, layer in enumerate(model.layers):
        def pre(mod, args, i=i):
            counter.scope = f"layer {i}"

        def post(mod, args, out):
            counter.scope = "outside"

        handles += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(post)]
    return handles


def layer_kind(model, i: int) -> str:
    layer = model.layers[i]
    mixer = "attention" if layer.is_attention else "deltanet"
    ffn = "moe" if hasattr(layer.mlp, "experts") else "mlp"
    return f"{mixer}+{ffn}"


def count_decode_step(model, batch: int = 1, context: int = 5, block_size: int = 16) -> dict:
    """Prefill `context` tokens for `batch` sequences and one warm-up decode step (not counted: one-time work such
    as the RoPE frequency table happens there, as in a CUDA graph's eager warm-up), then count one decode step.
    Returns {"layers": {i: {kind, triton: {name: n}, torch: {name: n}}}, "outside": {...}}."""
    from deltaserve.kernels import backend
    from deltaserve.model import ForwardBatch

    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    blocks = -(-(context + 2) // block_size)
    tables = [[b * blocks + j for j in range(blocks)] for b in range(batch)]
    cache = model.make_cache(batch * blocks, block_size, batch, torch.bfloat16 if dtype == torch.float32 else dtype)
    prompts = [[(3 + 7 * b + 5 * j) % 64 + 1 for j in range(context)] for b in range(batch)]
    with torch.no_grad():
        with backend.reference():  # the prompt on the reference path: fla's prefill rule has no interpreter path
            model(ForwardBatch.build(prompts, [0] * batch, tables, list(range(batch)), block_size), cache)
        warm = ForwardBatch.build([[p[-1]] for p in prompts], [context] * batch, tables, list(range(batch)), block_size)
        model(warm, cache)
        step = ForwardBatch.build([[p[0]] for p in prompts], [context + 1] * batch, tables, list(range(batch)),
                                  block_size)
        counter = LaunchCounter()
        handles = _scope_hooks(model, counter)
        try:
            with _wrapped_triton_runs(counter), counter:
                model(step, cache)
        finally:
            for h in handles:
                h.remove()
    out = {"layers": {}, "outside": _split(counter.counts.get("outside", Counter()))}
    for i in range(len(model.layers)):
        out["layers"][i] = dict(kind=layer_kind(model, i), **_split(counter.counts.get(f"layer {i}", Counter())))
    return out


def _split(c: Counter) -> dict:
    return {kind: dict(sorted((n, v) for (k, n), v in c.items() if k == kind)) for kind in ("triton", "torch")}


def per_kind(result: dict) -> dict:
    """{kind: (triton launches, torch launches)} per layer, the most any layer of that kind launches."""
    worst: dict[str, tuple[int, int]] = {}
    for rec in result["layers"].values():
        t, o = sum(rec["triton"].values()), sum(rec["torch"].values())
        a, b = worst.get(rec["kind"], (0, 0))
        worst[rec["kind"]] = (max(a, t), max(b, o))
    return worst


def table(result: dict) -> str:
    lines = []
    seen = set()
    for i, rec in result["layers"].items():
        if rec["kind"] in seen:
            continue
        seen.add(rec["kind"])
        t, o = sum(rec["triton"].values()), sum(rec["torch"].values())
        lines.append(f"layer {i} ({rec['kind']}): {t} triton + {o} torch = {t + o} launches")
        for k in ("triton", "torch"):
            for name, n in rec[k].items():
                lines.append(f"    {k:6} {n:3d}  {name}")
    o = result["outside"]
    lines.append(f"outside the layers: {sum(o['triton'].values())} triton + {sum(o['torch'].values())} torch")
    for k in ("triton", "torch"):
        for name, n in o[k].items():
            lines.append(f"    {k:6} {n:3d}  {name}")
    total = sum(sum(r["triton"].values()) + sum(r["torch"].values()) for r in result["layers"].values())
    total += sum(o["triton"].values()) + sum(o["torch"].values())
    lines.append(f"whole step: {total} launches over {len(result['layers'])} layers")
    return "\n".join(lines)


TINY_Q4_TEXT = dict(
    vocab_size=128, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
    rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                         mrope_interleaved=True),
)  # fmt: skip  -- every K a multiple of 64, so q4 g64 holds every projection (the 35B-A3B layout, small)


def tiny_q4_model(quant: str = "q4"):
    """The TINY_Q4_TEXT MoE model with random weights in the bench's in-memory layout (bench/random_model)."""
    from deltaserve.bench.random_model import build_random_model
    from deltaserve.model import ModelConfig

    config = ModelConfig.from_dict({"model_type": "qwen3_5_moe", "text_config": TINY_Q4_TEXT,
                                    "tie_word_embeddings": False})
    return build_random_model(config, quant, "cpu", torch.bfloat16, seed=0)


def main() -> None:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    for quant in sys.argv[1:] or ["q4"]:
        result = count_decode_step(tiny_q4_model(quant))
        print(f"== {quant} ==")
        print(table(result))
        print("RESULT " + json.dumps({"quant": quant, "per_kind": per_kind(result)}), flush=True)


if __name__ == "__main__":
    main()
