"""Dense SwiGLU MLP and the sparse MoE block."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import linear as linear_ops
from ..kernels.moe import moe_combine_reference, route_topk
from . import fast, fusion
from .config import ModelConfig
from .layers import WeightFactory
from .parallel import SINGLE, Parallel

# Prefill calls of up to this many tokens run the MoE block as per-token GEMVs; more go through the grouped expert
# matmul. Decode steps always take the GEMV kernels, whatever the batch, so a decoded token's bits never depend on
# how many other sequences share the step (batch invariance).
MOE_GEMV_MAX_TOKENS = 16


class MLP(nn.Module):
    """y = down(SiLU(gate(x)) * up(x))."""

    # fusion.fuse_projections: one [2I, H] weight, gate rows then up rows
    FUSED_PROJECTIONS = ("gate_up_proj", ("gate_proj", "up_proj"))

    def __init__(self, prefix: str, hidden: int, intermediate: int, weights: WeightFactory):
        super().__init__()
        self.gate_proj = weights.linear(f"{prefix}.gate_proj", hidden, intermediate)
        self.up_proj = weights.linear(f"{prefix}.up_proj", hidden, intermediate)
        self.down_proj = weights.linear(f"{prefix}.down_proj", intermediate, hidden)

    def forward(self, x: torch.Tensor, decode: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        """residual: added to the output (rounded once more, as `residual + mlp(x)` would be)."""
        proj = fusion.fused(self, "gate_up_proj") if fast.enabled(x) else None
        if proj is not None:
            gate, up = fast.linear(proj, x, decode).split(proj.sizes, dim=-1)
        else:
            gate, up = fast.linear(self.gate_proj, x, decode), fast.linear(self.up_proj, x, decode)
        out = fast.linear(self.down_proj, linear_ops.silu_mul(gate, up), decode)
        return out if residual is None else residual + out


class SparseMoeBlock(nn.Module):
    """Router (fp32 logits, routing contract) + routed experts + sigmoid-gated shared expert."""

    def __init__(self, prefix: str, config: ModelConfig, weights: WeightFactory, parallel: Parallel = SINGLE):
        super().__init__()
        h = config.hidden_size
        self.parallel, self.num_experts = parallel, config.num_experts  # expert parallelism: the bank holds E/N
        if parallel.expert_parallel:  # the tensor-core MoE takes every expert (global ids): never repack this bank
            fast.state(self).mma = ()  # (fast.mma_moe_weights: "not eligible")
        self.top_k = config.num_experts_per_tok
        self.normalize = config.norm_topk_prob
        self.gate = weights.linear(f"{prefix}.gate", h, config.num_experts)
        self.experts = weights.experts(f"{prefix}.experts", config.num_experts, h, config.moe_intermediate_size)
        self.shared_expert = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = MLP(f"{prefix}.shared_expert", h, config.shared_expert_intermediate_size, weights)
            self.shared_expert_gate = weights.linear(f"{prefix}.shared_expert_gate", h, 1)

    def forward(self, x: torch.Tensor, decode: bool = False, residual: torch.Tensor | None = None,
                norm: nn.Module | None = None, xs: torch.Tensor | None = None) -> torch.Tensor:
        """decode: every sequence contributes one token (selects the batch-invariant GEMV kernels on the GPU).
        residual [N, H]: returned as residual + block(x) (on the fast decode path added inside the combine kernel).
        norm (an RMSNorm; fast path, where routes_normed): x is the mixer's output and the block's input is
        norm(x + residual), made inside the router's launch; the block returns (x + residual) + block(input).
        xs [N, H / 64] fp32 (fast path, fast.moe_prep): x's group sums as the norm before the block made them, which
        the tensor-core experts read instead of their own."""
        if norm is not None:
            return self._forward_normed(x, residual, norm)
        if fast.enabled(x):
            return self._forward_fast(x, decode, residual, xs)
        if fast.state(self.experts).released:
            raise RuntimeError("SparseMoeBlock: the experts were repacked for the tensor-core MoE (moe_kernels='mma') "
                               "and their MLX tensors released; this block runs on the GPU fast path only")
        logits = self.gate(x.float())  # [N, E] fp32: the router runs in fp32 whatever the activation dtype
        weights, ids = route_topk(logits, self.top_k, self.normalize)
        shared = gate = None
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            gate = self.shared_expert_gate(x.float())
        expert = self.parallel.expert_fn(self.experts, self.num_experts)  # by global id (this rank's, under EP)
        out = moe_combine_reference(x, weights, ids, expert, shared, gate)
        return out if residual is None else residual + out

    def _shared_specs(self) -> dict:
        if self.shared_expert is None:
            return {}
        se = self.shared_expert
        return dict(
            shared_gate_proj=fast.weight_spec(se.gate_proj),
            shared_up=fast.weight_spec(se.up_proj),
            shared_down=fast.weight_spec(se.down_proj),
            shared_gate=fast.weight_spec(self.shared_expert_gate),
        )

    def routes_normed(self, x: torch.Tensor, decode: bool) -> bool:
        """Whether this block on the fast path takes its input norm inside its router launch (forward(norm=)):
        the tensor-core MoE with the shared expert stacked, a router launch without tiles (decode-sized blocks),
        up to kernels/moe/triton_decode.router_norm_tokens() tokens (4: the batch-1 deployments' steps; H200, batch 1
        +2.1%, 8 streams -0.2%, lab/NOTES.md). The same bits as the norm kernel then the router (one norm arithmetic), so the
        choice may follow the token count. Never for a prefill whose router logits come from the tensor-core router
        (triton_decode.prefill_routes_mma): its launch makes no norm."""
        from ..kernels.moe.mma_moe import wg_block_tile_rows
        from ..kernels.moe.triton_decode import prefill_routes_mma, route_normed_fits, router_norm_tokens

        mma = fast.mma_moe_weights(self, x)
        if mma is None or not mma.shared_last:  # shared_last: a shared expert
            return False
        if not decode and prefill_routes_mma(x, fast.weight_spec(self.gate)):  # a prefill's router: its own
            return False
        t = x.shape[0]
        return (t <= router_norm_tokens() and route_normed_fits(t, x.shape[1])
                and wg_block_tile_rows(mma, t * (self.top_k + 1)) is None)

    def _forward_normed(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        from ..kernels.moe.mma_moe import moe_block_mma
        from ..kernels.moe.triton_decode import route_normed

        mma = fast.mma_moe_weights(self, x)
        routing, y, r, xs = route_normed(x, residual, norm.weight, norm.eps, norm.offset, fast.weight_spec(self.gate),
                                         self.top_k, self.normalize, fast.weight_spec(self.shared_expert_gate),
                                         shared_slot=mma.num_experts - 1)
        return moe_block_mma(y, routing.ids, routing.weights, routing.shared_weight, mma, residual=r, xs=xs,
                             shared_slotted=True)

    def _forward_fast(self, x: torch.Tensor, decode: bool, residual: torch.Tensor | None,
                      xs: torch.Tensor | None = None) -> torch.Tensor:
        from ..kernels.moe.triton_decode import moe_decode, moe_route

        router = fast.weight_spec(self.gate)
        shared = self._shared_specs()
        if self.parallel.expert_parallel:  # this rank's experts through the grouped matmul, other picks zeroed
            gate, up, down = fast.stacked_specs(self.experts)
            routing = moe_route(x, router, self.top_k, self.normalize, shared.get("shared_gate"))
            ids, mine = self.parallel.local_routes(routing.ids, self.num_experts)
            return self._grouped(x, routing._replace(ids=ids), gate, up, down, residual, mine)
        mma = fast.mma_moe_weights(self, x)
        if mma is not None:  # every token count, decode or prefill: one experts family (a prefill's router: its own)
            from ..kernels.moe.mma_moe import moe_block_mma, wg_block_tile_rows

            slot = mma.num_experts - 1 if mma.shared_last else None  # the shared expert: routed slot k
            # the warpgroup-MMA launches' tiles from the router (at decode sizes, in its launch: the same tiles)
            tile_rows = None if slot is None else wg_block_tile_rows(mma, x.shape[0] * (self.top_k + 1))
            routing = moe_route(x, router, self.top_k, self.normalize, shared.get("shared_gate"),
                                separate_topk=True, shared_slot=slot, tile_rows=tile_rows,
                                prefill=not decode, router_codes=None if decode else fast.router_codes(self.gate))
            # a decode step's expert tiles as two sets on two streams from fast.moe_fork's tokens (the same bits)
            fork = fast.moe_fork(x.shape[0], x) if decode else None
            return moe_block_mma(x, routing.ids, routing.weights, routing.shared_weight, mma, residual=residual,
                                 xs=xs, shared_slotted=slot is not None, tiles=routing.tiles, fork=fork)
        gate, up, down = fast.stacked_specs(self.experts)
        if decode:
            from ..kernels.moe.triton_moe_gemv import moe_decode_v2

            return moe_decode_v2(x, router, gate, up, down, self.top_k, normalize=self.normalize, residual=residual,
                                 separate_topk=True, **shared)
        if decode or x.shape[0] <= MOE_GEMV_MAX_TOKENS:
            return moe_decode(x, router, gate, up, down, self.top_k, normalize=self.normalize, residual=residual,
                              **shared)
        routing = moe_route(x, router, self.top_k, self.normalize, shared.get("shared_gate"))
        return self._grouped(x, routing, gate, up, down, residual)

    def _grouped(self, x: torch.Tensor, routing, gate, up, down, residual: torch.Tensor | None,
                 mine: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill: every (token, pick) row through the grouped expert matmul (rows sorted into expert tiles once
        for gate, up and down), then one combine launch: the k picks in pick order (ascending expert id), then the
        shared expert, summed in fp32 and rounded once, + residual rounded once (the reference's two roundings).
        mine [T, k] (expert parallelism): the picks this rank holds; the others' terms are zeroed."""
        from ..kernels.moe.triton_combine import combine_slots
        from ..kernels.quant.triton_affine import affine_matmul_experts, expert_tiles_for

        t, k = routing.ids.shape
        ids = routing.ids.reshape(-1)
        tiles = expert_tiles_for(ids, gate.w.shape[0])

        def run(spec, inp, repeat):
            sc = None if spec.bits == 16 else spec.scales
            bi = None if spec.bits == 16 else spec.biases
            return affine_matmul_experts(inp, spec.w, sc, bi, ids, spec.bits, spec.group, x_repeat=repeat,
                                         tiles=tiles)

        h = linear_ops.silu_mul(run(gate, x, k), run(up, x, k))  # [T*k, I]
        y = run(down, h, 1).view(t, k, -1)  # [T*k, H] -> [T, k, H]
        if mine is not None:
            y = y.masked_fill(~mine[:, :, None], 0)
        slots = k + int(self.shared_expert is not None)
        part = torch.empty(t, slots, x.shape[1], dtype=torch.float32, device=x.device)  # w_s * bf16 y_s, fp32
        torch.mul(routing.weights[:, :, None], y, out=part[:, :k])
        if self.shared_expert is not None:
            torch.mul(routing.shared_weight[:, None], self.shared_expert(x), out=part[:, k])
        return combine_slots(part, residual, out=torch.empty_like(x))
