"""Fused input projections: the projections of a layer that read the same input, stored as ONE weight.

After loading, `fuse_projections(model)` concatenates along the output rows (dim 0) the weights of

  GatedDeltaNet   in_proj       = in_proj_qkv | in_proj_z | in_proj_b | in_proj_a    (this order: conv_dim, value_dim,
                                                                                      Hv, Hv output rows)
  GatedAttention  qkv_proj      = q_proj | k_proj | v_proj                           (Hq*D*(1+gated), Hkv*D, Hkv*D)
  MLP             gate_up_proj  = gate_proj | up_proj                                (I, I)

so the fast path runs one GEMV (or matmul) launch per group instead of one per projection, and splits the output
[T, sum(out)] by column views. Memory does not grow: every part's parameters are rebound to ROW-SLICE VIEWS of the
fused tensors (contiguous, offset into the fused storage) and the originals are freed, so the reference path, the
state_dict names/shapes and load_state_dict (copy_ into the views) keep working unchanged.

A group is fused only when every part has the same storage kind, read by duck typing as fast.py reads weights (the
model may not import quant):
  dense   parameters exactly {weight}, 2-D bf16/fp16/fp32, same dtype and input width;
  affine  parameters exactly {weight, scales, biases} and a `spec` (bits, group_size): equal specs, dtypes, widths.
Anything else (FP8 blocks, meta tensors, mixed kinds or devices) is left unfused: the layer then runs its parts.

The fused module is kept in the owner's __dict__ (not a registered submodule), so it adds no state_dict entries and
`model.to(...)` does not see it; `fused(owner, name)` checks that every part still lies where fusion put it (a
moved or re-assigned parameter makes the group stale: the layer falls back to its parts; fuse again to rebuild).
"""

from __future__ import annotations

import torch
from torch import nn

from . import fast

# Each owner class declares FUSED_PROJECTIONS = (fused name, part attribute names in output-row order); the
# layer modules import this one (for `fused`), so it never imports them.
DENSE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ATTR = "_fused_{}"


class FusedLinear(nn.Module):
    """Row-concatenated projections. weight [sum(out), K] (dense) or packed weight + scales + biases (affine, with
    `spec`); `sizes` the output rows of each part in order; forward(x) = cat(part(x)) (the parts read the views)."""

    def __init__(self, parts: list[nn.Module], tensors: dict[str, torch.Tensor], spec=None):
        super().__init__()
        for key, t in tensors.items():
            setattr(self, key, nn.Parameter(t, requires_grad=False))
        if spec is not None:
            self.spec = spec
        self.sizes = [p.weight.shape[0] for p in parts]
        self._parts = parts  # plain list: the parts stay owned (and named) by their layer
        self._keys = tuple(tensors)
        self._ptrs = [tuple(getattr(p, k).data_ptr() for k in self._keys) for p in parts]

    def intact(self) -> bool:
        """Every part's tensors are still the views fusion installed (not moved, cast or re-assigned)."""
        return all(
            tuple(getattr(p, k).data_ptr() for k in self._keys) == ptrs for p, ptrs in zip(self._parts, self._ptrs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self._parts], dim=-1)


def _kind(module: nn.Module):
    """("dense", (dtype, K)) / ("affine", (bits, group, dtypes, K)) / None for a storage kind we do not fuse."""
    params = dict(module.named_parameters(recurse=False))
    w = params.get("weight")
    if w is None or w.is_meta or w.dim() != 2 or w.stride(-1) != 1:
        return None
    if set(params) == {"weight"} and w.dtype in DENSE_DTYPES:
        return "dense", (w.dtype, w.shape[1], w.device)
    spec = getattr(module, "spec", None)
    if set(params) == {"weight", "scales", "biases"} and hasattr(spec, "bits") and hasattr(spec, "group_size"):
        s, b = params["scales"], params["biases"]
        if s.dim() != 2 or b.shape != s.shape or s.shape[0] != w.shape[0] or w.dtype not in (torch.uint32, torch.int32):
            return None
        return "affine", (spec.bits, spec.group_size, w.dtype, s.dtype, b.dtype, w.shape[1], s.shape[1], w.device)
    return None


def _fuse_group(owner: nn.Module, name: str, attrs: tuple[str, ...]) -> bool:
    key = _ATTR.format(name)
    current = owner.__dict__.get(key)
    if current is not None and current.intact():
        return True  # idempotent: already fused and untouched
    parts = [getattr(owner, a, None) for a in attrs]
    if any(p is None for p in parts):
        return False
    kinds = [_kind(p) for p in parts]
    if kinds[0] is None or any(k != kinds[0] for k in kinds):
        owner.__dict__.pop(key, None)
        return False
    keys = ("weight",) if kinds[0][0] == "dense" else ("weight", "scales", "biases")
    # One tensor kind at a time: peak extra memory is this group's largest tensor set, freed part by part.
    fused_tensors = {}
    for k in keys:
        fused_tensors[k] = torch.cat([getattr(p, k).detach() for p in parts], dim=0)
        row = 0
        for p in parts:
            n = p._parameters[k].shape[0]
            p._parameters[k] = nn.Parameter(fused_tensors[k][row : row + n], requires_grad=False)
            row += n
    for p in parts:
        fast.state(p).specs.clear()  # fast.weight_spec kept the old tensors: rebuild from the views
    fused_linear = FusedLinear(parts, fused_tensors, getattr(parts[0], "spec", None))
    # a deployment's kernel plan (fast.set_plan) on the parts covers the fused weight too
    plan = fast.state(parts[0]).plan
    if plan is not None:
        fast.state(fused_linear).plan = plan
    owner.__dict__[key] = fused_linear
    return True


def fuse_projections(model: nn.Module) -> int:
    """Fuse every fusable projection group of the model in place (layer by layer); returns how many groups are
    fused. Idempotent. Call after the weights are loaded (on their final device)."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            group = getattr(type(module), "FUSED_PROJECTIONS", None)
            if group is not None:
                count += _fuse_group(module, *group)
    return count


def fused(owner: nn.Module, name: str) -> FusedLinear | None:
    """The owner's fused projection group `name`, or None when it is absent or stale."""
    f = owner.__dict__.get(_ATTR.format(name))
    return f if f is not None and f.intact() else None
