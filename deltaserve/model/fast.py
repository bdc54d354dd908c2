"""The GPU fast path's seam: when it runs, and how a weight-holding module is handed to the Triton kernels.

The model's modules keep one forward each; where the fast path differs (batched kernels reading device-side metadata
instead of per-sequence loops) they branch on `enabled(x)`. Everything on the fast path reads only device tensors
and host sizes fixed by the batch shape, so a decode step can be captured in a CUDA graph.

Weight modules are read by duck typing (the model may not import `quant`): a module with `scales`/`biases` and a
`spec` (bits, group_size) is affine-packed; one with only `weight` is dense.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..kernels import backend


def enabled(x: torch.Tensor) -> bool:
    """Run the Triton kernels for this activation? CUDA (reference path not forced), or a CPU tensor under Triton's
    interpreter (TRITON_INTERPRET=1 with DELTASERVE_FAST_INTERPRET=1: tests and debugging of the fast path on CPU)."""
    if backend.reference_enabled():
        return False
    if x.is_cuda:
        return True
    return backend.interpreting() and os.environ.get("DELTASERVE_FAST_INTERPRET", "0") == "1"


def weight_spec(module: nn.Module, attr: str = "weight"):
    """The module's weight as the kernels read it (cached on the module; weights never move after loading)."""
    from ..kernels.triton_common import WeightSpec

    key = f"_fast_spec_{attr}"
    spec = module.__dict__.get(key)
    if spec is None:
        w = getattr(module, attr)
        if hasattr(module, "scales"):
            q = module.spec
            spec = WeightSpec(w, module.scales, module.biases, q.bits, q.group_size, attr)
        else:
            spec = WeightSpec.dense(w, attr)
        module.__dict__[key] = spec
    return spec


def stacked_specs(experts: nn.Module):
    """(gate, up, down) WeightSpecs of a routed-expert bank: the fused dense `Experts` ([E, 2I, H] split into two
    views) or a `StackedExperts` of three stacked projections."""
    from ..kernels.triton_common import WeightSpec

    cached = experts.__dict__.get("_fast_specs")
    if cached is None:
        if hasattr(experts, "gate_up_proj"):
            i = experts.intermediate
            gu = experts.gate_up_proj
            cached = (WeightSpec.dense(gu[:, :i]), WeightSpec.dense(gu[:, i:]), WeightSpec.dense(experts.down_proj))
        else:
            cached = tuple(weight_spec(p) for p in (experts.gate_proj, experts.up_proj, experts.down_proj))
        experts.__dict__["_fast_specs"] = cached
    return cached


def linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x), through the batch-invariant Triton matmul on the fast path."""
    if not enabled(x) or not hasattr(module, "weight"):
        return module(x)
    from ..kernels.quant.triton_affine import affine_matmul

    s = weight_spec(module)
    return affine_matmul(x, s.w, None if s.bits == 16 else s.scales, None if s.bits == 16 else s.biases, s.bits, s.group)
