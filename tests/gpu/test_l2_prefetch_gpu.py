"""L2 prefetches (kernels/l2_prefetch.py, model/prefetch.py) on the H200: the bulk-prefetch kernels run over real
weights and picked experts without a fault, and a decode step with every prefetch on gives the logits of a step
without, eager and replayed from a graph, bit for bit (a prefetch writes nothing; the test would catch a race that
let a prefetch launch change what the main stream reads, or a capture left unjoined).

Run on the H200: `pytest -m gpu tests/gpu/test_l2_prefetch_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels import l2_prefetch as l2
from deltaserve.model import prefetch
from deltaserve.model.mlp import SparseMoeBlock
from test_model_fast_path import decode_logits
import test_model_mma_path as mma_path

models = mma_path.models  # the q4 g64 fixture, parametrised by the tensor-core modes

pytestmark = pytest.mark.gpu
ALL = ",".join(prefetch.MODES)


def test_prefetch_kernels_run():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = [torch.rand(n, device="cuda", generator=gen) for n in (1, 1000, 5 << 20)]
    tensors.append(tensors[2][7:3000])  # a view inside another tensor: merged, not prefetched twice
    plan = l2.PrefetchPlan(tensors)
    assert plan.bytes >= sum(t.numel() * 4 for t in tensors[:3])
    stacked = [torch.rand(64, 2048, 64, device="cuda", generator=gen), torch.rand(64, 2048, 8, device="cuda")
               .bfloat16()]
    slices = l2.SlicePlan(stacked)
    ids = torch.randint(0, 64, (3, 8), device="cuda", dtype=torch.int32, generator=gen)
    before = [t.clone() for t in tensors + stacked]
    for _ in range(3):
        plan.launch()
        slices.launch(ids)
        slices.launch(ids.long())
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(before, tensors + stacked))


def test_decode_with_prefetch_same_bits(models, monkeypatch):
    """Every prefetch on (mixer, next, down, gateup) == off, eager and graph, batch of 3, on each q4 mode; in the
    CUDA-core MoE modes the experts' prefetch really ran (its plan was made)."""
    _, gpu, mode = models
    gen = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, 32, (n,), generator=gen).tolist() for n in (5, 40, 17)]
    monkeypatch.setenv("DELTASERVE_L2_PREFETCH", "0")
    off = decode_logits(gpu, prompts, 5, graph=False)
    monkeypatch.setenv("DELTASERVE_L2_PREFETCH", ALL)
    on_eager = decode_logits(gpu, prompts, 5, graph=False)
    on_graph = decode_logits(gpu, prompts, 5, graph=True)
    assert torch.equal(off, on_eager)
    assert torch.equal(off, on_graph)
    layers = list(gpu.layers)
    assert all(layer.__dict__.get("_l2_plan_mixer") for layer in layers)
    assert all(layer.__dict__.get("_l2_plan_next") for layer in layers[:-1])
    if "DELTASERVE_MOE" not in mma_path.MODES[mode]:
        blocks = [m for m in gpu.modules() if isinstance(m, SparseMoeBlock)]
        assert blocks and all(b.__dict__.get("_l2_plan_experts_gateup_down") for b in blocks)
