"""lab/probe_moe_halves.py's split of an MoE block's expert tiles into two sets (the probe itself needs an sm_90
GPU): the sets partition the live tiles by expert, every (token, slot) row lies in exactly one set's tiles, and the
routing it draws is the model's (k distinct experts, the stacked shared one last)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "probe_moe_halves.py"


@pytest.fixture(scope="module")
def probe():
    pytest.importorskip("triton", reason="the probe imports the kernels' modules")
    spec = importlib.util.spec_from_file_location("probe_moe_halves", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_routing_draws_distinct_experts_and_the_shared_slot(probe):
    ids, weights = probe.routing(64, torch.device("cpu"), seed=3)
    assert ids.shape == weights.shape == (64, probe.TOP_K + 1) and ids.dtype == torch.int32
    assert (ids[:, -1] == probe.E).all() and (ids[:, :-1] < probe.E).all() and (ids[:, :-1] >= 0).all()
    assert all(len(set(row.tolist())) == probe.TOP_K for row in ids[:, :-1])


def test_tile_sets_partition_the_rows_by_expert(probe):
    from deltaserve.kernels.moe.mma_experts import MmaTiles
    from deltaserve.kernels.quant.triton_affine import expert_tiles_reference

    ids, _ = probe.routing(64, torch.device("cpu"), seed=4)
    tiles = MmaTiles(*expert_tiles_reference(ids.reshape(-1), probe.E + 1, 8), 8)
    a, b = probe.tile_sets(tiles)
    assert (a.tile_e < probe.E // 2).all() and (b.tile_e >= probe.E // 2).all() and (b.tile_e == probe.E).any()
    live = int((tiles.tile_e >= 0).sum())
    assert a.tile_e.numel() + b.tile_e.numel() == live and a.order is tiles.order and a.rows == b.rows == 8
    covered = torch.zeros(ids.numel(), dtype=torch.int64)
    for s in (a, b):
        for lo, hi in zip(s.lo.tolist(), s.hi.tolist()):
            covered[s.order[lo:hi].long()] += 1
    assert (covered == 1).all(), "a (token, slot) row in no set's tiles, or in two"


def test_same_bits_compares_bytes(probe):
    """The probes' bit check (sweep_common.same_bits, which the probe imports): NaNs of the same bits are equal,
    -0.0 and 0.0 are not, nor are the same bytes in another dtype or shape."""
    same_bits = probe.same_bits
    a = torch.tensor([[1.5, float("nan"), 0.0]], dtype=torch.bfloat16)
    assert same_bits(a, a.clone()) and not torch.equal(a, a.clone())
    assert not same_bits(a, torch.tensor([[1.5, float("nan"), -0.0]], dtype=torch.bfloat16))
    f = torch.zeros(2, 2)
    assert same_bits(f, torch.zeros(2, 2)) and not same_bits(f, torch.zeros(4, dtype=torch.float32))
    assert not same_bits(f, torch.zeros(2, 2, dtype=torch.int32))
