"""Partial NeoX rotary embedding with (interleaved) multimodal sections, reference path."""

from __future__ import annotations

import torch


def rope_inv_freq(rotary_dim: int, theta: float, device=None) -> torch.Tensor:
    """inv_freq [rotary_dim/2] fp32: theta^(-2i/rotary_dim), the one formula rope_cos_sin and the fused GPU kernel
    (kernels/attention/triton_qk_prep.py, which takes this vector precomputed) share."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def rope_cos_sin(
    positions: torch.Tensor,
    rotary_dim: int,
    theta: float,
    mrope_section: tuple[int, ...] | None = None,
    mrope_interleaved: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim] in fp32 for positions [T] (text) or [3, T] (T/H/W ids).

    Frequency j (of rotary_dim/2) takes its position from axis T, H or W. Interleaved MRoPE: H if j % 3 == 1 and
    j < 3*sec[1]; W if j % 3 == 2 and j < 3*sec[2]; T otherwise. Non-interleaved: contiguous sections.
    Equal T/H/W ids reduce to plain 1-D RoPE.
    """
    half = rotary_dim // 2
    inv_freq = rope_inv_freq(rotary_dim, theta, positions.device)
    pos = positions.to(torch.float32)
    if pos.dim() == 1:
        freqs = pos[:, None] * inv_freq[None, :]  # [T, half]
    else:
        per_axis = pos[:, :, None] * inv_freq[None, None, :]  # [3, T, half]
        axis = torch.zeros(half, dtype=torch.long, device=positions.device)
        sec = mrope_section or (half, 0, 0)
        j = torch.arange(half, device=positions.device)
        if mrope_interleaved:
            axis[(j % 3 == 1) & (j < 3 * sec[1])] = 1
            axis[(j % 3 == 2) & (j < 3 * sec[2])] = 2
        else:
            axis[sec[0] : sec[0] + sec[1]] = 1
            axis[sec[0] + sec[1] :] = 2
        freqs = per_axis.gather(0, axis[None, None, :].expand(1, pos.shape[1], half))[0]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dims of x [T, H, D] NeoX-style (pairs j, j + rotary_dim/2); rest pass through."""
    rd = cos.shape[-1]
    xr, xp = x[..., :rd].float(), x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
    rotated = torch.cat([-x2, x1], dim=-1)
    out = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([out.to(x.dtype), xp], dim=-1)
