"""fp8 (e4m3) K/V cache: one scale per cached (token, KV head) row.

Why: decode attention reads the whole K/V of a sequence every step. On the 35B-A3B at 32K tokens that is 671 MB of
bf16 per step (0.156 ms at the H200's copy bandwidth, lab/NOTES.md), which keeps batch-1 decode at 32K well below
its speed at 512 tokens. fp8 halves those bytes (and doubles the tokens a cache budget holds), at the cost of 3
mantissa bits per cached element: an opt-in mode, like vLLM's `--kv-cache-dtype fp8` or llama.cpp's `-ctk q8_0`.

Format (the meaning every path shares, `quantize_rows` below is its definition):
  k8 [num_blocks, block_size, Hkv, D] float8_e4m3fn,  k_scale [num_blocks, block_size, Hkv] float32 (same for V)
  scale = amax(|x|) / 448 over the row's D values (1 for an all-zero row), x8 = e4m3(x / scale) rounded to nearest
  even, clamped to +-448; the row means x8 * scale.
Per-row scales need no calibration and keep every row's own range, the way llama.cpp's q8_0 blocks do; a row of D
values shares one fp32 (D = 256: 1.6% over the fp8 bytes).

Exactness: a row is quantised from its own values only (its token, its head), so batch, chunking and the prefix
cache never change the cached bits, and the attention kernels read every key, old or new, from the cache. The Triton
writers round with `round_e4m3` (fp32 arithmetic, then an exact conversion) because Triton's interpreter converts
fp32 -> fp8 wrongly at binade edges (e.g. 124.3 -> 64); on the GPU both roundings agree, and the CPU tests compare
the written bytes with `quantize_rows` bit for bit. This module is torch only (the reference path runs without
Triton); the kernels' helpers are in triton_kv_fp8.py.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (any float dtype) -> (x8 [..., D] float8_e4m3fn, scale [...] fp32): the format's definition."""
    xf = x.float()
    amax = xf.abs().amax(-1)
    # a tensor divisor: CUDA torch multiplies by the reciprocal of a Python-number divisor (1/448 is inexact), which
    # would make the format's scales depend on the device; the Triton writers divide with IEEE rounding too
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    return (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize_rows(x8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 x8 * scale (the rows' meaning)."""
    return x8.float() * scale[..., None]


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None,
                v_scale: torch.Tensor | None, who: str) -> bool:
    """Is this an fp8 cache pair (then with [num_blocks, block_size, Hkv] fp32 contiguous scales)? Both caches
    of one kind; scales only with fp8."""
    fp8 = k_cache.dtype == FP8
    if (v_cache.dtype == FP8) != fp8:
        raise ValueError(f"{who}: k cache {k_cache.dtype} and v cache {v_cache.dtype} must both be fp8 or neither")
    want = tuple(k_cache.shape[:3])
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not fp8:
            if sc is not None:
                raise ValueError(f"{who}: {name} given for a {k_cache.dtype} cache (scales are for fp8 caches only)")
            continue
        if sc is None or tuple(sc.shape) != want or sc.dtype != torch.float32 or not sc.is_contiguous():
            raise ValueError(f"{who}: an fp8 cache needs {name} fp32 {list(want)} contiguous, found "
                             f"{None if sc is None else (sc.dtype, tuple(sc.shape))}")
    return fp8
