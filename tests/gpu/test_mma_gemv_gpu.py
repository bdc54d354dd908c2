"""Tensor-core GEMV (`kernels/quant/mma_gemv.py`) on CUDA: fp64 reference with NaN-poisoned outputs, and bit-for-bit
batch invariance (a row alone == the same row among up to 63 others). Gluon kernels have no interpreter form, so
these run on the GPU only; the repack's meaning is checked on CPU (tests/test_mma_gemv.py)."""

from __future__ import annotations

import pytest
import torch

import kernel_cases as kc
from conftest import INTERPRET

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="Gluon kernels do not run in the interpreter")]


@pytest.mark.parametrize("n,k", [(64, 256), (2048, 4096), (12352, 2048), (512, 1024)])
@pytest.mark.parametrize("m", [1, 5, 8, 16, 64])
def test_mma_gemv_vs_fp64(dev, n, k, m):
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(m, k, device=dev).bfloat16()
    out = kc.poisoned((m, n), torch.bfloat16, dev)
    y = mg.mma_gemv(x, words, sb, out=out)
    assert y.data_ptr() == out.data_ptr()
    ref = x.double() @ wd.t()
    kc.close(y, ref, 2 * kc.BF16_EPS, f"mma_gemv M={m} N={n} K={k}")
    rowscale = ref.abs().amax(1, keepdim=True).clamp_min(1e-3)
    err = ((y.double() - ref).abs() / rowscale).max().item()
    assert err <= 2 * kc.BF16_EPS, f"mma_gemv M={m}: row-relative error {err:.3g}"


@pytest.mark.parametrize("n,k", [(2048, 4096), (9216, 2048)])
def test_mma_gemv_batch_invariant(dev, n, k):
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(64, k, device=dev).bfloat16()
    alone = torch.cat([mg.mma_gemv(x[r : r + 1], words, sb) for r in range(64)])
    for m in (2, 4, 16, 64):
        assert torch.equal(mg.mma_gemv(x[:m], words, sb), alone[:m]), f"rows differ when {m} share the launch"
    assert torch.equal(mg.mma_gemv(x[37:40], words, sb), alone[37:40])


@pytest.mark.parametrize("m", [1, 8, 64, 70])
def test_mma_gemv_fp32_out_is_the_bf16_result_widened(dev, m):
    """An fp32 out (the lm_head's logits) holds the bf16 results widened, bit for bit,
    at one launch and past MAX_ROWS (two); conv= with an fp32 out is refused."""
    from deltaserve.kernels.quant import mma_gemv as mg

    n, k = 2048 * 3, 2048
    p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(m, k, device=dev).bfloat16()
    out = kc.poisoned((m, n), torch.float32, dev)
    got = mg.mma_gemv(x, words, sb, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, mg.mma_gemv(x, words, sb).float())
    with pytest.raises(ValueError, match="out must be bf16"):
        mg.mma_gemv(x[:1], words, sb, out=out[:1], conv=(None, None, None, None, 0))


def _mma_gemv_of(p, s, b):
    """kernel_cases' conv-check GEMV factory for the mma.sync tensor-core GEMV (the weight repacked once)."""
    from deltaserve.kernels.quant import mma_gemv as mg

    words, sb = mg.repack_q4(p, s, b)
    return lambda x, out=None, conv=None: mg.mma_gemv(x, words, sb, out=out, conv=conv)


def _tc_gemv_of(p, s, b):
    """The same for the decode linears' entry (tensor_core_gemv.tc_gemv: mma_gemv or wg_gemv by rows)."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant import tensor_core_gemv as tcg

    words, sb = mg.repack_q4(p, s, b)
    return lambda x, out=None, conv=None: tcg.tc_gemv(x, words, sb, out=out, conv=conv)


@pytest.mark.parametrize("c,extra,k", [(64, 16, 256), (8192, 4160, 2048)])
@pytest.mark.parametrize("m", [1, 3, 16, 64])
def test_mma_gemv_conv(dev, c, extra, k, m):
    """mma_gemv(conv=...) == mma_gemv then causal_conv on the first C features, bit for bit (outputs and pool),
    the other slots untouched, and against fp64 (the DeltaNet in_proj decode of the model): the CUDA-core GEMV's
    check (kernel_cases.check_gemv_conv) with this GEMV."""
    from deltaserve.kernels.gated_delta import triton_decode as td

    kc.check_gemv_conv({"gdn": td}, dev, 4, 64, m=m, c=c, extra=extra, k=k, fresh=(1,), gemv=_mma_gemv_of)


def test_mma_gemv_conv_invariance(dev):
    kc.check_gemv_conv_invariance({}, dev, 8192, 4160, 2048, gemv=_mma_gemv_of)


@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 4096)])
def test_mma_gemv_launch_shapes_same_bits(dev, n, k):
    """Row blocks per program and chunks in flight (which default_config picks by the rows of x) never change a
    bit: 64 rows under every (RB, AHEAD) == under (1, 1), plain and with the conv epilogue (outputs and pool)."""
    from deltaserve.kernels.quant import mma_gemv as mg

    p, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    w = mg.default_warps(k)
    x = torch.randn(64, k, device=dev).bfloat16()
    base = mg.mma_gemv(x, words, sb, config=(w, 1, 1))
    assert mg.default_config(k, 64, n // 16) != (w, 1, 1)  # the 64-row default is another launch shape
    for rb in (1, 2):
        for ahead in (1, 2):
            assert torch.equal(mg.mma_gemv(x, words, sb, config=(w, rb, ahead)), base), (rb, ahead)
    assert torch.equal(mg.mma_gemv(x, words, sb), base), "the default launch shape at 64 rows"
    every = k // 64 // w  # AHEAD >= the chunks: the whole weight requested up front (a form for up to 8 rows)
    for m in (1, 8):
        assert torch.equal(mg.mma_gemv(x[:m], words, sb, config=(w, 1, every)), base[:m]), f"all chunks, {m} rows"
        for ring in (3, 4, every - 1):  # the register ring (_accumulate_ring): first chunks' weights before the wait
            assert torch.equal(mg.mma_gemv(x[:m], words, sb, config=(w, 1, ring)), base[:m]), f"ring {ring}, {m} rows"
    c = min(8192, n // 2)
    cw, pool, slots, ctx = kc.conv_problem(dev, 64, c, 4, 3 * 64 + 2, (1,))
    pool = pool.nan_to_num()
    outs = []
    for config in ((w, 1, 1), None):  # the one-row shape and the 64-row default
        pl = pool.clone()
        outs.append((mg.mma_gemv(x, words, sb, conv=(cw, pl, slots, ctx, c), config=config), pl))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), "conv epilogue bits"
    rows = [(mg.mma_gemv(x[:8], words, sb, conv=(cw, pl, slots[:8], ctx[:8], c), config=config), pl)
            for config in ((w, 1, 1), (w, 1, every), (w, 1, 4)) for pl in (pool.clone(),)]
    for got, what in ((rows[1], "all chunks"), (rows[2], "the ring")):
        assert torch.equal(rows[0][0], got[0]) and torch.equal(rows[0][1], got[1]), f"conv, {what}"


# ------------------------------------------------------------------ experts (grouped) and the MoE block


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


@pytest.mark.parametrize("n,k", [(2048, 4096), (512, 1024)])
def test_mma_gemv_own_group_sums(dev, n, k):
    """xs=None (the kernel's own group sums, MMA with ones) and xs from prep_x (the norm's bits) are both within
    the fp64 bound, and each is batch invariant (a row alone == among 64)."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant.triton_gemv import prep_x

    p, s, b, wd = kc.affine_weight((n, k), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(64, k, device=dev).bfloat16()
    xs = prep_x(x, 4, 64)[1]
    ref = x.double() @ wd.t()
    own = mg.mma_gemv(x, words, sb, out=kc.poisoned((64, n), torch.bfloat16, dev))
    loaded = mg.mma_gemv(x, words, sb, xs=xs, out=kc.poisoned((64, n), torch.bfloat16, dev))
    kc.close(own, ref, 2 * kc.BF16_EPS, "mma_gemv, own group sums")
    kc.close(loaded, ref, 2 * kc.BF16_EPS, "mma_gemv, prep_x's group sums")
    for r in (0, 37, 63):
        assert torch.equal(mg.mma_gemv(x[r : r + 1].clone(), words, sb), own[r : r + 1]), f"own sums: row {r}"
        assert torch.equal(mg.mma_gemv(x[r : r + 1].clone(), words, sb, xs=xs[r : r + 1].clone()),
                           loaded[r : r + 1]), f"prep sums: row {r}"


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


@pytest.mark.parametrize("split,cap", [(16, {}), (32, {}), (32, {"maxnreg": 128})])
def test_mma_gemv_row_split_same_bits(dev, split, cap, monkeypatch):
    """The K = 4096 weights' rows of x split over programs (mma_gemv.SPLIT_ROWS, with and without a register
    cap) give the unsplit launch's bits at 64 and 37 rows (a ragged last block), the group sums given or
    the kernel's own, every element of a NaN-poisoned output written."""
    from deltaserve.kernels.quant import mma_gemv as mg
    from deltaserve.kernels.quant.triton_gemv import prep_x

    p, s, b, _ = kc.affine_weight((2048, 4096), 4, 64, dev)
    words, sb = mg.repack_q4(p, s, b)
    x = torch.randn(64, 4096, device=dev).bfloat16()
    xs_all = prep_x(x, 4, 64)[1]
    for m in (64, 37):
        for xs in (None, xs_all[:m]):
            monkeypatch.setattr(mg, "SPLIT_ROWS", 1 << 30)  # no split
            ref = mg.mma_gemv(x[:m], words, sb, xs=xs)
            monkeypatch.setattr(mg, "SPLIT_ROWS", split)
            monkeypatch.setattr(mg, "split_maxnreg", lambda: cap)
            assert mg.split_rows(4096, m) == split
            got = mg.mma_gemv(x[:m], words, sb, xs=xs, out=kc.poisoned((m, 2048), torch.bfloat16, dev))
            assert torch.equal(got, ref), f"split {split} cap {cap}, {m} rows, own sums {xs is None}"
