"""Which weights the decode step warms in the L2, and when (kernels/l2_prefetch.py does the warming).

A decode layer reads, in order: input norm -> input projection (the DeltaNet in_proj 14 MB, or the attention
q|k|v 10.6 MB) -> the DeltaNet step or attention -> output projection (4.7 MB) -> post norm -> router (0.5 MB) ->
top-k -> experts gate/up + shared expert (10.6 MB) -> down (5.3 MB) -> combine. Each prefetch is forked onto a
side stream at a point where the main stream is about to run kernels that leave the HBM mostly idle, early enough
for the bytes to arrive, late enough that the traffic in between (< ~35 MB) does not push them out of the 50 MB L2:

  "mixer"  at the layer's start: its output projection, the MoE's router, shared expert and shared-expert gate;
  "next"   after the mixer: the next layer's input projection (read ~17 us later, after this layer's MoE);
  "down"   after the top-k: the picked experts' down weights (read after gate/up, ~8 us later);
  "gateup" after the top-k: the picked experts' gate and up weights (read at once: the copy engine races the GEMV).

DELTASERVE_L2_PREFETCH: a comma list of those names, "1" (= mixer,next,down) or "0" (none, the default until the
H200 says otherwise). Decode steps only (prefill reads each weight once per many tokens), CUDA sm_90 only, the
default CUDA-core MoE only for "down"/"gateup". No value changes: a prefetch writes nothing.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..kernels import l2_prefetch as l2
from . import fast

MODES = ("mixer", "next", "down", "gateup")
PRESETS = {"0": (), "": (), "1": ("mixer", "next", "down")}
_PLAN_ATTR = "_l2_plan_{}"


def modes() -> frozenset[str]:
    value = os.environ.get("DELTASERVE_L2_PREFETCH", "0").strip()
    names = PRESETS.get(value)
    if names is None:
        names = tuple(n.strip() for n in value.split(",") if n.strip())
        bad = [n for n in names if n not in MODES]
        if bad:
            raise ValueError(f"DELTASERVE_L2_PREFETCH: unknown item(s) {bad}; expected a comma list of {MODES}, "
                             f"'0' or '1', found {value!r}")
    return frozenset(names)


def wanted(x: torch.Tensor, mode: str) -> bool:
    return mode in modes() and l2.supported(x)


def weight_tensors(module: nn.Module | None) -> list[torch.Tensor]:
    """The device tensors a decode GEMV of `module` reads: its tensor-core copy where one was built, else its
    parameters (a fused projection's, or every submodule's, e.g. a shared expert's three projections)."""
    if module is None:
        return []
    copy = module.__dict__.get(fast.MMA_ATTR)
    tensors = list(fast._tensors(copy)) if copy else list(module.parameters())
    return [t for t in tensors if t.is_cuda and t.numel() > 0]


def warm(x: torch.Tensor, owner: nn.Module, name: str, modules) -> None:
    """Prefetch the weights of `modules` (a plan made once, cached on `owner` under `name`). A plan is made on an
    eager step (it copies its chunk list to the device); a CUDA graph captured before any eager step would skip it,
    and every caller here warms up eagerly first."""
    key = _PLAN_ATTR.format(name)
    plan = owner.__dict__.get(key)
    if plan is None:
        if torch.cuda.is_current_stream_capturing():
            return
        tensors = [t for m in modules for t in weight_tensors(m)]
        plan = owner.__dict__[key] = l2.PrefetchPlan(tensors) if tensors else False
    if plan:
        l2.issue(x, plan.launch)


def warm_experts(x: torch.Tensor, owner: nn.Module, name: str, stacked, ids: torch.Tensor) -> None:
    """Prefetch slice ids[i] of every stacked [E, ...] tensor (the picked experts) once the top-k has written ids."""
    key = _PLAN_ATTR.format(name)
    plan = owner.__dict__.get(key)
    if plan is None:
        if torch.cuda.is_current_stream_capturing():
            return
        plan = owner.__dict__[key] = l2.SlicePlan(stacked)
    l2.issue(x, lambda: plan.launch(ids))


def join(x: torch.Tensor) -> None:
    if x.is_cuda:
        l2.join(x)
