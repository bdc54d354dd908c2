"""Dense SwiGLU MLP and the sparse MoE block."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import linear as linear_ops
from ..kernels.moe import moe_combine_reference, route_topk
from .config import ModelConfig
from .layers import WeightFactory


class MLP(nn.Module):
    """y = down(SiLU(gate(x)) * up(x))."""

    def __init__(self, prefix: str, hidden: int, intermediate: int, weights: WeightFactory):
        super().__init__()
        self.gate_proj = weights.linear(f"{prefix}.gate_proj", hidden, intermediate)
        self.up_proj = weights.linear(f"{prefix}.up_proj", hidden, intermediate)
        self.down_proj = weights.linear(f"{prefix}.down_proj", intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(linear_ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class SparseMoeBlock(nn.Module):
    """Router (fp32 logits, routing contract) + routed experts + sigmoid-gated shared expert."""

    def __init__(self, prefix: str, config: ModelConfig, weights: WeightFactory):
        super().__init__()
        h = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.normalize = config.norm_topk_prob
        self.gate = weights.linear(f"{prefix}.gate", h, config.num_experts)
        self.experts = weights.experts(f"{prefix}.experts", config.num_experts, h, config.moe_intermediate_size)
        self.shared_expert = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = MLP(f"{prefix}.shared_expert", h, config.shared_expert_intermediate_size, weights)
            self.shared_expert_gate = weights.linear(f"{prefix}.shared_expert_gate", h, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x.float())  # [N, E] fp32: the router runs in fp32 whatever the activation dtype
        weights, ids = route_topk(logits, self.top_k, self.normalize)
        shared = gate = None
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            gate = self.shared_expert_gate(x.float())
        return moe_combine_reference(x, weights, ids, self.experts.forward_expert, shared, gate)
