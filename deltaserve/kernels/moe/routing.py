"""The routing contract (shared by the CPU reference and every GPU kernel).

  - router logits in fp32;
  - top-k by logit, ties broken towards the LOWER expert id;
  - weights w_i = exp(l_i - l_top) over the k picks, normalised over the k (== softmax, top-k, renormalise);
    with normalize=False (Qwen3-Next norm_topk_prob false): w_i = softmax over all experts at the picks.
"""

from __future__ import annotations

import torch


def route_topk(logits: torch.Tensor, k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E] (any float dtype, computed in fp32) -> weights [N, k] fp32, ids [N, k] int64."""
    logits = logits.float()
    # A stable descending sort keeps equal logits in ascending id order: ties go to the lower id.
    vals, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    top, ids = vals[:, :k], ids[:, :k]
    w = torch.exp(top - top[:, :1])
    if normalize:
        w = w / w.sum(-1, keepdim=True)
    else:
        w = torch.exp(top - torch.logsumexp(logits, dim=-1, keepdim=True))
    return w, ids
