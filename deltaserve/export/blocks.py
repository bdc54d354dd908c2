"""ggml block encodings written by the GGUF exporter: F32, F16, Q8_0, Q4_K, Q6_K (numpy only).

Every quantised type packs each row (ggml's ne0, the last torch dim) into fixed-size blocks; a tensor's bytes are
its rows one after another. Byte layouts (ggml-common.h; decoded by gguf.quants.dequantize in the tests):

  Q8_0  34 B / 32 values:  d (fp16) | qs[32] (int8)                 w = d * q
  Q4_K 144 B / 256 values: d (fp16) | dmin (fp16) | scales[12] | qs[128]
        8 sub-blocks of 32, each with a 6-bit scale sc_j and 6-bit min m_j packed into scales[12];
        w = d * sc_j * q - dmin * m_j, q in 0..15; sub-blocks 2k and 2k+1 share qs[32k:32k+32] (low, high nibble).
  Q6_K 210 B / 256 values: ql[128] | qh[64] | scales[16] (int8) | d (fp16)
        16 sub-blocks of 16 (sub-block = value index // 16), w = d * sc_j * (q - 32), q in 0..63 split into a low
        nibble (ql) and 2 high bits (qh); see `_pack_q6_k` for the interleave.

The encoders here are plain min/max quantisers (no error search like llama-quantize's): good enough to check the
export against llama.cpp, not a replacement for llama-quantize when quality matters. `random_blocks` writes
random codes with patched, finite fp16 scales, for full-size benchmark files without real weights.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

QK_K = 256
# values per block and bytes per block
BLOCK = {T.F32: (1, 4), T.F16: (1, 2), T.Q8_0: (32, 34), T.Q4_K: (QK_K, 144), T.Q6_K: (QK_K, 210)}


def nbytes(qtype: T, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of torch-order `shape` (rows along the last dim) stored as qtype."""
    values, size = BLOCK[qtype]
    row = shape[-1]
    if row % values:
        raise ValueError(f"{qtype.name} needs rows that are a multiple of {values}, found rows of {row}")
    return int(np.prod(shape[:-1], dtype=np.int64)) * (row // values) * size


def encode(x: np.ndarray, qtype: T) -> np.ndarray:
    """x float32 [..., row] -> the tensor's bytes (uint8, flat) or an f32/f16 array, in qtype."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("cannot encode a tensor with non-finite values")
    if qtype == T.F32:
        return x
    if qtype == T.F16:
        return x.astype(np.float16)
    nbytes(qtype, x.shape)  # checks the row length
    if qtype == T.Q8_0:
        return gguf_quants.quantize(x, T.Q8_0).reshape(-1)
    if qtype == T.Q4_K:
        return encode_q4_k(x.reshape(-1, 8, 32))
    if qtype == T.Q6_K:
        return encode_q6_k(x.reshape(-1, 16, 16))
    raise ValueError(f"unsupported GGUF type {qtype.name}")


def _fp16(values: np.ndarray, what: str) -> np.ndarray:
    with np.errstate(over="ignore"):  # reported below, by name
        out = values.astype(np.float16)
    if not np.isfinite(out).all():
        raise ValueError(f"{what} overflows fp16 (weights too large for this block type)")
    return out


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape), np.float32), where=den > 0)


def encode_q4_k(xb: np.ndarray) -> np.ndarray:
    """xb [nb, 8, 32] float32 -> nb Q4_K blocks (bytes, flat)."""
    nb = xb.shape[0]
    lo = np.minimum(xb.min(-1), 0.0)  # [nb, 8]; mins kept <= 0 so the stored min m_j is non-negative
    scale = (xb.max(-1) - lo) / 15.0
    d = _fp16(scale.max(-1) / 63.0, "Q4_K scale")  # [nb]
    dmin = _fp16(-lo.min(-1) / 63.0, "Q4_K min")
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(-lo, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc  # effective scale and min of each sub-block, as decoded
    offset = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint(_safe_div(xb + offset[..., None], step[..., None])), 0, 15).astype(np.uint8)
    out = np.empty((nb, 144), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(nb, 2)
    out[:, 4:16] = _pack_q4_k_scales(sc, m)
    out[:, 16:] = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(nb, 128)
    return out.reshape(-1)


def _pack_q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins [nb, 8] -> scales[12]: bytes 0-3 hold sc[0:4] (+ the top 2 bits of sc[4:8]),
    bytes 4-7 hold m[0:4] (+ the top 2 bits of m[4:8]), bytes 8-11 the low nibbles of sc[4:8] and m[4:8]."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def encode_q6_k(xb: np.ndarray) -> np.ndarray:
    """xb [nb, 16, 16] float32 -> nb Q6_K blocks (bytes, flat)."""
    nb = xb.shape[0]
    scale = np.abs(xb).max(-1) / 31.0  # [nb, 16]
    d = _fp16(scale.max(-1) / 127.0, "Q6_K scale")
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[:, None])), -128, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc
    q = (np.clip(np.rint(_safe_div(xb, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(nb, QK_K)
    out = np.empty((nb, 210), np.uint8)
    out[:, 0:128], out[:, 128:192] = _pack_q6_k(q)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.view(np.uint8).reshape(nb, 2)
    return out.reshape(-1)


def _pack_q6_k(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q [nb, 256] codes 0..63 -> (ql [nb, 128], qh [nb, 64]). Per half h of 128 values, viewed as 4 quarters
    k of 32 (value 128h + 32k + l): ql[64h + l] = q_k0 | q_k2 << 4 (low nibbles), ql[64h + 32 + l] = q_k1 | q_k3 << 4,
    qh[32h + l] = sum_k (q_k >> 4) << 2k."""
    nb = q.shape[0]
    quarters = q.reshape(nb, 2, 4, 32)  # [nb, half, k, l]
    low, high = quarters & 0xF, quarters >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return ql.reshape(nb, 128), qh.reshape(nb, 64)


# ---- random blocks -----------------------------------------------------------------------------------------------
# Codes are uniform random bytes; the fp16 scale fields are overwritten with one finite value per tensor, chosen so
# the decoded weights have a standard deviation of about `std` (the constants are the std of the code part:
# Q4_K sc*q - 7.5*m with sc, m uniform 0..63 and q uniform 0..15; Q6_K sc*(q-32) with sc uniform int8; Q8_0 q).
_CODE_STD = {T.Q4_K: 244.0, T.Q6_K: 1366.0, T.Q8_0: 73.9}


def random_blocks(qtype: T, shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
    """Random but valid bytes of a qtype tensor of torch-order `shape` (weights of about `std`)."""
    n = nbytes(qtype, shape)
    if qtype in (T.F32, T.F16):
        dtype = np.float32 if qtype == T.F32 else np.float16
        return (rng.standard_normal(n // np.dtype(dtype).itemsize, dtype=np.float32) * std).astype(dtype)
    size = BLOCK[qtype][1]
    data = rng.integers(0, 256, size=n, dtype=np.uint8).reshape(-1, size)
    d = np.float16(std / _CODE_STD[qtype]).reshape(1).view(np.uint8)
    if qtype == T.Q4_K:
        data[:, 0:2] = d
        data[:, 2:4] = np.float16(7.5 * float(np.float16(std / _CODE_STD[qtype]))).reshape(1).view(np.uint8)
    elif qtype == T.Q6_K:
        data[:, 208:210] = d
    else:
        data[:, 0:2] = d
    return data.reshape(-1)
