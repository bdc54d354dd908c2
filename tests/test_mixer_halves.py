"""A decode batch's DeltaNet mixer as two halves (model/fast.mixer_halves, run_halves, prep_rows) and the arrival
counters' lanes the halves' launches take (kernels/triton_sync.counter_lane). The halves' bits against one launch
are checked end to end under the interpreter (test_fast_path_interpret.py) and on the GPU
(tests/gpu/test_model_mma_path.py)."""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels import triton_sync
from deltaserve.model import fast


def test_counter_lanes_are_disjoint_rows_of_one_buffer():
    main = triton_sync.arrival_counters("cpu", 8)
    lanes = [main]
    for lane in (1, 2):
        with triton_sync.counter_lane(lane):
            lanes.append(triton_sync.arrival_counters("cpu", 8))
    assert triton_sync.arrival_counters("cpu", 8).data_ptr() == main.data_ptr()  # back on lane 0 after the blocks
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in lanes)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two lanes share counters"
    assert all(t.numel() >= triton_sync.MIN_COUNTERS and not t.any() for t in lanes)
    with pytest.raises(ValueError, match="lanes 0 .. 2, found 3"):
        with triton_sync.counter_lane(3):
            pass


def test_counter_lanes_grow_together():
    with triton_sync.counter_lane(2):
        big = triton_sync.arrival_counters("cpu", 3 * triton_sync.MIN_COUNTERS)
    assert big.numel() >= 3 * triton_sync.MIN_COUNTERS
    assert triton_sync.arrival_counters("cpu", 1).numel() == big.numel()  # lane 0 grew with it


def test_run_halves_off_cuda_runs_both_halves_in_order_under_their_lanes():
    seen = []

    def half(lo, hi):
        seen.append((lo, hi, triton_sync.arrival_counters("cpu", 1).data_ptr()))

    fast.run_halves(7, half, torch.device("cpu"))
    assert [(lo, hi) for lo, hi, _ in seen] == [(0, 3), (3, 7)]
    ptrs = {p for *_, p in seen} | {triton_sync.arrival_counters("cpu", 1).data_ptr()}
    assert len(ptrs) == 3, "the halves did not take lanes of their own"


def test_prep_rows_slice_the_given_prep():
    xp, xs = torch.arange(24.0).view(6, 4) + 100, torch.arange(6.0).view(6, 1)
    prep = fast.GemvPrep((4, 64), (xp, xs))
    part = fast.prep_rows(prep, 2, 5)
    assert part.fmt == (4, 64) and torch.equal(part.parts[0], xp[2:5]) and torch.equal(part.parts[1], xs[2:5])
    assert part.for_format((4, 64))[1].data_ptr() == xs[2:5].data_ptr()  # views, no copy
    assert part.for_format((8, 64)) is None  # made for another weight format: the GEMV makes its own
    assert fast.prep_rows(None, 1, 3) is None


def test_mixer_halves_threshold(monkeypatch):
    x = torch.zeros(2, 4, dtype=torch.bfloat16)  # a CPU tensor: the fast path is off (no interpreter here)
    assert not fast.mixer_halves(64, x)
    monkeypatch.setattr(fast, "enabled", lambda t: True)
    assert not fast.mixer_halves(fast.MIXER_HALVES_ROWS - 1, x) and fast.mixer_halves(fast.MIXER_HALVES_ROWS, x)
    assert fast.mixer_halves(fast.MIXER_HALVES_ROWS, x, "attention") == fast.MIXER_HALVES_ATTN
    monkeypatch.setattr(fast, "MIXER_HALVES_ROWS", 1)
    assert not fast.mixer_halves(1, x) and fast.mixer_halves(2, x)  # one row has no halves
    monkeypatch.setattr(fast, "MIXER_HALVES_ATTN", False)
    assert not fast.mixer_halves(2, x, "attention") and fast.mixer_halves(2, x, "deltanet")
    with pytest.raises(ValueError, match="kind 'deltanet' or 'attention', found 'moe'"):
        fast.mixer_halves(2, x, "moe")


def test_linear_out_needs_the_decode_gemv():
    lin = torch.nn.Linear(4, 3, bias=False)
    x = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="out= needs the fast path's decode GEMV"):
        fast.linear(lin, x, decode=False, out=torch.empty(2, 3))


def test_run_forked_off_cuda_runs_both_branches_in_order_under_their_lanes():
    seen = []
    branch = lambda name: lambda: seen.append((name, triton_sync.arrival_counters("cpu", 1).data_ptr()))
    fast.run_forked([branch("a"), branch("b")], torch.device("cpu"))
    assert [name for name, _ in seen] == ["a", "b"]
    assert len({p for _, p in seen} | {triton_sync.arrival_counters("cpu", 1).data_ptr()}) == 3
    with pytest.raises(ValueError, match="two branches .* found 3"):
        fast.run_forked([branch("a")] * 3, torch.device("cpu"))


def test_moe_fork_threshold(monkeypatch):
    x = torch.zeros(2, 4, dtype=torch.bfloat16)
    assert fast.moe_fork(64, x) is None  # a CPU tensor without the interpreter: the fast path is off
    monkeypatch.setattr(fast, "enabled", lambda t: True)
    assert fast.moe_fork(fast.MOE_HALVES_TOKENS - 1, x) is None
    fork = fast.moe_fork(fast.MOE_HALVES_TOKENS, x)
    seen = []
    fork([lambda: seen.append(1), lambda: seen.append(2)])  # run_forked on x's device: here in order
    assert seen == [1, 2]
    monkeypatch.setattr(fast, "MOE_HALVES_TOKENS", 1)
    assert fast.moe_fork(1, x) is None and fast.moe_fork(2, x) is not None  # one token has no two sets
