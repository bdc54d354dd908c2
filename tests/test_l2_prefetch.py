"""The L2 prefetch plans' pure parts (kernels/l2_prefetch.py, model/prefetch.py) on the CPU: the chunk list covers
every byte asked for, aligned and without repeats; the mode switch parses or names what is wrong; nothing is
issued off the GPU. The kernels themselves run in tests/gpu/test_l2_prefetch_gpu.py."""

from __future__ import annotations

import random

import pytest
import torch

from deltaserve.kernels import l2_prefetch as l2
from deltaserve.model import prefetch


def test_chunks_cover_every_range_aligned_without_repeats():
    rng = random.Random(0)
    for _ in range(200):
        ranges = [(rng.randrange(0, 1 << 20), rng.randrange(0, 40000)) for _ in range(rng.randrange(1, 6))]
        chunk = rng.choice([16, 64, 4096, 16384])
        addrs, sizes = l2.chunk_ranges(ranges, chunk)
        assert all(a % l2.ALIGN == 0 and 0 < s <= chunk and s % l2.ALIGN == 0 for a, s in zip(addrs, sizes))
        spans = sorted(zip(addrs, sizes))
        assert all(a1 + s1 <= a2 for (a1, s1), (a2, _) in zip(spans, spans[1:]))  # no byte twice
        covered = set()
        for a, s in spans:
            covered.update(range(a, a + s, 8))
        for a, n in ranges:
            if n:
                assert all(b - b % 8 in covered for b in (a, a + n - 1, a + n // 2))
        # widened by less than one alignment unit at each end of each merged span
        assert sum(sizes) <= sum(n for _, n in ranges) + 2 * l2.ALIGN * len(ranges)


def test_chunks_merge_touching_ranges():
    addrs, sizes = l2.chunk_ranges([(0, 100), (96, 60), (4096, 16)], 64)
    assert list(zip(addrs, sizes)) == [(0, 64), (64, 64), (128, 32), (4096, 16)]


def test_modes_parse_and_name_bad_items(monkeypatch):
    for value, want in (("0", set()), ("", set()), ("1", {"mixer", "next", "down"}), ("next, down", {"next", "down"})):
        monkeypatch.setenv("DELTASERVE_L2_PREFETCH", value)
        assert prefetch.modes() == want
    monkeypatch.setenv("DELTASERVE_L2_PREFETCH", "next,lm_head")
    with pytest.raises(ValueError, match="lm_head"):
        prefetch.modes()


def test_nothing_issued_off_the_gpu(monkeypatch):
    monkeypatch.setenv("DELTASERVE_L2_PREFETCH", ",".join(prefetch.MODES))
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    assert not l2.supported(x)
    assert not any(prefetch.wanted(x, m) for m in prefetch.MODES)
    with pytest.raises(ValueError, match="CUDA"):
        l2.PrefetchPlan([torch.zeros(4)])
    with pytest.raises(ValueError, match="contiguous"):
        l2.SlicePlan([torch.zeros(4, 6)[:, :3]])
