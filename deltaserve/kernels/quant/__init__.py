"""Quantised-weight ops: MLX affine groups (2-8 bit) and Qwen FP8 blocks. Reference (CPU) path here; GPU kernels
later sit beside these and read the same in-memory layouts."""

from .affine import (
    SUPPORTED_BITS,
    SUPPORTED_GROUP_SIZES,
    affine_dequantize,
    affine_gather_rows,
    affine_linear,
    affine_quantize,
    check_affine_spec,
    pack_bits,
    packed_width,
    unpack_bits,
)
from .fp8 import FP8_MAX, as_fp8, fp8_block_dequantize, fp8_block_linear, fp8_block_quantize

__all__ = [
    "SUPPORTED_BITS",
    "SUPPORTED_GROUP_SIZES",
    "affine_dequantize",
    "affine_gather_rows",
    "affine_linear",
    "affine_quantize",
    "check_affine_spec",
    "pack_bits",
    "packed_width",
    "unpack_bits",
    "FP8_MAX",
    "as_fp8",
    "fp8_block_dequantize",
    "fp8_block_linear",
    "fp8_block_quantize",
]
