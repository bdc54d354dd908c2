"""Warming the L2 with a later kernel's weights from inside an earlier kernel: the touch plan.

Why: at batch 1 a decode step is a chain of latency-bound kernels that read DRAM at a fraction of its bandwidth,
and many of their programs sit resident waiting for their predecessor (PDL) for microseconds. The weights of the
dense decode GEMVs do not depend on the step's values, so the waiting programs of one kernel can request the
weights of a GEMV one or two launches later into the L2. Measured (scripts/probe_l2_inkernel.py, H200, bench/NOTES.md
wave 42): the one-row in_proj GEMV (14.2 MB) 7.78 us from DRAM, 6.21 from a hot L2, and 6.24 after a spinning kernel
touched every 128-byte line with `ld.global.cg.L2::128B` (the L2's prefetch-size hint: a plain 4-byte load fills
one 32-byte sector of its line, and left the GEMV at 7.0 us; `prefetch.global.L2` did no better; the bulk prefetch
of wave 29 not at all), for +0.3 us of the touching kernel's time.

A touch is a 4-byte load of one line per thread per region step; its value is used once, at the program's end, in
a store that happens only if the loaded words sum to one magic value (into a scratch `sink`, never read), so the
compiler keeps the loads and the program does not wait for them before its end. Touches read constant data only
(weights), so a kernel may issue them before its PDL wait (kernels/triton_pdl.py's protocol). They change no value
anywhere: a GEMV reads the same bytes whether they come from the L2 or DRAM.

The plan here is the host side: up to MAX_REGIONS contiguous tensors as flat byte views, and per launch the number
of touch steps each region needs so that the launch's programs x threads cover it once (warm_kwargs). A plan may
also carry one sequence's K/V pages of an attention layer (KvPages: its first blocks through its block table), so
that a long context's decode attention finds part of its K/V stream in the L2. The device
side: `touches` / `sink` below for Triton kernels (the DeltaNet decode step), their Gluon twins in quant/mma_gemv.py
(the MoE gate/up launch).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

LINE = 128  # bytes one touch brings into the L2 (the ::128B prefetch-size hint)
MAX_REGIONS = 3  # a packed weight's words, scales and biases
SINK_WORDS = 1024  # int32 words of the scratch the touches' values may be stored to (the carrier's threads)
TOUCH_ASM = "{ .reg .pred p; setp.ne.u32 p, $2, 0; mov.u32 $0, 0; @p ld.global.cg.L2::128B.u32 $0, [$1]; }"
SINK_MAGIC = 0x5EED5EED  # the touches' sum a thread stores to the sink (any value would do: rarely met)

_SINKS: dict = {}


class KvPages(NamedTuple):
    """One sequence's cached K/V of an attention layer, for a carrier to touch: the caches as flat uint8 views (k, v:
    [num_blocks, block_size, Hkv, D] each, block_bytes a block), the row's block table (int32 [max_blocks]) and
    its context length (int32 or int64 [1]: the tokens cached before this step), at most max_blocks blocks from the row's
    first. The lengths and the table are settled (written before the forward's first launch), so a carrier reads
    them before its PDL wait; a touched line that this step then writes (the new token's) is written in the L2."""

    k: torch.Tensor
    v: torch.Tensor
    table: torch.Tensor
    lens: torch.Tensor
    block_tokens: int
    block_bytes: int
    max_blocks: int

    @property
    def nbytes(self) -> int:
        """The most bytes the touches cover (K and V)."""
        return 2 * self.max_blocks * self.block_bytes


class WarmPlan(NamedTuple):
    """The bytes a carrier kernel touches: regions, flat uint8 views of 0 .. MAX_REGIONS contiguous tensors on one
    CUDA device, optionally an attention layer's pages (KvPages), and that device's sink (int32 [SINK_WORDS])."""

    regions: tuple[torch.Tensor, ...]
    sink: torch.Tensor
    pages: KvPages | None = None

    @property
    def nbytes(self) -> int:
        return sum(r.numel() for r in self.regions) + (self.pages.nbytes if self.pages is not None else 0)


def warm_plan(tensors) -> WarmPlan:
    """A WarmPlan over `tensors` (1 .. MAX_REGIONS contiguous tensors on one device, each of at least 4 bytes)."""
    tensors = tuple(tensors)
    if not 1 <= len(tensors) <= MAX_REGIONS:
        raise ValueError(f"l2 warm: 1 to {MAX_REGIONS} regions, found {len(tensors)}")
    device = tensors[0].device
    regions = []
    for t in tensors:
        if t.device != device:
            raise ValueError(f"l2 warm: every region on one device, found {t.device} beside {device}")
        if not t.is_contiguous():
            raise ValueError(f"l2 warm: a region must be contiguous, found shape {tuple(t.shape)} strides {t.stride()}")
        if t.numel() * t.element_size() < 4:
            raise ValueError(f"l2 warm: a region of {t.numel() * t.element_size()} bytes (at least 4)")
        regions.append(t.reshape(-1).view(torch.uint8))
    return WarmPlan(tuple(regions), _sink(device))


def _sink(device: torch.device) -> torch.Tensor:
    sink = _SINKS.get(device)
    if sink is None:
        sink = _SINKS[device] = torch.zeros(SINK_WORDS, dtype=torch.int32, device=device)
    return sink


def with_pages(plan: WarmPlan | None, pages: KvPages) -> WarmPlan:
    """`plan` (its regions; None: none) with an attention layer's pages to touch too."""
    if plan is not None and plan.regions and plan.regions[0].device != pages.k.device:
        raise ValueError(f"l2 warm: pages on {pages.k.device} beside regions on {plan.regions[0].device}")
    return WarmPlan(plan.regions if plan is not None else (), _sink(pages.k.device), pages)


def kv_pages(k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
             max_bytes: int) -> KvPages:
    """KvPages over a row's first blocks of two caches [num_blocks, block_size, Hkv, D] (contiguous, one device),
    at most max_bytes of K and V together (>= one block of each). table: the row's block table, int32 [max_blocks]
    contiguous; lens: its context length, int32 or int64 [1]."""
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype or k_cache.dim() != 4:
        raise ValueError(f"l2 warm: K and V caches must match as [blocks, block_size, Hkv, D], found "
                         f"{tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("l2 warm: the K/V caches must be contiguous")
    if table.dtype != torch.int32 or table.dim() != 1 or not table.is_contiguous() or \
            lens.dtype not in (torch.int32, torch.int64) or lens.numel() < 1:
        raise ValueError(f"l2 warm: a row's block table (int32 [blocks], contiguous) and length (int32 or int64), found "
                         f"{table.dtype} {tuple(table.shape)} and {lens.dtype} {tuple(lens.shape)}")
    if len({t.device for t in (k_cache, v_cache, table, lens)}) != 1:
        raise ValueError("l2 warm: the caches, table and length on one device")
    block_bytes = k_cache[0].numel() * k_cache.element_size()
    if block_bytes % LINE:
        raise ValueError(f"l2 warm: a cache block of {block_bytes} bytes is not whole {LINE}-byte lines")
    blocks = min(table.numel(), max_bytes // (2 * block_bytes))
    if blocks < 1:
        raise ValueError(f"l2 warm: {max_bytes} bytes hold no block of K and V ({block_bytes} bytes each)")
    return KvPages(k_cache.reshape(-1).view(torch.uint8), v_cache.reshape(-1).view(torch.uint8), table, lens,
                   k_cache.shape[1], block_bytes, blocks)


def touch_steps(nbytes: int, programs: int, threads: int) -> int:
    """Touch steps (lines a thread) so that `programs` x `threads` threads cover nbytes once, one line each a step."""
    if programs < 1 or threads < 1:
        raise ValueError(f"l2 warm: {programs} programs of {threads} threads")
    return -(-nbytes // (LINE * programs * threads))


def warm_kwargs(plan: WarmPlan | None, programs: int, threads: int) -> dict:
    """The keyword arguments of a carrier launch of `programs` x `threads`: none without a plan (the kernel's
    defaults: no touch code), else the sink wsink and for each region i its uint8 view wr<i>, its bytes wn<i> and its
    touch steps WARM<i> (absent regions keep the defaults: no pointer, 0 steps); with pages, the caches wkk / wkv,
    the row's table wkt and length wkl, the block cap wkmax, KV_TOKENS and KV_BLOCK (a block's tokens and bytes)
    and KV_STEPS (touch steps covering wkmax blocks of one cache; the Gluon carriers only)."""
    if threads > SINK_WORDS:
        raise ValueError(f"l2 warm: {threads} threads a program, the sink holds {SINK_WORDS}")
    if plan is None:
        return {}
    kw = {"wsink": plan.sink}
    for i, r in enumerate(plan.regions):
        kw.update({f"wr{i}": r, f"wn{i}": r.numel(), f"WARM{i}": touch_steps(r.numel(), programs, threads)})
    p = plan.pages
    if p is not None:
        kw.update(wkk=p.k, wkv=p.v, wkt=p.table, wkl=p.lens, wkmax=p.max_blocks, KV_TOKENS=p.block_tokens,
                  KV_BLOCK=p.block_bytes, KV_STEPS=touch_steps(p.max_blocks * p.block_bytes, programs, threads))
    return kw


_TOUCH = tl.constexpr(TOUCH_ASM)
_MAGIC = tl.constexpr(SINK_MAGIC)
_LINE = tl.constexpr(LINE)


@triton.jit
def _touch(acc, base, nbytes, pid, programs, STEPS: tl.constexpr, THREADS: tl.constexpr):
    lane = tl.arange(0, THREADS).to(tl.int64)
    for it in tl.static_range(STEPS):
        off = ((it * programs + pid) * THREADS + lane) * _LINE
        acc += tl.inline_asm_elementwise(_TOUCH, "=r,l,r", [base + tl.minimum(off, nbytes - 4),
                                                           (off < nbytes).to(tl.int32)],
                                         dtype=tl.int32, is_pure=False, pack=1)
    return acc


@triton.jit
def touches(r0, n0, r1, n1, r2, n2, WARM0: tl.constexpr, WARM1: tl.constexpr, WARM2: tl.constexpr,
            THREADS: tl.constexpr):
    """A Triton carrier program's touches of its share of warm_kwargs' regions (uint8 pointers), one 128-byte line a
    thread a step over the launch's programs (a 3-D grid flattened): the words, to be passed to `sink` at the
    program's end. Constant data only: a kernel may call this before its PDL wait."""
    pid = ((tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2)
           + tl.program_id(2)).to(tl.int64)
    programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    acc = tl.zeros((THREADS,), dtype=tl.int32)
    if WARM0 > 0:
        acc = _touch(acc, r0, n0, pid, programs, WARM0, THREADS)
    if WARM1 > 0:
        acc = _touch(acc, r1, n1, pid, programs, WARM1, THREADS)
    if WARM2 > 0:
        acc = _touch(acc, r2, n2, pid, programs, WARM2, THREADS)
    return acc


@triton.jit
def sink(acc, sink_ptr, THREADS: tl.constexpr):
    """The touches' one use: stored to the scratch sink only where a thread's words sum to SINK_MAGIC."""
    lane = tl.arange(0, THREADS)
    tl.store(sink_ptr + lane, acc, mask=acc == _MAGIC)
