"""The tensor-core experts matmul (`kernels/moe/mma_experts.py`) and the MoE block on it (`kernels/moe/mma_moe.py`)
on CUDA: fp64 reference with NaN-poisoned outputs, and bit for bit across tile shapes, launch forms and batches (a
token alone == among up to 63 others). Gluon kernels have no interpreter form, so these run on the GPU only; the
repack and reference are checked on CPU (tests/test_mma_experts.py)."""

from __future__ import annotations

import pytest
import torch

import kernel_cases as kc
from conftest import INTERPRET

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="Gluon kernels do not run in the interpreter")]


def _experts(dev, e, n, k):
    from deltaserve.kernels.moe import mma_experts as mx

    p, s, b, wd = kc.affine_weight((e, n, k), 4, 64, dev)
    words, sb = mx.repack_q4_experts(p, s, b)
    return (words, sb), wd


def _moe_experts(dev, e, h, i):
    """An MoE block's repacked stacks: gate and up [e, i, h], down [e, h, i]."""
    return tuple(_experts(dev, e, n, k)[0] for n, k in ((i, h), (i, h), (h, i)))


def _routes(dev, e, slots, t):
    """t tokens' expert ids: slots - 1 distinct routed experts of e - 1, then the shared expert stacked last."""
    return torch.stack([torch.cat([torch.randperm(e - 1, device=dev)[: slots - 1], torch.tensor([e - 1], device=dev)])
                        for _ in range(t)]).int()


@pytest.mark.parametrize("e,n,k,top_k", [(8, 64, 256, 2), (256, 1024, 2048, 8), (256, 2048, 512, 8)])
@pytest.mark.parametrize("t", [1, 8, 64])
@pytest.mark.parametrize("tile_rows", [None, 1, 16])
def test_mma_experts_vs_fp64(dev, e, n, k, top_k, t, tile_rows):
    from deltaserve.kernels.moe import mma_experts as mx

    (words, sb), wd = _experts(dev, e, n, k)
    x = torch.randn(t, k, device=dev).bfloat16()
    ids = torch.stack([torch.randperm(e, device=dev)[:top_k].sort().values for _ in range(t)]).int()
    out = kc.poisoned((t * top_k, n), torch.bfloat16, dev)
    tiles = mx.mma_expert_tiles(ids, e, tile_rows)
    y = mx.mma_matmul_experts(x, words, sb, ids, x_repeat=top_k, out=out, tiles=tiles)
    assert y.data_ptr() == out.data_ptr()
    ref = torch.stack([x[r // top_k].double() @ wd[int(i)].t() for r, i in enumerate(ids.reshape(-1).tolist())])
    kc.close(y, ref, 2 * kc.BF16_EPS, f"mma_matmul_experts T={t} E={e} N={n} K={k} tiles {tiles.rows}")
    assert torch.allclose(mx.mma_experts_reference(x, words, sb, ids, top_k), ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("n,k", [(512, 2048), (2048, 512)])
def test_mma_experts_forms_same_bits(dev, n, k):
    """Tile shapes (single rows, sorted tiles of 8 / 16 / 64 rows) and row blocks per program (1, 2, 4) never
    change a row's bits; the scaled form is scale * the plain rows exactly; the gated form is SiLU(gate) * up of
    the plain rows, each rounded to bf16 (SiLU to the exp's last bits) and against fp64."""
    import torch.nn.functional as F

    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.quant import mma_gemv as mg

    e, top_k, t = 64, 8, 40
    (words, sb), wd = _experts(dev, e, n, k)
    (uw, usb), ud = _experts(dev, e, n, k)
    x = torch.randn(t, k, device=dev).bfloat16()
    ids = torch.stack([torch.randperm(e, device=dev)[:top_k].sort().values for _ in range(t)]).int()
    ids[3:, 0] = 5  # one expert picked by most tokens: several tiles of it
    m = t * top_k
    base = mx.mma_matmul_experts(x, words, sb, ids, top_k, tiles=mx.mma_expert_tiles(ids, e, 1), config=(mg.default_warps(k), 1))
    for rows in (1, 8, 16, 64):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        for rb, loop in ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (2, 2)):  # LOOP: rounds over x staged once
            if loop > 1 and k * rows * 2 > mg.STAGE_BYTES:
                with pytest.raises(ValueError, match="shared memory"):
                    mx.mma_matmul_experts(x, words, sb, ids, top_k, tiles=tiles, config=(mg.default_warps(k), rb, 1, loop))
                continue
            got = mx.mma_matmul_experts(x, words, sb, ids, top_k, tiles=tiles,
                                        config=(mg.default_warps(k), rb, 1, loop))
            assert torch.equal(got, base), f"tiles of {rows} rows, RB {rb}, LOOP {loop}: bits differ from RB 1"
    scale = torch.rand(m, device=dev)
    scaled = mx.mma_matmul_experts(x, words, sb, ids, top_k, scale=scale, out=kc.poisoned((m, n), torch.float32, dev))
    assert torch.equal(scaled, scale[:, None] * base.float()), "scaled rows != scale * plain rows"
    up = mx.mma_matmul_experts(x, uw, usb, ids, top_k)
    gated = mx.mma_matmul_experts(x, words, sb, ids, top_k, up=(uw, usb), out=kc.poisoned((m, n), torch.bfloat16, dev))
    want = F.silu(base) * up  # torch's bf16 ops: SiLU rounded, then the product rounded
    diff = (gated.float() - want.float()).abs()
    assert (diff <= 2 * kc.BF16_EPS * want.float().abs() + 1e-30).all(), f"gated != SiLU(g) * u: {diff.max().item()}"
    xr = x.double().repeat_interleave(top_k, 0)
    g64 = torch.einsum("mk,mnk->mn", xr, wd[ids.reshape(-1).long()])
    u64 = torch.einsum("mk,mnk->mn", xr, ud[ids.reshape(-1).long()])
    kc.close(gated, F.silu(g64) * u64, 4 * kc.BF16_EPS, f"gated experts N={n} K={k}")
    for rows in (1, 16):
        for rb, loop in ((1, 1), (4, 1), (1, 4)):
            again = mx.mma_matmul_experts(x, words, sb, ids, top_k, up=(uw, usb),
                                          tiles=mx.mma_expert_tiles(ids, e, rows),
                                          config=(mg.default_warps(k), rb, 2, loop))
            assert torch.equal(again, gated), f"gated: tiles of {rows} rows, RB {rb}, LOOP {loop} change bits"
    parts = mx.mma_matmul_experts(x, words, sb, ids, top_k, scale=scale, tiles=mx.mma_expert_tiles(ids, e, 8),
                                  config=(mg.default_warps(k), 1, 1, 4))
    assert torch.equal(parts, scaled), "scaled rows with LOOP 4 differ"


def test_mma_experts_batch_invariant(dev):
    """A token's rows alone == the same rows among 63 other tokens' (other experts, shared experts, other
    tile positions), bit for bit; and the same rows as the dense-weight GEMV on that expert."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.quant import mma_gemv as mg

    e, n, k, top_k = 256, 1024, 2048, 8
    (words, sb), _ = _experts(dev, e, n, k)
    x = torch.randn(64, k, device=dev).bfloat16()
    ids = torch.stack([torch.randperm(e, device=dev)[:top_k].sort().values for _ in range(64)]).int()
    ids[5:, 0] = ids[0, 0]  # an expert shared by 60 tokens: several tiles
    full = mx.mma_matmul_experts(x, words, sb, ids, x_repeat=top_k)
    for tok in (0, 7, 63):
        alone = mx.mma_matmul_experts(x[tok : tok + 1].clone(), words, sb, ids[tok : tok + 1], x_repeat=top_k)
        assert torch.equal(full[tok * top_k : (tok + 1) * top_k], alone), f"token {tok} alone != among 64"
        for j in range(top_k):
            ex = int(ids[tok, j])
            gemv = mg.mma_gemv(x[tok : tok + 1], words[ex], sb[ex])
            assert torch.equal(alone[j : j + 1], gemv), f"token {tok} pick {j}: experts kernel != mma_gemv"


def _moe_block(dev, t, h=2048, e=256, i=512, i_s=512, top_k=8, seed=0):
    from types import SimpleNamespace

    from deltaserve.kernels.moe.mma_moe import pack_mma_experts
    from deltaserve.kernels.moe.routing import route_topk

    torch.manual_seed(seed)
    mlx, w64 = [], []
    for shape in ((e, i, h), (e, i, h), (e, h, i), (i_s, h), (i_s, h), (h, i_s)):
        p, s, b, wd = kc.affine_weight(shape, 4, 64, dev)
        mlx.append(SimpleNamespace(w=p, scales=s, biases=b))
        w64.append(wd)
    x = torch.randn(t, h, device=dev).bfloat16()
    res = torch.randn(t, h, device=dev).bfloat16()
    w, ids = route_topk(torch.randn(t, e, device=dev), top_k)
    sw = torch.sigmoid(torch.randn(t, device=dev))
    experts = pack_mma_experts(*mlx)
    assert experts.shared_last == (i_s == i) and (experts.shared is None) == (i_s == i)
    return x, res, ids.int(), w.float(), sw, experts, w64


@pytest.mark.parametrize("t", [1, 3])
def test_moe_block_mma_down_early_same_bits(dev, t, monkeypatch):
    """Down's early form (the ids and its first weight chunks read before its PDL wait; gate/up opening late)
    gives the block's output bit for bit; taken at one token (the down ring), not past 16 rows."""
    from deltaserve.kernels.moe import mma_moe

    x, res, ids, w, sw, experts, _ = _moe_block(dev, t, seed=5)
    calls = []
    real = mma_moe.mma_matmul_experts

    def spy(*args, **kw):
        calls.append((kw.get("open_late", False), kw.get("early", False)))
        return real(*args, **kw)

    monkeypatch.setattr(mma_moe, "mma_matmul_experts", spy)
    got = {}
    for early in (False, True):
        monkeypatch.setattr(mma_moe, "down_early", lambda _x, tensor_cores=False, early=early: early)
        calls.clear()
        got[early] = mma_moe.moe_block_mma(x, ids, w, sw, experts, residual=res)
        torch.cuda.synchronize()
        assert calls[-2:] == ([(True, False), (False, True)] if early and t == 1 else [(False, False)] * 2), calls
    assert torch.equal(got[True], got[False]), "down early: the block's output differs"


@pytest.mark.parametrize("t,i_s", [(1, 512), (5, 512), (64, 512), (5, 1024)])
def test_moe_block_mma_vs_fp64(dev, t, i_s):
    import torch.nn.functional as F

    from deltaserve.kernels.moe.mma_moe import moe_block_mma

    x, res, ids, w, sw, experts, (g, u, d, sg, su, sd) = _moe_block(dev, t, i_s=i_s)
    y = moe_block_mma(x, ids, w, sw, experts, residual=res)
    xd = x.double()

    def mlp(v, a, b, c):
        return (F.silu(v @ a.t()) * (v @ b.t())) @ c.t()

    ref = res.double() + sw.double()[:, None] * mlp(xd, sg, su, sd)
    for tok in range(t):
        for j in range(ids.shape[1]):
            ex = int(ids[tok, j])
            ref[tok] += w[tok, j].double() * mlp(xd[tok], g[ex], u[ex], d[ex])
    kc.close(y, ref, 8 * kc.BF16_EPS, f"moe_block_mma T={t} I_s={i_s}")


def test_moe_block_mma_batch_invariant(dev):
    """A token alone == among 63 others, and the tile shape (single rows, sorted tiles) never changes a bit."""
    from deltaserve.kernels.moe.mma_moe import moe_block_mma

    x, res, ids, w, sw, experts, _ = _moe_block(dev, 64, seed=1)
    full = moe_block_mma(x, ids, w, sw, experts, residual=res)
    for rows in (1, 8, 32):
        assert torch.equal(moe_block_mma(x, ids, w, sw, experts, residual=res, tile_rows=rows), full), rows
    for tok in (0, 31, 63):
        sl = slice(tok, tok + 1)
        alone = moe_block_mma(x[sl].clone(), ids[sl], w[sl], sw[sl], experts, residual=res[sl])
        assert torch.equal(full[sl], alone), f"MoE block: token {tok} alone != among 64"


def test_moe_block_mma_shared_slotted(dev):
    """Routing that already holds the stacked shared expert as slot k (moe_route(shared_slot=)) gives the same bits
    as appending it inside the block; a block without a stacked shared expert refuses it."""
    from deltaserve.kernels.moe.mma_moe import moe_block_mma

    x, res, ids, w, sw, experts, _ = _moe_block(dev, 5, seed=2)
    e = experts.gate[0].shape[0]
    ids_s = torch.cat([ids, torch.full_like(ids[:, :1], e - 1)], 1)
    w_s = torch.cat([w, sw[:, None]], 1)
    want = moe_block_mma(x, ids, w, sw, experts, residual=res)
    assert torch.equal(moe_block_mma(x, ids_s, w_s, sw, experts, residual=res, shared_slotted=True), want)
    _, _, _, _, _, separate, _ = _moe_block(dev, 5, i_s=1024, seed=2)
    with pytest.raises(ValueError, match="shared_slotted"):
        moe_block_mma(x, ids_s, w_s, sw, separate, residual=res, shared_slotted=True)

@pytest.mark.parametrize("t", [1, 3, 14])
@pytest.mark.parametrize("with_res", [True, False])
def test_mma_experts_combine_at_last_arrival(dev, t, with_res):
    """The down launch's combine (combine=, single-row tiles) == the parts of the same launch without it, then
    combine_slots, bit for bit; the parts it leaves are those parts; repeated launches reuse the counters (each
    launch leaves them at zero)."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.moe.triton_combine import combine_slots
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.triton_sync import arrival_counters

    e, n, k, slots = 257, 2048, 512, 9
    (words, sb), _ = _experts(dev, e, n, k)
    ids = _routes(dev, e, slots, t)
    hid = torch.randn(t * slots, k, device=dev).bfloat16()
    scale = torch.rand(t * slots, device=dev)
    res = torch.randn(t, n, device=dev).bfloat16() if with_res else None
    tiles = mx.mma_expert_tiles(ids, e, 1)
    part = mx.mma_matmul_experts(hid, words, sb, ids, 1, tiles=tiles, scale=scale)
    want = combine_slots(part.view(t, slots, n), res, out=torch.empty(t, n, dtype=torch.bfloat16, device=dev))
    for rep in range(3):  # (the third launch takes rounds of row blocks over x staged once: LOOP 4)
        parts = kc.poisoned((t * slots, n), torch.float32, dev)
        got = mx.mma_matmul_experts(hid, words, sb, ids, 1, tiles=tiles, scale=scale, out=parts,
                                    combine=(res, kc.poisoned((t, n), torch.bfloat16, dev)),
                                    config=(mg.default_warps(k), 1, 1, 4) if rep == 2 else None)
        assert torch.equal(got, want), f"T={t} launch {rep}: combined at the last arrival != combine_slots"
        assert torch.equal(parts, part), f"T={t}: the parts differ with combine="
    assert int(arrival_counters(dev, 1).abs().sum()) == 0, "counters left non-zero"
    with pytest.raises(ValueError, match="single-row tiles"):
        mx.mma_matmul_experts(hid, words, sb, ids, 1, tiles=mx.mma_expert_tiles(ids, e, 8), scale=scale,
                              combine=(res, torch.empty(t, n, dtype=torch.bfloat16, device=dev)))


@pytest.mark.parametrize("t", [1, 3])
def test_mma_experts_whole_slice_same_bits(dev, t):
    """The experts kernel's whole-slice form (AHEAD >= its chunks: every chunk's weights at once, x by cp.async)
    and its register ring (AHEAD 3 .. chunks - 1, the last being the whole slice up front) give the bits of AHEAD 1
    and 2 in the gated, scaled and combining forms, on single-row tiles."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.quant import mma_gemv as mg

    e, slots, h, i = 65, 9, 2048, 512
    (gw, gsb), (uw, usb), (dw, dsb) = _moe_experts(dev, e, h, i)
    ids = _routes(dev, e, slots, t)
    tiles = mx.mma_expert_tiles(ids, e, 1)
    x = torch.randn(t, h, device=dev).bfloat16()
    scale = torch.rand(t * slots, device=dev)
    res = torch.randn(t, h, device=dev).bfloat16()
    wg, wd = mg.default_warps(h), mg.default_warps(i)
    got = {}
    for ahead in (1, 2, 3, 4, h // 64 // wg - 1, h // 64 // wg):
        got[ahead] = mx.mma_matmul_experts(x, gw, gsb, ids, slots, tiles=tiles, up=(uw, usb), config=(wg, 1, ahead))
    assert all(torch.equal(v, got[1]) for v in got.values()), "gated: AHEAD changes bits"
    hid = got[1]
    for combine in (None, (res, None)):
        outs = []
        for ahead in (1, 2, 3, 4, i // 64 // wd - 1, i // 64 // wd):
            comb = None if combine is None else (res, torch.empty(t, h, dtype=torch.bfloat16, device=dev))
            outs.append(mx.mma_matmul_experts(hid, dw, dsb, ids, 1, tiles=tiles, scale=scale, config=(wd, 1, ahead),
                                              combine=comb))
        assert all(torch.equal(o, outs[0]) for o in outs), f"down (combine={combine is not None}): AHEAD changes bits"


@pytest.mark.parametrize("t", [1, 64, 512])
def test_mma_experts_staged_weights_same_bits(dev, t):
    """The experts kernel's staged-weight form (WSTAGE slots of shared memory filled by cp.async, x staged whole)
    gives the bits of the register forms in the gated and scaled launches, on single-row and sorted 8-row tiles,
    with 2, 3, 5 and more slots than chunks, and a NaN-poisoned output fully written."""
    from deltaserve.kernels.moe import mma_experts as mx
    from deltaserve.kernels.quant import mma_gemv as mg

    e, slots, h, i = 257, 9, 2048, 512
    (gw, gsb), (uw, usb), (dw, dsb) = _moe_experts(dev, e, h, i)
    ids = _routes(dev, e, slots, t)
    x = torch.randn(t, h, device=dev).bfloat16()
    scale = torch.rand(t * slots, device=dev)
    wg, wd = mg.default_warps(h), mg.default_warps(i)
    for rows in (1, 8) if t > 1 else (1,):
        tiles = mx.mma_expert_tiles(ids, e, rows)
        base_g = mx.mma_matmul_experts(x, gw, gsb, ids, slots, tiles=tiles, up=(uw, usb), config=(wg, 1, 2))
        hid = base_g
        rbd = mx.default_row_blocks(dw.shape[1], t * slots, i)
        base_d = mx.mma_matmul_experts(hid, dw, dsb, ids, 1, tiles=tiles, scale=scale, config=(wd, rbd, 2))
        for ns in (2, 3, 5, 9):
            out = torch.full_like(base_g, float("nan"))
            got = mx.mma_matmul_experts(x, gw, gsb, ids, slots, tiles=tiles, up=(uw, usb), config=(wg, 1, 2, 1, ns),
                                        out=out)
            assert torch.equal(got, base_g), f"gated, {rows}-row tiles, {ns} slots"
            out = torch.full_like(base_d, float("nan"))
            got = mx.mma_matmul_experts(hid, dw, dsb, ids, 1, tiles=tiles, scale=scale, config=(wd, rbd, 2, 1, ns),
                                        out=out)
            assert torch.equal(got, base_d), f"down, {rows}-row tiles, {ns} slots"
