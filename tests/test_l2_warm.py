"""The L2 warm plan (deltaserve/kernels/l2_warm.py) on CPU: its regions are the tensors' own bytes, a launch's touch
steps cover every region once, a launch without a plan gets no touch arguments, bad regions are refused with
what is wrong, and the model's switch (fast.l2_warm_plan) gives no plan off CUDA or when off. The touches themselves
(same bits, the GEMV's time) are GPU tests: tests/gpu/test_mma_gemv_gpu.py, tests/gpu/test_model_mma_path.py."""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels import l2_warm


def test_plan_regions_are_the_tensors_bytes():
    w = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    s = torch.ones(3, 2, dtype=torch.bfloat16)
    plan = l2_warm.warm_plan([w, s])
    assert [r.dtype for r in plan.regions] == [torch.uint8, torch.uint8]
    assert [r.data_ptr() for r in plan.regions] == [w.data_ptr(), s.data_ptr()]
    assert plan.nbytes == w.nbytes + s.nbytes == 48 + 12
    assert plan.sink.dtype == torch.int32 and plan.sink.numel() == l2_warm.SINK_WORDS
    assert l2_warm.warm_plan([s]).sink is plan.sink  # one sink a device


@pytest.mark.parametrize("nbytes,programs,threads", [(14_200_000, 288, 128), (1, 1, 32), (128 * 288 * 128, 288, 128),
                                                     (128 * 288 * 128 + 1, 288, 128), (790_528, 1152, 32)])
def test_touch_steps_cover_once(nbytes, programs, threads):
    steps = l2_warm.touch_steps(nbytes, programs, threads)
    lines = programs * threads  # touched lines a step
    assert steps * lines * l2_warm.LINE >= nbytes > (steps - 1) * lines * l2_warm.LINE


def test_warm_kwargs():
    assert l2_warm.warm_kwargs(None, 288, 128) == {}
    w = torch.zeros(12352, 256, dtype=torch.int32)
    s = torch.zeros(12352, 32, dtype=torch.bfloat16)
    plan = l2_warm.warm_plan([w, s])
    kw = l2_warm.warm_kwargs(plan, 288, 128)
    assert kw["wr0"] is plan.regions[0] and kw["wn0"] == w.nbytes and kw["wr1"] is plan.regions[1]
    assert kw["wn1"] == s.nbytes and kw["wsink"] is plan.sink
    assert "wr2" not in kw and "wn2" not in kw and "WARM2" not in kw  # the kernels' defaults: no third region
    assert {k: v for k, v in kw.items() if k.startswith("WARM")} == {"WARM0": 3, "WARM1": 1}
    with pytest.raises(ValueError, match="threads a program"):
        l2_warm.warm_kwargs(plan, 1, l2_warm.SINK_WORDS + 32)


def test_bad_regions_are_refused():
    w = torch.zeros(8, 8)
    with pytest.raises(ValueError, match="contiguous"):
        l2_warm.warm_plan([w.t()])
    with pytest.raises(ValueError, match="1 to 3 regions"):
        l2_warm.warm_plan([w] * 4)
    with pytest.raises(ValueError, match="1 to 3 regions"):
        l2_warm.warm_plan([])
    with pytest.raises(ValueError, match="2 bytes"):
        l2_warm.warm_plan([torch.zeros(1, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="programs"):
        l2_warm.touch_steps(100, 0, 128)


def test_model_switch_gives_no_plan_off_cuda_or_off(monkeypatch):
    from deltaserve.model import fast
    from deltaserve.model.layers import DenseWeights

    lin = DenseWeights().linear("p", 64, 64)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    monkeypatch.setenv("DELTASERVE_L2_WARM", "next")
    assert fast.l2_warm_mode() == "next"
    assert fast.l2_warm_plan(lin, x) is None  # CPU, and a dense weight
    assert fast.l2_warm_plan(None, x) is None
    monkeypatch.setenv("DELTASERVE_L2_WARM", "off")
    assert fast.l2_warm_plan(lin, x) is None
    for mode in ("step", "all"):
        monkeypatch.setenv("DELTASERVE_L2_WARM", mode)
        assert fast.l2_warm_plan(lin, x, "step") is None
    monkeypatch.setenv("DELTASERVE_L2_WARM", "bogus")
    with pytest.raises(ValueError):
        fast.l2_warm_mode()


def test_kv_pages_plan():
    """An attention layer's pages: the caches' bytes, the row's table and length, the block cap from the bytes
    (K and V together, at most the table's width), the launch's keywords; refusals name what is wrong."""
    kc = torch.zeros(64, 16, 2, 256, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    table = torch.arange(40, dtype=torch.int32)
    lens = torch.tensor([600])
    pages = l2_warm.kv_pages(kc, vc, table, lens, 1 << 20)
    assert pages.block_bytes == 16 * 2 * 256 * 2 and pages.block_tokens == 16
    assert pages.max_blocks == (1 << 20) // (2 * pages.block_bytes) == 32
    assert pages.k.data_ptr() == kc.data_ptr() and pages.k.dtype == torch.uint8 and pages.k.numel() == kc.nbytes
    assert l2_warm.kv_pages(kc, vc, table, lens, 64 << 20).max_blocks == 40  # the table's width
    plan = l2_warm.with_pages(None, pages)
    assert plan.regions == () and plan.pages is pages and plan.nbytes == 2 * 32 * pages.block_bytes
    kw = l2_warm.warm_kwargs(plan, 288, 128)
    assert kw["wkk"] is pages.k and kw["wkv"] is pages.v and kw["wkt"] is table and kw["wkl"] is lens
    assert (kw["wkmax"], kw["KV_TOKENS"], kw["KV_BLOCK"]) == (32, 16, pages.block_bytes)
    assert kw["KV_STEPS"] == l2_warm.touch_steps(32 * pages.block_bytes, 288, 128) == 1
    assert not any(k.startswith("WARM") for k in kw)  # no regions: the kernel's defaults
    w = torch.zeros(1000, dtype=torch.int32)
    both = l2_warm.with_pages(l2_warm.warm_plan([w]), pages)
    assert both.regions[0].numel() == w.nbytes and both.nbytes == w.nbytes + plan.nbytes
    with pytest.raises(ValueError, match="must match"):
        l2_warm.kv_pages(kc, vc[:, :8], table, lens, 1 << 20)
    with pytest.raises(ValueError, match="block table"):
        l2_warm.kv_pages(kc, vc, table.long(), lens, 1 << 20)
    with pytest.raises(ValueError, match="hold no block"):
        l2_warm.kv_pages(kc, vc, table, lens, 1000)
    with pytest.raises(ValueError, match="whole 128-byte lines"):
        l2_warm.kv_pages(kc[:, :, :, :1].contiguous(), vc[:, :, :, :1].contiguous(), table, lens, 1 << 20)
    with pytest.raises(ValueError, match="contiguous"):
        l2_warm.kv_pages(kc[:, :, :, :8], vc[:, :, :, :8], table, lens, 1 << 20)


def test_kv_warm_switch(monkeypatch):
    """DELTASERVE_L2_WARM_KV: MB of K/V, 0 (the default) off; off CUDA the plan comes back unchanged."""
    from types import SimpleNamespace

    from deltaserve.model import fast

    monkeypatch.delenv("DELTASERVE_L2_WARM_KV", raising=False)
    assert fast.l2_warm_kv_mb() == 0
    monkeypatch.setenv("DELTASERVE_L2_WARM_KV", "24")
    assert fast.l2_warm_kv_mb() == 24
    batch = SimpleNamespace(num_seqs=1, num_tokens=1, block_tables=torch.zeros(1, 4, dtype=torch.int32),
                            context_lens=torch.tensor([5]))
    sentinel = object()
    assert fast.l2_warm_kv(sentinel, None, 3, batch, torch.zeros(1, 8)) is sentinel  # CPU: unchanged
    monkeypatch.setenv("DELTASERVE_L2_WARM_KV", "-1")
    with pytest.raises(ValueError, match="DELTASERVE_L2_WARM_KV"):
        fast.l2_warm_kv_mb()
