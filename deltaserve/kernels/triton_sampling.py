"""Greedy and temperature sampling in two launches: the GPU form of kernels/sampling.py's `sample` for rows without
top-k / top-p / min-p, the same bits.

For row b (logits already penalised, fp32):
  greedy (temperature[b] <= 0):  argmax(l)                              first maximum (torch.argmax's tie rule)
  sampled:                       argmax(l / T + G),  G = -log(-log(u))   u = kernels/sampling.uniform_noise

Same bits as the torch sequence: the hash is uint32 arithmetic (the reference's int64 ops keep 32-bit values, so the
products wrap identically); u is exact in fp32; the division is IEEE round-to-nearest (libdevice div_rn, what
torch's CUDA division compiles to) and the logarithms are libdevice's log (CUDA's logf, what torch.log calls).
The reference makes ~20 passes over [B, V] int64 / fp32 tensors; here each logit is read once.

Two launches: `_chunk_best` (grid B x NP, the first maximum of one chunk of a row's keys; launch_table
"sampling.chunks" programs a row, each over whole steps of "sampling.block" logits), then `_row_best` (one
program per row: the first maximum over its chunks in ascending order, which is the row's first maximum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import backend, sampling
from .launch_table import value as launch_value

_MUL1 = tl.constexpr(sampling._MUL1)  # the reference hash's constants (odd, < 2^31: int32 literals)
_MUL2 = tl.constexpr(sampling._MUL2)
_TOKEN_MUL = tl.constexpr(sampling._TOKEN_MUL)


@triton.jit
def _mix(x):
    """sampling.mix32 on uint32 values."""
    x = x ^ (x >> 16)
    x = x * _MUL1
    x = x ^ (x >> 15)
    x = x * _MUL2
    return x ^ (x >> 15)


@triton.jit
def _chunk_best(logit_ptr, key_ptr, temp_ptr, pv_ptr, pi_ptr, V, CH, stride_l, NP: tl.constexpr, BV: tl.constexpr,
                LIBDEVICE: tl.constexpr):
    # grid (B, NP): pv/pi[b, c] = the maximum of row b's keys over columns [c*CH, (c+1)*CH) and its first index
    b = tl.program_id(0)
    c = tl.program_id(1)
    start = c * CH
    stop = tl.minimum(start + CH, V)
    row = logit_ptr + b.to(tl.int64) * stride_l
    temp = tl.load(temp_ptr + b)
    key = tl.load(key_ptr + b).to(tl.uint32)  # sampling.row_keys: a 32-bit value
    best = tl.max(tl.full((BV,), float("-inf"), tl.float32), axis=0)
    where = start
    for k0 in range(start, stop, BV):
        cols = k0 + tl.arange(0, BV)
        x = tl.load(row + cols, mask=cols < stop, other=float("-inf")).to(tl.float32)
        if temp > 0:
            tok = cols.to(tl.uint32) * _TOKEN_MUL
            h = _mix(_mix(key ^ tok))
            u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            if LIBDEVICE:  # the GPU: CUDA's logf and IEEE division, torch's ops
                x = libdevice.div_rn(x, temp) - libdevice.log(-libdevice.log(u))
            else:  # Triton's interpreter has no libdevice: numpy's (the CPU tests compare tokens, not noise bits)
                x = tl.div_rn(x, temp) - tl.log(-tl.log(u))
            x = tl.where(cols < stop, x, float("-inf"))
        m = tl.max(x, axis=0)
        first = tl.min(tl.where(x == m, cols, V), axis=0)
        take = m > best  # strictly greater: an earlier block keeps a tie
        where = tl.where(take, first, where)
        best = tl.maximum(best, m)
    tl.store(pv_ptr + b * NP + c, best)
    tl.store(pi_ptr + b * NP + c, where)


@triton.jit
def _row_best(pv_ptr, pi_ptr, out_ptr, V, NPR, NP: tl.constexpr):
    # grid (B,): the first maximum over the row's NPR chunk results (ascending chunks: the smallest index wins a tie)
    b = tl.program_id(0)
    rc = tl.arange(0, NP)
    v = tl.load(pv_ptr + b * NP + rc, mask=rc < NPR, other=float("-inf"))
    i = tl.load(pi_ptr + b * NP + rc, mask=rc < NPR, other=V)
    m = tl.max(v, axis=0)
    tl.store(out_ptr + b, tl.min(tl.where(v == m, i, V), axis=0).to(out_ptr.dtype.element_ty))


def sample_plain(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Next token per row, [B] int64, of fp32 logits [B, V] (penalties applied, no top-k / top-p / min-p):
    argmax(logits) where temperature <= 0, else argmax(logits / temperature + Gumbel(keys)). temperature [B] fp32,
    keys [B] int64 (sampling.row_keys of each row's seed and position). `out`: a [B] int64 tensor to write."""
    bsz, vocab = logits.shape
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError(f"sample_plain: logits must be fp32 with unit column stride, found {logits.dtype}, "
                         f"strides {tuple(logits.stride())}")
    out = torch.empty(bsz, dtype=torch.int64, device=logits.device) if out is None else out
    if bsz == 0:
        return out
    chunks, block = launch_value("sampling.chunks"), launch_value("sampling.block")
    ch = triton.cdiv(triton.cdiv(vocab, chunks), block) * block
    np_ = triton.cdiv(vocab, ch)
    np_pow = triton.next_power_of_2(np_)
    pv = torch.empty((bsz, np_pow), dtype=torch.float32, device=logits.device)
    pi = torch.empty((bsz, np_pow), dtype=torch.int32, device=logits.device)
    _chunk_best[(bsz, np_)](logits, keys, temperature, pv, pi, vocab, ch, logits.stride(0), NP=np_pow, BV=block,
                            LIBDEVICE=not backend.interpreting())
    _row_best[(bsz,)](pv, pi, out, vocab, np_, NP=np_pow)
    return out

