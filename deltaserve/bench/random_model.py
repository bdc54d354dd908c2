"""A full-size model with random weights in the real in-memory layout, generated directly on the device.

Used by `deltaserve bench --preset NAME --quant q4`, so no 19 GB checkpoint file is needed. The model is built on
the meta device with the same factory a checkpoint of that format would use, then every parameter is allocated on
the target device and filled: packed affine codes uniform over their range, scales/biases giving weights uniform in
+-sqrt(3/fan_in) (unit-variance activations), zero-centred norms near 0, DeltaNet decays in their published range.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..model import ModelConfig
from ..model.layers import DenseWeights
from ..model.registry import build_model
from ..quant.affine import AffineSpec, AffineWeights, QuantScheme

GATE_SUFFIXES = (".mlp.gate", ".mlp.shared_expert_gate")


def quant_scheme(config: ModelConfig, bits: int, group_size: int = 64, mtp_layers: int = 0) -> QuantScheme:
    """mlx-community style: `bits` everywhere, 8-bit routers and shared-expert gates (the MTP head's too)."""
    overrides = {}
    if config.is_moe:
        layers = [f"layers.{i}" for i in range(config.num_hidden_layers)] + [f"mtp.layers.{j}" for j in
                                                                             range(mtp_layers)]
        for layer in layers:
            for suffix in GATE_SUFFIXES:
                overrides[f"{layer}{suffix}"] = AffineSpec(8, group_size)
    return QuantScheme(AffineSpec(bits, group_size), overrides)


def build_random_model(
    config: ModelConfig, quant: str | None, device: torch.device | str, dtype=torch.bfloat16, seed: int = 0,
    mtp_layers: int = 0,
) -> nn.Module:
    """mtp_layers: also the MTP draft head (model/mtp.py), for speculative decoding's benchmark."""
    if quant in (None, "bf16"):
        factory = DenseWeights()
    else:
        bits = {"q4": 4, "q8": 8}[quant]
        factory = AffineWeights(quant_scheme(config, bits, mtp_layers=mtp_layers), model_type=config.model_type)
    with torch.device("meta"):
        model = build_model(config, factory, mtp_layers=mtp_layers)
    gen = torch.Generator(device=device).manual_seed(seed)
    for mod_name, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            value = _random_param(f"{mod_name}.{name}", module, name, param, device, dtype, gen)
            setattr(module, name, nn.Parameter(value, requires_grad=False))
    model.fuse_projections()  # as load_checkpoint does: the bench measures the served layout
    return model.eval()


def _random_param(full: str, module: nn.Module, name: str, meta: torch.Tensor, device, dtype, gen) -> torch.Tensor:
    shape = meta.shape
    spec = getattr(module, "spec", None)
    if meta.dtype == torch.uint32:  # packed codes: every bit pattern is a valid code
        return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device=device, generator=gen).view(torch.uint32)
    if spec is not None and name in ("scales", "biases"):
        in_features = shape[-1] * spec.group_size
        half = math.sqrt(3.0 / in_features)
        levels = 2**spec.bits - 1
        if name == "scales":
            return torch.full(shape, 2 * half / levels, dtype=dtype, device=device)
        return torch.full(shape, -half, dtype=dtype, device=device)
    if full.endswith("A_log"):
        return torch.log(torch.rand(shape, device=device, generator=gen) * 15 + 1).float()
    if full.endswith("dt_bias"):
        return torch.ones(shape, dtype=torch.float32, device=device)
    if full.endswith("linear_attn.norm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    if "norm" in full:
        return (torch.randn(shape, device=device, generator=gen) * 0.05).to(dtype)
    if full.endswith("conv1d.weight"):
        return (torch.randn(shape, device=device, generator=gen) * 0.5).to(dtype)
    fan_in = shape[-1]
    if full.endswith("embed_tokens.weight"):
        fan_in = 1
    return (torch.randn(shape, device=device, generator=gen) / math.sqrt(fan_in)).to(dtype)
