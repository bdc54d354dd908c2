"""The experts matmul on warpgroup MMAs (`kernels/moe/wgmma_experts.py`) on CUDA: the mma.sync experts kernel's
bits (the definition of the MoE's bits at every size), NaN-poisoned outputs fully written, the plain form against
fp64, the MoE block through it equal to the block without it, and the wrapper's input checks; then the dense decode
GEMV on the same program (`kernels/quant/wgmma_gemv.py`). A switch is patched in the module whose globals the code
reading it sees: the shared ones (carried slots, the fold) in wgmma_gemv, the MoE's own (wg_split_wait) in
wgmma_experts; a tuned constant (groups a step, register caps, the K split, moe_wgmma.min_rows) is set by name for
the length of a `with` (launch_table.override)."""

from __future__ import annotations

import pytest
import torch

import kernel_cases as kc
from conftest import INTERPRET
from deltaserve.kernels import launch_table
from test_mma_experts_gpu import _experts, _moe_block, _moe_experts, _routes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="Gluon kernels do not run in the interpreter")]


def _moe_35b_case(dev, t):
    """The 35B-A3B's MoE at t tokens (256 routed experts + the shared one stacked last, top-8, H 2048, I 512):
    (E, slots, gate, up, down, routes, x, x's group sums, one fp32 scale per row)."""
    from deltaserve.kernels.quant.triton_gemv import prep_x

    e, slots, h, i = 257, 9, 2048, 512
    gate, up, down = _moe_experts(dev, e, h, i)
    ids = _routes(dev, e, slots, t)
    x = torch.randn(t, h, device=dev).bfloat16()
    return e, slots, gate, up, down, ids, x, prep_x(x, 4, 64)[1], torch.rand(t * slots, device=dev)


@pytest.mark.parametrize("t", [1, 7, 64, 512])
def test_wg_experts_same_bits_as_mma(dev, t, monkeypatch):
    """Gate/up (SiLU * up, the norm's group sums) and the scaled down (its own group sums) at the 35B-A3B's shapes
    (256 routed experts + the shared one stacked last, top-8, H 2048, I 512): every tile width, slot count and group
    order gives the mma.sync kernel's result bit for bit, and writes every element of a NaN-poisoned output."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx

    e, slots, (gw, gsb), (uw, usb), (dw, dsb), ids, x, xs, scale = _moe_35b_case(dev, t)
    tiles8 = mx.mma_expert_tiles(ids, e, 8)
    ref_g = mx.mma_matmul_experts(x, gw, gsb, ids, slots, xs=xs, tiles=tiles8, up=(uw, usb))
    ref_d = mx.mma_matmul_experts(ref_g, dw, dsb, ids, 1, tiles=tiles8, scale=scale)
    for rows in (8, 16, 32):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        for ns in (2, 3, 5):
            # the groups in K order, or partial sum by partial sum (in order, or 0, 2 folded first, then 1, 3);
            # one wait for gate's and up's MMAs, or gate's FMAs between two (split)
            for pm, fold, split in ((False, False, "0"), (True, False, "0"), (True, True, "0"), (True, True, "1")):
                monkeypatch.setattr(wx, "wg_split_wait", lambda split=split: split == "1")
                out = torch.full_like(ref_g, float("nan"))
                got = wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb), out=out, stages=ns,
                                           partial_major=pm, fold=fold)
                assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref_g), \
                    f"gated, {rows}-row tiles, {ns} slots, partial-major {pm}, fold {fold}, split wait {split}"
            out = torch.full_like(ref_d, float("nan"))
            got = wx.wg_matmul_experts(ref_g, dw, dsb, ids, tiles, 1, scale=scale, out=out, stages=ns)
            assert torch.equal(got, ref_d), f"down, {rows}-row tiles, {ns} slots"


@pytest.mark.parametrize("e,n,k,top_k", [(8, 64, 256, 2), (16, 128, 64, 4)])
def test_wg_experts_plain_vs_fp64(dev, e, n, k, top_k):
    """The plain form (no epilogue, x's group sums given or the kernel's own) against fp64 at small shapes (one group
    of K included), poisoned output fully written, and equal to the mma.sync kernel."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx
    from deltaserve.kernels.quant.triton_gemv import prep_x

    (words, sb), wd = _experts(dev, e, n, k)
    t = 37
    x = torch.randn(t, k, device=dev).bfloat16()
    ids = torch.stack([torch.randperm(e, device=dev)[:top_k] for _ in range(t)]).int()
    ref = torch.stack([x[r // top_k].double() @ wd[int(i)].t() for r, i in enumerate(ids.reshape(-1).tolist())])
    tiles = mx.mma_expert_tiles(ids, e, 16)
    for xs in (None, prep_x(x, 4, 64)[1]):
        out = kc.poisoned((t * top_k, n), torch.bfloat16, dev)
        got = wx.wg_matmul_experts(x, words, sb, ids, tiles, top_k, xs=xs, out=out)
        kc.close(got, ref, 2 * kc.BF16_EPS, f"wg plain E={e} N={n} K={k} own sums {xs is None}")
        assert torch.equal(got, mx.mma_matmul_experts(x, words, sb, ids, top_k, xs=xs, tiles=tiles))


@pytest.mark.parametrize("t", [1, 64, 512])
def test_wg_row_sets_same_bits(dev, t):
    """Two 64-row sets a program (row_sets=2, moe_wgmma.down_row_sets: one copy of x for 128 weight rows)
    never changes a bit: the scaled down at the 35B-A3B's shapes (every tile width, 2 / 3 / 5 slots, one and two
    groups a step) equals one set a program, writing every element of a NaN-poisoned output; the plain form (own
    group sums and given ones) against fp64 too; a weight of 4 row blocks is refused."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx
    from deltaserve.kernels.quant.triton_gemv import prep_x

    e, slots, _, _, (dw, dsb), ids, _, _, scale = _moe_35b_case(dev, t)
    h = torch.randn(ids.numel(), dw.shape[2] * 64, device=dev).bfloat16()
    for rows in (8, 16, 32):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        for gs in ("1", "2"):
            for ns in (2, 3, 5):
                with launch_table.override({"moe_wgmma.down_step_groups": int(gs)}):
                    ref = wx.wg_matmul_experts(h, dw, dsb, ids, tiles, 1, scale=scale, stages=ns, row_sets=1)
                    out = kc.poisoned(tuple(ref.shape), ref.dtype, dev)
                    got = wx.wg_matmul_experts(h, dw, dsb, ids, tiles, 1, scale=scale, stages=ns, out=out,
                                               row_sets=2)
                assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref), \
                    f"down, t={t}, {rows}-row tiles, {gs} groups a step, {ns} slots"
    if t != 64:
        return
    (words, sb), wd = _experts(dev, 16, 128, 256)
    x = torch.randn(37, 256, device=dev).bfloat16()
    pick = torch.stack([torch.randperm(16, device=dev)[:4] for _ in range(37)]).int()
    ref = torch.stack([x[r // 4].double() @ wd[int(i)].t() for r, i in enumerate(pick.reshape(-1).tolist())])
    tiles = mx.mma_expert_tiles(pick, 16, 16)
    for xs in (None, prep_x(x, 4, 64)[1]):
        out = kc.poisoned((37 * 4, 128), torch.bfloat16, dev)
        got = wx.wg_matmul_experts(x, words, sb, pick, tiles, 4, xs=xs, out=out, row_sets=2)
        kc.close(got, ref, 2 * kc.BF16_EPS, f"wg plain, two row sets, own sums {xs is None}")
        assert torch.equal(got, wx.wg_matmul_experts(x, words, sb, pick, tiles, 4, xs=xs, row_sets=1))
    with pytest.raises(ValueError, match="row sets"):
        wx.wg_matmul_experts(x, words[:, :4], sb[:, :4], pick, tiles, 4, row_sets=2)
    with pytest.raises(ValueError, match="gated launches 1"):  # gate/up has its two weights already
        wx.wg_matmul_experts(x, words, sb, pick, tiles, 4, xs=prep_x(x, 4, 64)[1], up=(words, sb), row_sets=2)


@pytest.mark.parametrize("t", [3, 300, 512, 1024])
def test_moe_block_wgmma_same_bits(dev, t):
    """The MoE block with its gate/up and down on the warpgroup-MMA kernel (from one row; its default launch shapes:
    8-row tiles to 455 tokens, 16-row from 456, 32-row from 911) equals the block on the mma.sync kernel bit for bit, the stacked
    shared expert included; so does it with its tiles as two sets (fork=), serial or on two streams."""
    from deltaserve.kernels.moe.mma_moe import moe_block_mma

    x, res, ids, w, sw, experts, _ = _moe_block(dev, t)
    from deltaserve.kernels.moe import wgmma_experts as wx

    with launch_table.override({"moe_wgmma.min_rows": 1 << 62}):  # never: the mma.sync kernel
        base = moe_block_mma(x, ids, w, sw, experts, residual=res)
    with launch_table.override({"moe_wgmma.min_rows": 1}):
        assert wx.wg_min_rows() == 1
        assert torch.equal(moe_block_mma(x, ids, w, sw, experts, residual=res), base)
        # the tiles as two sets (fork=): one after the other, and on the model's two side streams
        from deltaserve.model.fast import run_forked

        for fork in (lambda fns: [f() for f in fns], lambda fns: run_forked(fns, x.device)):
            assert torch.equal(moe_block_mma(x, ids, w, sw, experts, residual=res, fork=fork), base)


def test_wg_experts_input_checks(dev):
    """Bad inputs name the problem: x's width, the up weight's shape, the gated form without group sums, tiles of
    one row, the slot count, out's shape."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx

    (words, sb), _ = _experts(dev, 8, 64, 256)
    x = torch.randn(4, 256, device=dev).bfloat16()
    ids = torch.randint(0, 8, (4, 2), device=dev).int()
    tiles = mx.mma_expert_tiles(ids, 8, 16)
    with pytest.raises(ValueError, match=r"x must be bf16 \[rows, 256\]"):
        wx.wg_matmul_experts(x[:, :128], words, sb, ids, tiles, 2)
    with pytest.raises(ValueError, match="takes x's group sums"):
        wx.wg_matmul_experts(x, words, sb, ids, tiles, 2, up=(words, sb))
    with pytest.raises(ValueError, match="the up weight"):
        wx.wg_matmul_experts(x, words, sb, ids, tiles, 2, xs=torch.zeros(4, 4, device=dev), up=(words[:4], sb[:4]))
    with pytest.raises(ValueError, match="sorted tiles of 8 - 64 rows"):
        wx.wg_matmul_experts(x, words, sb, ids, mx.mma_expert_tiles(ids, 8, 1), 2)
    with pytest.raises(ValueError, match="shared-memory slots"):
        wx.wg_matmul_experts(x, words, sb, ids, tiles, 2, stages=1)
    with pytest.raises(ValueError, match="out must be"):
        wx.wg_matmul_experts(x, words, sb, ids, tiles, 2, out=torch.empty(8, 32, device=dev, dtype=torch.bfloat16))


# ------------------------------------------------------------------ the dense decode GEMV on warpgroup MMAs


@pytest.mark.parametrize("n,k", [(12352, 2048), (9216, 2048), (128, 1024), (64, 256), (64, 64)])
def test_wg_gemv_same_bits_as_mma_gemv(dev, n, k, monkeypatch):
    """wg_gemv gives mma_gemv's result bit for bit (the decode linears' definition at every row count) for 1 to 100
    rows, every tile width and slot count, the group sums given or its own, bf16 and fp32 (widened) out, writing
    every element of a NaN-poisoned output; and against fp64."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_gemv as wg
    from deltaserve.kernels.quant.triton_gemv import prep_x

    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    assert wg.wg_dense_fits(words)
    x = torch.randn(100, k, device=dev).bfloat16()
    xs_all = prep_x(x, 4, 64)[1]
    kc.close(wg.wg_gemv(x, words, sb, out=kc.poisoned((100, n), torch.bfloat16, dev)), x.double() @ wd.t(),
             2 * kc.BF16_EPS, f"wg_gemv N={n} K={k} vs fp64")
    for m in (1, 7, 16, 64, 100):
        for xs in (None, xs_all[:m]):
            ref = torch.cat([mg.mma_gemv(x[r : min(r + 64, m)], words, sb,
                                         xs=None if xs is None else xs[r : min(r + 64, m)]) for r in range(0, m, 64)])
            for rows in (8, 16, 32, 64):
                for ns, fold in ((2, False), (3, False), (3, True)) if rows == 16 else ((3, False), (3, True)):
                    out = kc.poisoned((m, n), torch.bfloat16, dev)
                    got = wg.wg_gemv(x[:m], words, sb, xs=xs, out=out, tile_rows=rows, stages=ns, fold=fold)
                    assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref), \
                        f"m={m} own sums {xs is None} {rows}-row tiles {ns} slots fold {fold}"
            out = kc.poisoned((m, n), torch.float32, dev)
            assert torch.equal(wg.wg_gemv(x[:m], words, sb, xs=xs, out=out), ref.float()), f"fp32 out, m={m}"


@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 4096), (128, 1024)])
def test_wg_gemv_ksplit_same_bits(dev, n, k):
    """wg_gemv with a row block's K split over 1 - 8 programs (the last arrival adding their sums through the fp32
    scratch) gives mma_gemv's result bit for bit: the 4-warp K split (the in_proj) over 1 / 2 / 4 programs, the
    8-warp one (the out projections, K = 4096) over 2 / 4 / 8; 1 to 100 rows, 16- and 32-row tiles, the group sums
    given or its own, one and two groups a step, a NaN-poisoned output; the arrival counters left at zero; and the
    splits it cannot make refused."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_gemv as wg
    from deltaserve.kernels.quant.triton_gemv import prep_x
    from deltaserve.kernels.triton_sync import arrival_counters

    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    warps = mg.default_warps(k)
    x = torch.randn(100, k, device=dev).bfloat16()
    xs_all = prep_x(x, 4, 64)[1]
    kc.close(wg.wg_gemv(x, words, sb, out=kc.poisoned((100, n), torch.bfloat16, dev), ksplit=warps // 2),
             x.double() @ wd.t(), 2 * kc.BF16_EPS, f"wg_gemv N={n} K={k} split {warps // 2} vs fp64")
    for m in (1, 17, 64, 100):
        for xs in (None, xs_all[:m]):
            ref = torch.cat([mg.mma_gemv(x[r : min(r + 64, m)], words, sb,
                                         xs=None if xs is None else xs[r : min(r + 64, m)]) for r in range(0, m, 64)])
            for ks in (1, 2, 4) if warps == 4 else (2, 4, 8):
                for rows in (16, 32):
                    for gs in ("1", "2"):
                        out = kc.poisoned((m, n), torch.bfloat16, dev)
                        with launch_table.override({"gemv_wgmma.step_groups": int(gs)}):
                            got = wg.wg_gemv(x[:m], words, sb, xs=xs, out=out, tile_rows=rows, ksplit=ks)
                        assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref), \
                            f"N={n} K={k} m={m} own sums {xs is None} split {ks} {rows}-row tiles {gs} groups a step"
    assert not arrival_counters(dev, 1).any(), "a split left an arrival counter set"
    for bad in ((3, 5, 16) if warps == 4 else (1, 3, 16)):
        with pytest.raises(ValueError, match="ksplit"):
            wg.wg_gemv(x, words, sb, ksplit=bad)


@pytest.mark.parametrize("m", [16, 64])
def test_mma_gemv_through_wg_gemv(dev, m):
    """tc_gemv from gemv_tc.wg_gemv_rows rows runs as wg_gemv (the conv in its epilogue): the conv check of kernel_cases (== the GEMV then causal_conv, the other slots
    untouched, against fp64), and the same outputs and conv pool as the mma.sync forms, plain and with the DeltaNet
    in_proj's conv (the in_proj's K also split over two programs, its conv at their last arrival; the K = 4096 out
    projections' over wg_gemv_ksplit's default eight, and over four); weights it cannot take (N % 64) keep mma.sync."""
    from deltaserve.kernels.gated_delta import triton_decode as td
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import tensor_core_gemv as tcg
    from test_mma_gemv_gpu import _tc_gemv_of

    with launch_table.override({"gemv_tc.wg_gemv_rows": 1}):  # every K
        kc.check_gemv_conv({"gdn": td}, dev, 4, 64, m=m, c=8192, extra=4160, k=2048, fresh=(1,), gemv=_tc_gemv_of)
    for n, k, c in ((12352, 2048, 8192), (2048, 4096, 1024), (80, 256, 64)):
        p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
        words, sb = mg.repack_q4(p, s, b)
        x = torch.randn(m, k, device=dev).bfloat16()
        cw, pool, slots, ctx = kc.conv_problem(dev, m, c, 4, 3 * m + 2, (1,))
        pool = pool.nan_to_num()
        outs = {}
        # through wg_gemv (the default splits, and the 4-warp one over two programs), and mma.sync with the conv in
        # its epilogue
        for rows, split in (("1", "1,8"), ("1", "2,4"), ("0", "1,8")):
            never = rows == "0"
            pl = pool.clone()
            with launch_table.override({"gemv_tc.wg_gemv_rows": 1 << 62 if never else 1,
                                        "gemv_wgmma.ksplit": tuple(int(v) for v in split.split(","))}):
                outs[rows, split] = (tcg.tc_gemv(x, words, sb),
                                     tcg.tc_gemv(x, words, sb, conv=(cw, pl, slots, ctx, c)), pl)
        for via in (("1", "1,8"), ("1", "2,4")):
            for what, a, b in zip(("plain", "conv", "conv pool"), outs[via], outs["0", "1,8"]):
                assert torch.equal(a, b), f"{what}, N={n} K={k}, {m} rows, splits {via[1]}"


@pytest.mark.parametrize("slots_mode", ["mod", "carry"])
@pytest.mark.parametrize("t", [64, 512])
def test_wg_xs_smem_same_bits(dev, t, slots_mode, monkeypatch):
    """x's group sums staged in shared memory (xs_smem), with the slots computed or carried (wg_slot_carry), never
    change a bit: the MoE's gate/up at the 35B-A3B's shapes (every tile
    width, 3 and 5 slots, both group orders) and wg_gemv (1 to 100 rows, every tile width, K of 1 - 32 groups, a
    group count that is not a power of two included) equal the loads from global memory with computed slots, which
    equal the mma.sync kernels (test_wg_experts_same_bits_as_mma, test_wg_gemv_same_bits_as_mma_gemv), writing every
    element of a NaN-poisoned output; the down (the kernel's own sums) with carried slots equals it too."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_gemv as wg

    def both(fn):  # (the reference: loads, computed slots; the form under test)
        monkeypatch.setattr(wg, "wg_slot_carry", lambda: False)
        ref = fn(False)
        monkeypatch.setattr(wg, "wg_slot_carry", lambda: slots_mode == "carry")
        return ref, fn(True)

    e, slots, (gw, gsb), (uw, usb), (dw, dsb), ids, x, xs, scale = _moe_35b_case(dev, t)
    for rows in (8, 16, 32):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        for ns in (3, 5):
            for pm in (False, True):
                out = kc.poisoned((ids.numel(), gw.shape[1] * 16), torch.bfloat16, dev)
                ref, got = both(lambda sm: wx.wg_matmul_experts(
                    x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb), out=out if sm else None, stages=ns,
                    partial_major=pm, xs_smem=sm))
                assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref), \
                    f"gated, t={t}, {rows}-row tiles, {ns} slots, partial-major {pm}, slots {slots_mode}"
            g = ref
            ref, got = both(lambda sm: wx.wg_matmul_experts(g, dw, dsb, ids, tiles, 1, scale=scale, stages=ns))
            assert torch.equal(got, ref), f"down, t={t}, {rows}-row tiles, {ns} slots, slots {slots_mode}"
    if t != 64:
        return
    for n, k in ((12352, 2048), (128, 1024), (64, 320), (64, 64)):
        p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
        words, sb = mg.repack_q4(p, s, b)
        assert wg.wg_dense_fits(words)
        xd = torch.randn(100, k, device=dev).bfloat16()
        xsd = xd.float().view(100, k // 64, 64).sum(-1)  # group sums (prep_x needs a power-of-two K)
        for m in (1, 7, 64, 100):
            for rows in (8, 16, 32, 64):
                out = kc.poisoned((m, n), torch.bfloat16, dev)
                ref, got = both(lambda sm: wg.wg_gemv(xd[:m], words, sb, xs=xsd[:m], out=out if sm else None,
                                                      tile_rows=rows, xs_smem=sm))
                assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref), \
                    f"wg_gemv N={n} K={k} m={m} {rows}-row tiles, slots {slots_mode}"


@pytest.mark.parametrize("cap,fold", [(((64, 128),), False), (((8, 128),), False),
                                      (((8, 96), (16, 128), (32, 168)), True)])
def test_wg_register_cap_same_bits(dev, cap, fold, monkeypatch):
    """A register cap for the launches (moe_wgmma.maxnreg, gemv_wgmma.maxnreg; spilling what does not fit), with or
    without the folded partial sums (wg_fold_pair), never changes a bit: the MoE's gate/up and down at a 64-stream
    decode's 64 tokens (8-, 16- and 32-row tiles) and wg_gemv at 64 rows (8- and 32-row tiles), capped (and folded) ==
    neither."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_gemv as wg

    e, slots, (gw, gsb), (uw, usb), (dw, dsb), ids, x, xs, scale = _moe_35b_case(dev, 64)
    p, s, b, _ = kc.affine_weight((12352, 2048), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)

    def run():
        out = []
        for rows, dense_rows in ((8, 8), (16, 32), (32, 32)):
            tiles = mx.mma_expert_tiles(ids, e, rows)
            g = wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb))
            out += [g, wx.wg_matmul_experts(g, dw, dsb, ids, tiles, 1, scale=scale),
                    wg.wg_gemv(x, words, sb, xs=xs, tile_rows=dense_rows)]
        return out

    monkeypatch.setattr(wg, "wg_fold_pair", lambda: False)
    with launch_table.override({"moe_wgmma.maxnreg": (), "gemv_wgmma.maxnreg": ()}):  # no cap
        base = run()
    monkeypatch.setattr(wg, "wg_fold_pair", lambda: fold)
    with launch_table.override({"moe_wgmma.maxnreg": cap, "gemv_wgmma.maxnreg": cap}):
        capped = run()
    whats = [f"{w} ({r}-row tiles)" for r in (8, 16, 32) for w in ("gated", "down", "wg_gemv")]
    for what, a, b in zip(whats, capped, base):
        assert torch.equal(a, b), f"{what} with the register cap {cap}, fold {fold}"


@pytest.mark.parametrize("t,slots_mode", [(1, "mod"), (1, "carry"), (64, "carry"), (512, "carry")])
def test_wg_step_groups_same_bits(dev, t, slots_mode, monkeypatch):
    """Two groups a loop step (moe_wgmma.step_groups, moe_wgmma.down_step_groups and gemv_wgmma.step_groups = 2: one
    cp.async group, wait and barrier per two groups) never changes a bit: the MoE's gate/up and down at the
    35B-A3B's shapes (every tile width, 2 and 5 slots, both group orders, computed or carried slots) and wg_gemv
    (1 to 100 rows, 8- / 32- / 64-row tiles, sums given and its own, K of 2 - 32 groups) equal one group a step,
    writing every element of a NaN-poisoned output."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import wgmma_gemv as wg

    monkeypatch.setattr(wg, "wg_slot_carry", lambda: slots_mode == "carry")

    def both(fn, poison):  # (one group a step, two)
        names = ("moe_wgmma.step_groups", "moe_wgmma.down_step_groups", "gemv_wgmma.step_groups")
        with launch_table.override(dict.fromkeys(names, 1)):
            ref = fn(None)
        out = kc.poisoned(tuple(ref.shape), ref.dtype, dev) if poison else None
        with launch_table.override(dict.fromkeys(names, 2)):
            got = fn(out)
        assert out is None or got.data_ptr() == out.data_ptr()
        return ref, got

    e, slots, (gw, gsb), (uw, usb), (dw, dsb), ids, x, xs, scale = _moe_35b_case(dev, t)
    for rows in (8, 16, 32):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        for ns in (2, 5):
            for pm in (False, True):
                ref, got = both(lambda out: wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb),
                                                                 out=out, stages=ns, partial_major=pm), True)
                assert torch.equal(got, ref), f"gated, t={t}, {rows}-row tiles, {ns} slots, partial-major {pm}"
            g = ref
            ref, got = both(lambda out: wx.wg_matmul_experts(g, dw, dsb, ids, tiles, 1, scale=scale, out=out,
                                                             stages=ns), True)
            assert torch.equal(got, ref), f"down, t={t}, {rows}-row tiles, {ns} slots"
    if t != 64:
        return
    for n, k in ((12352, 2048), (128, 1024), (64, 128)):  # K split 4 (both group orders' runs), 4, 1
        p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
        words, sb = mg.repack_q4(p, s, b)
        xd = torch.randn(100, k, device=dev).bfloat16()
        xsd = xd.float().view(100, k // 64, 64).sum(-1)
        for m in (1, 7, 64, 100):
            for rows in (8, 32, 64):
                for given in (True, False):  # the norm's sums, or the kernel's own
                    ref, got = both(lambda out: wg.wg_gemv(xd[:m], words, sb, xs=xsd[:m] if given else None, out=out,
                                                           tile_rows=rows), True)
                    assert torch.equal(got, ref), f"wg_gemv N={n} K={k} m={m} {rows}-row tiles, sums given {given}"


@pytest.mark.parametrize("t", [1, 64, 512])
def test_wg_tile_sets_make_the_joint_launch(dev, t):
    """Two launches over the table's even and odd tiles (tile_set=(0, 2), (1, 2): moe_block_mma(fork=)'s two sets)
    into one NaN-poisoned output make the joint launch's output bit for bit (gate/up and the scaled down at the
    35B-A3B's shapes, 8- and 16-row tiles), each set alone writes only its tiles' rows, and a set without out= or
    out of range is refused."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe import wgmma_experts as wx

    e, slots, (gw, gsb), (uw, usb), (dw, dsb), ids, x, xs, scale = _moe_35b_case(dev, t)
    for rows in (8, 16):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        ref_g = wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb))
        ref_d = wx.wg_matmul_experts(ref_g, dw, dsb, ids, tiles, 1, scale=scale)
        gated = lambda out, s: wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb), out=out,
                                                    tile_set=s)
        down = lambda out, s: wx.wg_matmul_experts(ref_g, dw, dsb, ids, tiles, 1, scale=scale, out=out, tile_set=s)
        for name, run, ref in (("gated", gated, ref_g), ("down", down, ref_d)):
            out = kc.poisoned(tuple(ref.shape), ref.dtype, dev)
            run(out, (0, 2))
            # the even tiles' rows written, the odd tiles' still poisoned (rows of the table's live tiles)
            e_t, lo, hi, order = (v.tolist() for v in (tiles.tile_e, tiles.lo, tiles.hi, tiles.order))
            for i, ex in enumerate(e_t):
                if ex >= 0 and hi[i] > lo[i]:
                    r = order[lo[i]]
                    assert torch.isnan(out[r]).any() == bool(i % 2), f"{name}, t={t}: tile {i}'s row {r}"
            run(out, (1, 2))
            assert torch.equal(out, ref), f"{name}, t={t}, {rows}-row tiles: the two sets != the joint launch"
    for bad in ((2, 2), (-1, 2)):
        with pytest.raises(ValueError, match="tile_set"):
            wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb), out=ref_g.clone(), tile_set=bad)
    with pytest.raises(ValueError, match="out="):
        wx.wg_matmul_experts(x, gw, gsb, ids, tiles, slots, xs=xs, up=(uw, usb), tile_set=(0, 2))
