"""MLX affine group quantisation: packing, quantise, dequantise and the packed matmul (reference path).

In-memory layout (identical to MLX's, so GPU kernels read the same buffers):

  weight  uint32 [..., out, in * bits / 32]   each row is a little-endian bit stream: element i of the row
                                               occupies bits [i*bits, (i+1)*bits) of the row's bytes
  scales  [..., out, in / group_size]         model dtype (bf16 in released checkpoints)
  biases  [..., out, in / group_size]         same dtype
  decode  w[r, i] = scales[r, i // g] * q[r, i] + biases[r, i // g]

For bits 2/4/8 the stream is 32/bits values per uint32, lowest bits first; for 3/5/6 MLX packs 8 (3-bit, 5-bit) or
4 (6-bit) values into 3 or 5 bytes with the same little-endian order, so one rule ("bit stream") covers all widths.
Leading dims (e.g. the expert axis E) are carried through untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
SUPPORTED_GROUP_SIZES = (32, 64, 128)

# bits -> (values per pack, bytes per pack): the smallest run of whole bytes holding whole values.
_PACKS = {2: (4, 1), 3: (8, 3), 4: (2, 1), 5: (8, 5), 6: (4, 3), 8: (1, 1)}

# Rows of `out` dequantised at once by the matmul, so the temporary dense copy stays small.
_MATMUL_CHUNK_ELEMS = 1 << 22


def check_affine_spec(bits: int, group_size: int, where: str = "") -> None:
    """Raise ValueError (naming `where`) unless (bits, group_size) is an MLX affine combination."""
    at = f"{where}: " if where else ""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"{at}unsupported affine bits {bits}; supported: {', '.join(map(str, SUPPORTED_BITS))}")
    if group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(
            f"{at}unsupported group size {group_size}; supported: {', '.join(map(str, SUPPORTED_GROUP_SIZES))}"
        )


def packed_width(in_features: int, bits: int) -> int:
    """uint32 words per packed row: in * bits / 32 (in is a multiple of the group size, hence of 32)."""
    if (in_features * bits) % 32:
        raise ValueError(f"in_features {in_features} * bits {bits} is not a multiple of 32")
    return in_features * bits // 32


def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes [..., n] in [0, 2^bits) -> uint32 [..., n * bits / 32] (little-endian bit stream per row)."""
    per, nbytes = _PACKS[bits]
    *lead, n = q.shape
    words = packed_width(n, bits)
    wide = torch.int64 if nbytes > 3 else torch.int32  # a pack holds per*bits <= 40 bits
    codes = q.to(wide).reshape(*lead, n // per, per)
    pack = codes[..., 0].clone()
    for k in range(1, per):
        pack |= codes[..., k] << (k * bits)  # [..., n/per] one integer per pack
    stream = torch.empty(*lead, n // per, nbytes, dtype=torch.uint8, device=q.device)
    for j in range(nbytes):
        stream[..., j] = (pack >> (8 * j)) & 0xFF
    return stream.reshape(*lead, words * 4).view(torch.int32).view(torch.uint32)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint32 [..., m] -> integer codes [..., m * 32 / bits] as int32 (inverse of pack_bits)."""
    per, nbytes = _PACKS[bits]
    *lead, m = packed.shape
    n = m * 32 // bits
    stream = packed.contiguous().view(torch.int32).view(torch.uint8).reshape(*lead, n // per, nbytes)
    wide = torch.int64 if nbytes > 3 else torch.int32
    pack = stream[..., 0].to(wide)
    for j in range(1, nbytes):
        pack = pack | (stream[..., j].to(wide) << (8 * j))
    shifts = torch.arange(per, dtype=wide, device=packed.device) * bits
    codes = (pack.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., n/per, per]
    return codes.reshape(*lead, n).to(torch.int32)


def affine_quantize(
    w: torch.Tensor, bits: int, group_size: int, out_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MLX's affine rule, bit for bit: w [..., n] -> (packed uint32 [..., n*bits/32], scales, biases [..., n/g]).

    Per group, in fp32: |scale| = max((max - min) / (2^bits - 1), 1e-7); the edge with the larger magnitude
    (min, scale > 0; or max, scale < 0) becomes the bias and the scale is re-fitted to edge / round(edge / scale)
    so the edge decodes exactly (unless that rounds to 0: then bias 0 and the first scale); q = clip(round((w -
    bias) / scale), 0, 2^bits - 1) with round-half-to-even. scales/biases are rounded once to out_dtype (default
    w's dtype), exactly as MLX stores them.
    """
    check_affine_spec(bits, group_size)
    *lead, n = w.shape
    if n % group_size:
        raise ValueError(f"last dim {n} is not a multiple of the group size {group_size}")
    n_bins = float((1 << bits) - 1)
    g = w.reshape(*lead, n // group_size, group_size).float()
    w_min, w_max = g.amin(-1), g.amax(-1)
    lower_edge = w_min.abs() > w_max.abs()
    # Divide by a tensor, not a Python scalar: CUDA turns `t / scalar` into `t * (1 / scalar)`, which rounds
    # differently from MLX's division and would change codes on GPU.
    scale = torch.clamp((w_max - w_min) / torch.full_like(w_max, n_bins), min=1e-7)
    scale = torch.where(lower_edge, scale, -scale)
    edge = torch.where(lower_edge, w_min, w_max)
    q0 = torch.round(edge / scale)
    nonzero = q0 != 0
    scale = torch.where(nonzero, edge / torch.where(nonzero, q0, 1.0), scale)
    bias = torch.where(nonzero, edge, torch.zeros_like(edge))
    q = torch.clamp(torch.round((g - bias.unsqueeze(-1)) / scale.unsqueeze(-1)), 0, n_bins)
    dtype = out_dtype or w.dtype
    return pack_bits(q.reshape(*lead, n), bits), scale.to(dtype), bias.to(dtype)


def affine_dequantize(
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Packed [..., out, m] -> dense [..., out, m*32/bits]: scale * q + bias evaluated in fp32, rounded once to
    dtype (default: the scales' dtype)."""
    q = unpack_bits(packed, bits)
    *lead, n = q.shape
    g = q.reshape(*lead, n // group_size, group_size).float()
    w = g * scales.float().unsqueeze(-1) + biases.float().unsqueeze(-1)
    return w.reshape(*lead, n).to(dtype or scales.dtype)


def affine_linear(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """y = x W^T with W [out, in] held packed; x [..., in] -> [..., out] in x's dtype.

    Dequantises blocks of output rows on the fly (never the whole matrix), so a row's result depends only on its
    own inputs and on W: the same for any batch composition.
    """
    out = packed.shape[0]
    in_features = packed.shape[1] * 32 // bits
    if x.shape[-1] != in_features:
        raise ValueError(f"affine_linear: input has {x.shape[-1]} features, packed weight expects {in_features}")
    rows = max(1, _MATMUL_CHUNK_ELEMS // max(1, in_features))
    if rows >= out:
        return F.linear(x, affine_dequantize(packed, scales, biases, bits, group_size, x.dtype))
    parts = [
        F.linear(x, affine_dequantize(packed[r : r + rows], scales[r : r + rows], biases[r : r + rows], bits,
                                      group_size, x.dtype))
        for r in range(0, out, rows)
    ]
    return torch.cat(parts, dim=-1)


def affine_gather_rows(
    packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, ids: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """Dense rows ids of a packed [V, H] table (the quantised embedding lookup) -> [len(ids), H] in scales' dtype."""
    rows = packed.view(torch.int32)[ids].view(torch.uint32)  # CUDA has no uint32 indexing; same bits
    return affine_dequantize(rows, scales[ids], biases[ids], bits, group_size)
