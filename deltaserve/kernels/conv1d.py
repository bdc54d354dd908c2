"""Causal depthwise conv1d with a carried state (the DeltaNet short convolution), reference path."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(causal depthwise conv) over time for one sequence.

    x      [T, C]      new pre-conv inputs (activation dtype)
    weight [C, K]      w[c, K-1] multiplies the current token
    state  [C, K-1]    the K-1 inputs before x (oldest first); None means zeros (sequence start)
    returns y [T, C] in x's dtype (computed in fp32) and the new state [C, K-1] (the last K-1 inputs).
    """
    t, c = x.shape
    k = weight.shape[1]
    if state is None:
        state = x.new_zeros(c, k - 1)
    xs = torch.cat([state.to(x.dtype).t(), x], dim=0)  # [K-1+T, C]
    xf = xs.float()
    wf = weight.float()
    y = torch.zeros(t, c, dtype=torch.float32, device=x.device)
    for j in range(k):
        y += xf[j : j + t] * wf[:, j]
    new_state = xs[xs.shape[0] - (k - 1) :].t().contiguous()  # last K-1 inputs, oldest first
    return F.silu(y).to(x.dtype), new_state
