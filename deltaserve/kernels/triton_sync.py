"""Last arrival: of a group of programs in one launch, the one that finishes last does the group's second phase
(a top-k over every program's logits, a norm over every program's slice), so a two-phase step needs one launch
instead of two.

    ... store this program's part ...
    if last_arrival(counters + group, programs_in_group):
        ... read every part back (fresh_load: from L2, never a stale line of this SM's L1), in a fixed order ...

Exactness: which program arrives last changes from run to run, but it reads the same values and reduces them in the
same order, so the result never does. The counters are int32, zero outside a launch (the last program of a group
resets its counter), kept per device (`arrival_counters`) and shared by every kernel that uses the pattern: launches
on one stream run one after another, each leaving every counter at zero. Launches that may run at the same time on
different streams (a decode batch's two halves, model/fast.mixer_halves) take counters of different lanes
(`counter_lane`): one row of the device's buffer each.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

_COUNTERS: dict[tuple[str, int | None], torch.Tensor] = {}  # [COUNTER_LANES, size] a device
_RETIRED: list[torch.Tensor] = []  # outgrown buffers stay allocated: a captured CUDA graph may still point at one
MIN_COUNTERS = 4096  # decode needs at most 64 tokens x 64 heads: allocated once, before any graph capture; users
# that could need more at decode (the tensor-core MoE's combine) fall back to a launch of their own instead
COUNTER_LANES = 3  # lane 0: the stream a forward runs on; 1 and 2: its two halves' streams (fast.mixer_halves)
_lane = 0  # the lane arrival_counters hands out now (counter_lane)


@contextlib.contextmanager
def counter_lane(lane: int):
    """Within the block, arrival_counters hands out lane `lane`'s counters (0 <= lane < COUNTER_LANES): the launches
    a caller makes there may run beside launches made under another lane. Host-side only: a launch keeps the
    pointer it was given (so a captured graph keeps its lane)."""
    global _lane
    if not 0 <= lane < COUNTER_LANES:
        raise ValueError(f"counter_lane: lanes 0 .. {COUNTER_LANES - 1}, found {lane}")
    prev, _lane = _lane, lane
    try:
        yield
    finally:
        _lane = prev


def arrival_counters(device: torch.device | str, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters on `device` in the current lane (counter_lane; 0 by default), the same
    buffer from call to call (grown, never shrunk; every lane is allocated with the first, so a lane first asked
    for inside a graph capture is not allocated there)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.shape[1] < n:
        if buf is not None:
            _RETIRED.append(buf)
        size = max(n, MIN_COUNTERS, 0 if buf is None else 2 * buf.shape[1])
        buf = _COUNTERS[key] = torch.zeros(COUNTER_LANES, size, dtype=torch.int32, device=device)
    return buf[_lane]


@triton.jit
def last_arrival(counter_ptr, n):
    """True in the program that arrives n-th (last) at its group's counter, which it resets to 0. The barrier
    orders every thread's stores of this program before the release of the atomic (acq_rel, GPU scope), whose
    acquire half makes the other programs' released stores visible to the last one."""
    tl.debug_barrier()
    prev = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = prev == n - 1
    tl.store(counter_ptr, 0, mask=last)
    return last
