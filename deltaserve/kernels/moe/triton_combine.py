"""The MoE combine as one launch for any number of tokens: out = bf16(sum over slots s of part[t, s]) in slot order,
+ residual rounded once (the decode combine kernel of triton_moe_gemv.py, exposed for the prefill path)."""

from __future__ import annotations

import torch

from .triton_moe_gemv import MoeLaunch, launch_combine


def combine_slots(part: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """part [T, S, H] fp32 contiguous (slot s of token t: its weighted, bf16-rounded expert output), residual
    [T, H] or None, out [T, H] (bf16/fp16, rows contiguous). Slots are added 0..S-1 in fp32 (the pick order of
    the routing contract, the shared expert last), rounded to out's dtype, then bf16(residual + that)."""
    t, slots, h = part.shape
    if part.dtype != torch.float32 or not part.is_contiguous():
        raise ValueError(f"combine_slots: part must be contiguous fp32 [T, S, H], found {part.dtype} "
                         f"{tuple(part.shape)}")
    if out.shape != (t, h) or out.stride(-1) != 1 or (residual is not None and residual.shape != (t, h)):
        raise ValueError(f"combine_slots: out {tuple(out.shape)} / residual "
                         f"{None if residual is None else tuple(residual.shape)} must be [{t}, {h}]")
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    if t:  # the decode MoE's combine launch (PDL-aware: it waits for the parts, not for its own launch)
        launch_combine(part, out, residual, out, slots, MoeLaunch())
    return out
