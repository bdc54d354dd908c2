"""An MoE block on tensor cores for any number of tokens (decode steps of 1-64 streams, prefill chunks): the routed
experts through `quant.mma_gemv.mma_matmul_experts` (each (token, pick) row an MMA column of its expert's tile, so
every picked expert's weights are read once per launch, not once per pick) and the shared expert through
`mma_gemv`, then the one combine of the prefill path (`triton_combine.combine_slots`).

Why: the CUDA-core decode MoE (triton_moe_gemv.py) spends an FMA per code and row, and at 64 streams the block is
~17 ms of a ~40 ms step (bench/NOTES.md); on tensor cores the cost per code does not grow with the rows sharing an
expert. The weights are the repacked layout (`repack_q4_experts`, `repack_q4`), which a model would hold instead of
the MLX one (not wired into the model yet).

Arithmetic, per token: the k picks in the routing contract's order, each bf16(W_down h) with h = bf16(SiLU(g) * u)
from bf16 g and u, scaled by its routing weight in fp32, the shared expert last, summed in slot order and rounded
once, + residual rounded once: the prefill path's contract (SparseMoeBlock._grouped). A token's bits depend on its
own x and routing only (GPU test: alone == among 63 others).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..linear import silu_mul
from ..quant.mma_gemv import experts_column_tiles, mma_gemv, mma_matmul_experts
from .triton_combine import combine_slots


class MmaExperts(NamedTuple):
    """Repacked weights of one MoE block: (words, sb) pairs. gate/up [E, I/16, H/64, ...], down [E, H/16, I/64,
    ...]; the shared expert's gate/up [I_s/16, H/64, ...], down [H/16, I_s/64, ...] or None."""

    gate: tuple
    up: tuple
    down: tuple
    shared_gate: tuple | None = None
    shared_up: tuple | None = None
    shared_down: tuple | None = None


def moe_block_mma(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, shared_weight: torch.Tensor | None,
                  experts: MmaExperts, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H] bf16; ids / weights [T, k] (the routing contract: int32 expert ids, fp32 weights); shared_weight
    [T] fp32 (sigmoid of the shared gate) when the block has a shared expert. Returns [T, H] bf16 (+ residual)."""
    from ..quant.triton_affine import expert_tiles
    from ..quant.triton_gemv import prep_x

    if x.device.type != "cuda":
        raise RuntimeError("moe_block_mma: the tensor-core MoE needs a CUDA device (its kernels are Gluon)")
    t, k = ids.shape
    num_e = experts.gate[0].shape[0]
    flat = ids.reshape(-1)
    tiles = expert_tiles(flat, num_e, 8 * experts_column_tiles(t * k, num_e))
    xs = prep_x(x, 4, 64)[1]  # x's group sums: shared by gate, up and the shared expert
    g = mma_matmul_experts(x, *experts.gate, flat, k, xs=xs, tiles=tiles)
    u = mma_matmul_experts(x, *experts.up, flat, k, xs=xs, tiles=tiles)
    y = mma_matmul_experts(silu_mul(g, u), *experts.down, flat, 1, tiles=tiles).view(t, k, -1)
    shared = experts.shared_gate is not None
    part = torch.empty(t, k + int(shared), x.shape[1], dtype=torch.float32, device=x.device)
    torch.mul(weights[:, :, None], y, out=part[:, :k])
    if shared:
        if shared_weight is None:
            raise ValueError("moe_block_mma: the block has a shared expert but no shared_weight was given")
        sg = mma_gemv(x, *experts.shared_gate, xs=xs)
        su = mma_gemv(x, *experts.shared_up, xs=xs)
        torch.mul(shared_weight[:, None], mma_gemv(silu_mul(sg, su), *experts.shared_down), out=part[:, k])
    return combine_slots(part, residual, out=torch.empty_like(x))
