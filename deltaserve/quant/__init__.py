"""Quantised weight formats: one small module per format with its config entry, packed modules and WeightFactory.

- `affine`: MLX affine groups (mlx-community checkpoints; also what `deltaserve quantize` writes)
- `fp8`:    Qwen FP8 128x128 blocks (the official -FP8 releases)
"""

from .affine import (
    AffineEmbedding,
    AffineLinear,
    AffineSpec,
    AffineStacked,
    AffineWeights,
    QuantConfigError,
    QuantScheme,
    parse_quantization,
)
from .fp8 import Fp8BlockWeights, Fp8Linear, Fp8Spec, Fp8Stacked, parse_fp8_config
from .modules import DenseEmbedding, DenseLinear, DenseStacked, StackedExperts

__all__ = [
    "AffineEmbedding",
    "AffineLinear",
    "AffineSpec",
    "AffineStacked",
    "AffineWeights",
    "QuantConfigError",
    "QuantScheme",
    "parse_quantization",
    "Fp8BlockWeights",
    "Fp8Linear",
    "Fp8Spec",
    "Fp8Stacked",
    "parse_fp8_config",
    "DenseEmbedding",
    "DenseLinear",
    "DenseStacked",
    "StackedExperts",
]
