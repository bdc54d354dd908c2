"""Sparse MoE combine, reference path."""

from __future__ import annotations

from typing import Callable

import torch


def moe_combine_reference(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    expert_fn: Callable[[torch.Tensor, int], torch.Tensor],
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = sum_i w_i * expert_{id_i}(x) [+ sigmoid(shared_gate) * shared], accumulated in fp32, rounded once.

    x [N, H]; weights [N, k] fp32; ids [N, k]; shared [N, H] (the shared expert's output) and shared_gate [N, 1]
    (its pre-sigmoid gate, fp32). Each row's terms are added in ascending expert id, then the shared expert: a
    fixed order per row, whatever else is in the batch.
    """
    acc = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():  # sorted ascending
        rows, slot = torch.nonzero(ids == e, as_tuple=True)
        y = expert_fn(x[rows], e)
        acc.index_add_(0, rows, y.float() * weights[rows, slot, None])
    if shared is not None:
        acc += torch.sigmoid(shared_gate.float()) * shared.float()
    return acc.to(x.dtype)
