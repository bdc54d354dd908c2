"""Programmatic dependent launch (PDL, sm_90+) for the decode kernels: a kernel may start while the one before it
in the stream is finishing, run its prologue (index math, the first chunk of its constant weights) and then wait
for its predecessor's results. In a CUDA graph of ~400 small kernels per decode step this hides each launch's
ramp and the previous kernel's tail.

The protocol every kernel launched with PDL follows (a kernel that breaks it races):
    pdl_open(PDL)        first thing: lets the NEXT kernel in the stream launch once all of this one's programs
                         have started (they then wait for us in their own pdl_wait)
    ... reads of constant data only (weights, scales), or of state the kernel alone writes (the DeltaNet step's
        recurrent state, written by that layer's step in earlier forwards only; the decode conv's window, written
        by that layer's projection epilogue in earlier forwards only), or of what earlier forwards wrote
        and this one does not (a decode row's cached K/V below its newest position, paged_decode_attention's
        settled form), addressed by the step's metadata (slots, context lengths, block tables: set before the
        forward's first kernel); no stores, no atomics ...
    pdl_wait(PDL)        blocks until the previous kernel has completed and its writes are visible
    ... everything else ...
Chains stay safe: a kernel's pdl_wait returns only after its predecessor completed, and that predecessor passed its
own pdl_wait only after ITS predecessor completed, so every earlier write is visible after the wait. Writes come
after the wait, so no kernel overwrites memory an unfinished predecessor still reads. Kernels launched without PDL
(torch's, or ours with PDL off) are serialised as usual, and pdl_wait in a kernel launched without the attribute
returns at once. Owned state read early stays safe for the same reason: every forward starts with a kernel launched
without PDL (the embedding lookup), which starts only after everything before it completed, so no prologue of a
forward can run before the previous forward's write of that state; within a forward nothing else writes it.
Late opening: a kernel may call pdl_open only after its wait (`if not OPEN_LATE: pdl_open(PDL)` first, the open
again after the wait under OPEN_LATE). The next kernel then starts only once every program of this one has
passed its wait, i.e. once this one's predecessor has completed, so that next kernel may read the predecessor's
output before its own wait (from L2, ".cg": a line of an earlier kernel may sit in its SM's L1). The MoE decode's
down launch reads the routing that way (moe/triton_moe_gemv.down_early).

Exactness: PDL moves when a program starts, never what it computes: the same instructions on the same values.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..utils import tuning


@triton.jit
def pdl_open(PDL: tl.constexpr):
    """Allow the next kernel in the stream to launch (griddepcontrol.launch_dependents). No-op unless PDL."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel in the stream to complete (griddepcontrol.wait). No-op unless PDL."""
    if PDL:
        gdc_wait()


@functools.lru_cache(maxsize=None)
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_enabled(t: torch.Tensor) -> bool:
    """PDL for kernels whose operands live with t: CUDA, sm_90 or newer, not switched off by DELTASERVE_PDL=0,
    never in the Triton interpreter (it cannot run the griddepcontrol instructions)."""
    if not t.is_cuda or not tuning.get("DELTASERVE_PDL") or tuning.interpreting():
        return False
    return _device_supports(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_args(t: torch.Tensor) -> dict:
    """Launch kwargs of a PDL-aware kernel for operands on t's device: the kernel's PDL constexpr and Triton's
    launch_pdl option together (one without the other is either useless or a race)."""
    return {"PDL": True, "launch_pdl": True} if pdl_enabled(t) else {}
