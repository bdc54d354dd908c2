"""kernels/triton_sync.py: the arrival counters' buffer (no Triton needed; the last-arrival pattern itself is checked
through its users under the interpreter: tests/test_triton_interpret.py moe_router_last_arrival,
gdn_decode_split_vs_whole)."""

from __future__ import annotations

import pytest
import torch


def test_counters_are_zero_shared_and_grow_without_freeing():
    pytest.importorskip("triton", reason="triton_sync imports triton.language for its device function")
    from deltaserve.kernels import triton_sync as ts

    ts._COUNTERS.pop(("cpu", None), None)
    a = ts.arrival_counters("cpu", 10)
    assert a.dtype == torch.int32 and a.numel() >= max(10, ts.MIN_COUNTERS) and int(a.abs().sum()) == 0
    # the same counters: kernels share them, launch after launch (a view of lane 0's row each call)
    assert ts.arrival_counters(torch.device("cpu"), 5).data_ptr() == a.data_ptr()
    retired = len(ts._RETIRED)
    b = ts.arrival_counters("cpu", a.numel() + 1)
    assert b.data_ptr() != a.data_ptr() and b.numel() >= 2 * a.numel() and int(b.abs().sum()) == 0
    # the outgrown buffer is kept: a captured graph may still use it
    assert len(ts._RETIRED) == retired + 1 and ts._RETIRED[-1][0].data_ptr() == a.data_ptr()
    assert ts.arrival_counters("cpu", 1).data_ptr() == b.data_ptr()
