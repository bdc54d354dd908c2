"""Per-image index tables of the vision tower (spec 3.10), computed from the images' patch grids alone.

An image of grid (t, h, w) patches contributes t * h * w patch rows in "merge-window" order: for each temporal group,
the (h/m) x (w/m) windows of m x m patches (m = spatial_merge_size) row by row, and inside a window its m x m patches
row by row. Every table below lists the rows in that order.
"""

from __future__ import annotations

from typing import Sequence

import torch

Grid = tuple[int, int, int]  # (t, h, w) in patches


def window_order_coords(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) [h*w] int64 of each patch of one frame, in merge-window order."""
    rows = torch.arange(h).view(h // merge, 1, merge, 1).expand(h // merge, w // merge, merge, merge)
    cols = torch.arange(w).view(1, w // merge, 1, merge).expand(h // merge, w // merge, merge, merge)
    return rows.reshape(-1), cols.reshape(-1)


def rotary_coords(grids: Sequence[Grid], merge: int) -> torch.Tensor:
    """[N, 2] int64 (row, col) of every patch row of the images (repeated for each temporal group)."""
    out = []
    for t, h, w in grids:
        r, c = window_order_coords(h, w, merge)
        out.append(torch.stack([r, c], dim=-1).repeat(t, 1))
    return torch.cat(out)


def attention_bounds(grids: Sequence[Grid]) -> list[int]:
    """cu_seqlens as a host list: attention runs within each temporal group of each image (h*w rows each)."""
    bounds = [0]
    for t, h, w in grids:
        for _ in range(t):
            bounds.append(bounds[-1] + h * w)
    return bounds


def position_taps(grids: Sequence[Grid], side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps into the side x side learned position table: indices [N, 4] int64 and weights [N, 4] fp32.

    Patch (r, c) of an h x w grid samples the table at (r * (side-1)/(h-1), c * (side-1)/(w-1)) (corner aligned:
    the grid's corners land on the table's corners); taps (floor, floor+1) per axis clamped to the table, weights
    the bilinear ones ((1-dy)(1-dx), (1-dy)dx, dy(1-dx), dy dx)."""
    idx, wts = [], []
    for t, h, w in grids:
        r, c = window_order_coords(h, w, merge)
        ty, wy = _axis_taps(r, h, side)
        tx, wx = _axis_taps(c, w, side)
        idx.append((ty[:, :, None] * side + tx[:, None, :]).reshape(-1, 4).repeat(t, 1))
        wts.append((wy[:, :, None] * wx[:, None, :]).reshape(-1, 4).repeat(t, 1))
    return torch.cat(idx), torch.cat(wts)


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(taps [n, 2] int64, weights [n, 2] fp32) of positions index (0..size-1) mapped corner-aligned onto side."""
    src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    frac = src - floor
    lo = floor.long()
    taps = torch.stack([lo, lo + 1], dim=-1).clamp(0, side - 1)
    return taps, torch.stack([1 - frac, frac], dim=-1)


def merged_tokens(grid: Grid, merge: int) -> int:
    """Language-model tokens of one image: one per m x m window per temporal group."""
    t, h, w = grid
    return t * h * w // (merge * merge)
