"""Warm the L2 with weights a later kernel will read (sm_90 bulk prefetch), so that a decode GEMV reads them from
the L2 instead of the HBM.

Why: at batch 1 every decode kernel is bound by the latency of its loads (bench/NOTES.md: the GEMVs and the MoE
kernels stall on the L1TEX / long scoreboard and reach 25-45% of the HBM bandwidth), while the kernels between them
(norms, the DeltaNet step, the top-k) leave the HBM idle. A prefetch issued on a side stream while those run moves
the next weights into the 50 MB L2 ahead of use; the GEMV then waits on L2 latency (~0.3 us) instead of HBM latency.

`cp.async.bulk.prefetch.L2.global [addr], size` is a hint carried out by the SM's copy engine: no registers, no
completion to wait for, no effect on any value. A prefetch plan is a fixed list of (address, bytes) chunks made once
per set of weights (the weights never move while the model is loaded); one launch issues the whole list.

Exactness: nothing is written; the kernels that later read the weights read the same bytes.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CHUNK_BYTES = 16 << 10  # one bulk prefetch instruction's range; spread over many programs' copy engines
ENTRIES_PER_PROGRAM = 16  # chunks one program issues: 256 KB a program, ~60 programs for a 14 MB weight
ALIGN = 16  # the instruction's address and size granularity


@triton.jit
def _bulk_prefetch(addr, nbytes):
    """One `cp.async.bulk.prefetch.L2.global` per element where nbytes > 0; returns a dummy 0."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(addr_ptr, size_ptr, n, BLOCK: tl.constexpr):
    """addr_ptr int64 [n] (16-byte aligned), size_ptr int32 [n] (multiples of 16): program p issues entries
    p*BLOCK .. p*BLOCK+BLOCK-1."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    addr = tl.load(addr_ptr + offs, mask=mask, other=0)
    size = tl.load(size_ptr + offs, mask=mask, other=0)
    _bulk_prefetch(addr, size)


@triton.jit
def _l2_prefetch_slices_kernel(ids_ptr, base_ptr, slice_ptr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr):
    """Program (i, j): the slice ids[i] of stacked tensor j, i.e. bytes [base_j + id * slice_j, + slice_j), in
    CHUNKS pieces of at most CHUNK bytes (base_ptr int64 [J], slice_ptr int64 [J], ids_ptr [n] integer)."""
    e = tl.load(ids_ptr + tl.program_id(0)).to(tl.int64)
    base = tl.load(base_ptr + tl.program_id(1))
    span = tl.load(slice_ptr + tl.program_id(1))
    offs = tl.arange(0, CHUNKS).to(tl.int64) * CHUNK
    size = tl.minimum(span - offs, CHUNK)
    _bulk_prefetch(base + e * span + offs, tl.maximum(size, 0).to(tl.int32))


def chunk_ranges(ranges: list[tuple[int, int]], chunk: int = CHUNK_BYTES) -> tuple[list[int], list[int]]:
    """(addresses, sizes) of the chunks covering every (address, bytes) range: each range widened to ALIGN at
    both ends (inside the allocation: the caching allocator rounds blocks to 512 bytes) and cut into pieces of at
    most `chunk` bytes; overlapping or touching ranges are merged first so no byte is prefetched twice."""
    spans = sorted((a - a % ALIGN, -(-(a + n) // ALIGN) * ALIGN) for a, n in ranges if n > 0)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    addrs, sizes = [], []
    for lo, hi in merged:
        for a in range(lo, hi, chunk):
            addrs.append(a)
            sizes.append(min(chunk, hi - a))
    return addrs, sizes


def tensor_ranges(tensors) -> list[tuple[int, int]]:
    """(address, bytes) of each tensor's elements; a tensor must be contiguous (a strided view's span would also
    cover bytes it does not hold)."""
    out = []
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"l2_prefetch: tensor of shape {tuple(t.shape)} is not contiguous")
        out.append((t.data_ptr(), t.numel() * t.element_size()))
    return out


class PrefetchPlan:
    """The chunks of a fixed set of device tensors; launch() issues them all (on the current stream)."""

    def __init__(self, tensors, chunk: int = CHUNK_BYTES):
        tensors = list(tensors)
        if not tensors:
            raise ValueError("l2_prefetch: a plan needs at least one tensor")
        device = tensors[0].device
        if device.type != "cuda":
            raise ValueError(f"l2_prefetch: tensors must be on a CUDA device, found {device}")
        addrs, sizes = chunk_ranges(tensor_ranges(tensors), chunk)
        self.bytes = sum(sizes)
        self.n = len(addrs)
        self.addrs = torch.tensor(addrs, dtype=torch.int64, device=device)
        self.sizes = torch.tensor(sizes, dtype=torch.int32, device=device)

    def launch(self) -> None:
        grid = (triton.cdiv(self.n, ENTRIES_PER_PROGRAM),)
        _l2_prefetch_kernel[grid](self.addrs, self.sizes, self.n, BLOCK=ENTRIES_PER_PROGRAM, num_warps=1)


class SlicePlan:
    """Per-launch slices of stacked tensors [E, ...]: launch(ids) prefetches slice ids[i] of every tensor (the
    picked experts' weights once the top-k is known). Each tensor's slice must be a multiple of 16 bytes."""

    def __init__(self, stacked, chunk: int = CHUNK_BYTES):
        stacked = list(stacked)
        if not stacked:
            raise ValueError("l2_prefetch: a slice plan needs at least one stacked tensor")
        bases, spans = [], []
        for t in stacked:
            if not t.is_contiguous() or t.dim() < 2:
                raise ValueError(f"l2_prefetch: stacked tensor must be contiguous [E, ...], found shape "
                                 f"{tuple(t.shape)} strides {t.stride()}")
            span = t.stride(0) * t.element_size()
            if span % ALIGN or t.data_ptr() % ALIGN:
                raise ValueError(f"l2_prefetch: a slice of {tuple(t.shape)} {t.dtype} is {span} bytes at address "
                                 f"{t.data_ptr():#x}; both must be multiples of {ALIGN}")
            bases.append(t.data_ptr())
            spans.append(span)
        device = stacked[0].device
        self.chunk = chunk
        self.chunks = triton.next_power_of_2(-(-max(spans) // chunk))
        self.bases = torch.tensor(bases, dtype=torch.int64, device=device)
        self.spans = torch.tensor(spans, dtype=torch.int64, device=device)

    def launch(self, ids: torch.Tensor) -> None:
        ids = ids.reshape(-1)  # any integer dtype; contiguous
        _l2_prefetch_slices_kernel[(ids.numel(), self.bases.numel())](
            ids, self.bases, self.spans, CHUNK=self.chunk, CHUNKS=self.chunks, num_warps=1)


# ---------------------------------------------------------------- issuing on a side stream (decode graphs capture it)

_SIDE: dict[int, torch.cuda.Stream] = {}
_PENDING: set[int] = set()


def supported(t: torch.Tensor) -> bool:
    """A CUDA tensor on sm_90 or newer (the bulk prefetch instruction), outside Triton's interpreter."""
    if not t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return torch.cuda.get_device_capability(t.device)[0] >= 9


def issue(t: torch.Tensor, launch) -> None:
    """Run launch() on t's device's side stream after everything issued so far on the current stream, so it
    overlaps the kernels that follow; join() makes the current stream wait for it again (a CUDA graph capture
    must join every side stream it forked before it ends)."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    side = _SIDE.get(index)
    if side is None:
        side = _SIDE[index] = torch.cuda.Stream(device=t.device)
    side.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(side):
        launch()
    _PENDING.add(index)


def join(t: torch.Tensor) -> None:
    """The current stream waits for the prefetches issued on t's device (no-op when none are pending)."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index in _PENDING:
        torch.cuda.current_stream(t.device).wait_stream(_SIDE[index])
        _PENDING.discard(index)
