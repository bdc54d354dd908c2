"""Triton kernels on CUDA at the Qwen3.6-35B-A3B shapes: each against its fp64 reference (kernel_cases), and
batch invariance bit for bit (a row computed alone == the same row among 1, 3, 15 and 63 others)."""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl

from deltaserve.kernels.triton_pdl import pdl_open, pdl_wait

import attn_fused_cases as ac
import kernel_cases as kc

pytestmark = pytest.mark.gpu
OTHERS = (1, 3, 15, 63)  # companions of the row under test


@pytest.fixture(scope="module")
def mods(dev):
    return {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("affine", "quant.triton_affine"), ("moe", "moe.triton_decode"), ("gdn", "gated_delta.triton_decode"),
        ("attn", "attention.triton_paged"), ("norm", "triton_norm"), ("qkprep", "attention.triton_qk_prep"),
        ("embed", "quant.triton_embed"), ("greedy", "triton_greedy"))}


# ------------------------------------------------------------------------------------------ against references


@pytest.mark.parametrize("b", [1, 5, 64])
def test_greedy_advance(mods, dev, small, b):
    kc.check_greedy_advance(mods, dev, max(b, 4), 3000 if small else 248320)


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 64), (2, 32)])
def test_affine_embed(mods, dev, small, bits, group):
    v, h = (300, 256) if small else (248320, 2048)
    kc.check_affine_embed(mods, dev, bits, group, v=v, h=h, t=70)


@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)])
def test_affine_matmul(mods, dev, small, bits, group):
    n, k = (40, 256) if small else (1000, 2048)
    for m in (1, 16, 64, 300):
        kc.check_affine(mods, dev, bits, group, m=m, n=n, k=k)


def test_expert_tiles(mods, dev):
    kc.check_expert_tiles(mods, dev, cases=((1, 4, 16), (37, 5, 16), (300, 8, 32), (130, 256, 16), (576, 257, 8),
                                            (1024, 257, 8), (1025, 64, 8), (4096, 256, 32), (4608, 257, 8),
                                            (9000, 257, 16), (32768, 256, 64), (36864, 257, 16)))


def test_affine_matmul_experts(mods, dev, small):
    e, n, k, m = (5, 24, 128, 37) if small else (32, 512, 2048, 100)
    kc.check_affine_experts(mods, dev, 4, 64, m=m, n=n, k=k, e=e, repeat=8)
    kc.check_affine_experts(mods, dev, 16, 64, m=m, n=n, k=k, e=e, repeat=2)


@pytest.mark.parametrize("t", [1, 4])
def test_moe_decode_q4(mods, dev, small, t):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 256, 512, 8)
    kc.check_moe(mods, dev, t=t, h=h, e=e, i=i, i_s=i, top_k=top_k, bits=4, group=64)


def test_moe_decode_bf16(mods, dev, small):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 64, 512, 8)
    kc.check_moe(mods, dev, t=3, h=h, e=e, i=i, i_s=i, top_k=top_k, bits=16, group=64, router_bits=16)


def test_moe_router_ties(mods, dev):
    kc.check_moe_ties(mods, dev)


def test_moe_router_rows(mods, dev, small):
    if small:
        kc.check_router_rows(mods, dev)
    else:  # the 35B-A3B's router: 256 experts of H 2048 at 8 bits g64, pp512's token count
        kc.check_router_rows(mods, dev, ts=(1, 64, 512, 515), h=2048, e=256, group=64, blocks=(1, 8),
                             gluon_shapes=("4,16", "8,16", "8,8", "4,8", "16,4", "1,1"))


def test_moe_router_mma(mods, dev, small):
    if small:
        kc.check_router_mma(mods, dev)
        kc.check_router_mma(mods, dev, ts=(1, 65), h=64, e=24, bits=4, group=32)
    else:  # the 35B-A3B's router at a decode row, a short chunk, pp512 and 8 prompts' worth of tokens
        kc.check_router_mma(mods, dev, ts=(1, 57, 512), h=2048, e=256, bits=8, group=64)
        kc.check_router_mma(mods, dev, ts=(1, 4096), h=2048, e=256, bits=8, group=64)


def test_moe_route_prefill_on_the_mma_router(mods, dev):
    """moe_route(prefill=True) at the 35B router: the logits of triton_router_mma at every chunk size (T = 1, 3,
    64 with the tiles asked for, 515), the routing of those logits by the split top-k (ids, weights, tiles ==
    the top-k and tiles of the same logits through the decode path's launches), and prefill=False unchanged."""
    kc.check_route_prefill_mma(mods, dev)


def test_moe_route_tiles(mods, dev, small):
    if small:
        kc.check_route_tiles(mods, dev, ts=(1, 31, 33, 64))
    else:  # the 35B-A3B's router and its 257 stacked experts: a 64-stream step, and a 57-token prefill chunk
        kc.check_route_tiles(mods, dev, ts=(1, 57, 64), h=2048, e=256, top_k=8, rows=(8, 16), group=64)


def test_moe_router_norm(mods, dev, small):
    if small:
        kc.check_router_norm(mods, dev)
    else:  # the 35B-A3B's router, shared gate and 257 stacked experts' shared slot, at 1 / 2 / 8 / 16 streams
        kc.check_router_norm(mods, dev, ts=(1, 2, 8, 16), h=2048, e=256, top_k=8, group=64)


def test_causal_conv(mods, dev, small):
    c = 48 if small else 8192
    kc.check_conv(mods, dev, c=c, kw=4, seqs=[1, 5, 40, 2, 17] if small else [1, 5, 300, 2, 64],
                  ctx=[0, 9, 0, 1, 100])


def test_causal_conv_chunks(mods, dev, small):
    c = 48 if small else 8192
    for taps_major in (False, True):
        kc.check_conv_chunks(mods, dev, c, 4, 300, (1, 17, 40, 131, 299), taps_major=taps_major)


def test_causal_conv_sections(mods, dev, small):
    s1, s3 = (16, 40) if small else (2048, 4096)
    kc.check_conv_sections(mods, dev, s1, s1, s3, 4, seqs=[1, 5, 300, 2, 64], ctx=[0, 9, 0, 1, 100])


def test_gdn_initial_states(mods, dev, small):
    kc.check_initial_states(mods, dev) if small else kc.check_initial_states(mods, dev, hv=32, dk=128, dv=128,
                                                                             num_slots=9, ctx=(0, 512, 7, 0))


@pytest.mark.parametrize("dv_block", ["default", 64, None])  # 64: a throughput deployment's (step_dv_block)
def test_gdn_decode_step(mods, dev, small, dv_block):
    dims = (2, 4, 16, 32) if small else (16, 32, 128, 128)
    kc.check_gdn_decode(mods, dev, 5, *dims, fresh_rows=(0, 3), num_slots=9, dv_block=dv_block)


@pytest.mark.parametrize("dv_block,bits", [("default", 4), (None, 4), ("default", 8)])
def test_gdn_decode_prep(mods, dev, small, dv_block, bits):
    dims = (2, 4, 16, 64) if small else (16, 32, 128, 128)
    kc.check_gdn_prep(mods, dev, 5, *dims, dv_block=dv_block, bits=bits)


@pytest.mark.parametrize("bsz", [1, 8, 64])
def test_gdn_step_register_cap_same_bits(mods, dev, small, bsz):
    dims = (2, 4, 16, 128) if small else (16, 32, 128, 128)
    kc.check_gdn_step_maxnreg(mods, dev, bsz, *dims, bv=64, cap=128)


def test_gdn_decode_split_vs_whole(mods, dev, small):
    dims = (2, 4, 16, 32) if small else (16, 32, 128, 128)
    kc.check_gdn_split_vs_whole(mods, dev, 3, *dims, blocks=(8, 16) if small else (16, 32, 64))


def test_paged_attention(mods, dev, small):
    if small:
        kc.check_attention(mods, dev, ctx=[0, 13, 5, 150], seqs=[7, 3, 1, 20], hq=4, hkv=2, d=32, bs=8)
    else:
        kc.check_attention(mods, dev, ctx=[0, 300, 1000, 17], seqs=[50, 1, 130, 64], hq=16, hkv=2, d=256, bs=16)


def test_norms(mods, dev, small):
    kc.check_norms(mods, dev, rows=7, n=96 if small else 2048, dv=32 if small else 128)


def _prefill_problem(dev, seqs, ctx, hk, hv, d, num_slots):
    t = sum(seqs)
    return dict(
        q=torch.randn(t, hk, d, device=dev).bfloat16(), k=torch.randn(t, hk, d, device=dev).bfloat16(),
        v=torch.randn(t, hv, d, device=dev).bfloat16(),
        g=-torch.rand(t, hv, device=dev) * 0.5, beta=torch.rand(t, hv, device=dev),
        ssm=torch.randn(num_slots, hv, d, d, device=dev) * 0.1,
    )


def _run_prefill(gd, p, seqs, ctx, slots, dev):
    cu = torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), device=dev, dtype=torch.int64)
    return gd.gdn_prefill(p["q"], p["k"], p["v"], p["g"], p["beta"], cu, p["ssm"], slots,
                          torch.tensor(ctx, device=dev), p["q"].shape[-1] ** -0.5, cu_seqlens_cpu=cu.cpu())


def test_gdn_prefill_fla(mods, dev):
    if dev != "cuda":
        pytest.skip("fla-core's chunked kernel runs on CUDA only")
    pytest.importorskip("fla", reason="fla-core wheel not installed (wheels.txt)")
    from deltaserve.kernels.gated_delta import reference as ref

    seqs, ctx, hk, hv, d = [100, 1, 64, 257], [0, 5, 0, 30], 4, 8, 128
    p = _prefill_problem(dev, seqs, ctx, hk, hv, d, 6)
    slots = torch.tensor([4, 0, 2, 5], device=dev)
    p["ssm"][2] = float("nan")  # fresh sequence 2 must not read its slot
    ssm0 = p["ssm"].clone()
    o = _run_prefill(mods["gdn"], p, seqs, ctx, slots, dev)
    start = 0
    for b, n in enumerate(seqs):
        sl = slice(start, start + n)
        q, k = ref.l2norm(p["q"][sl].double()), ref.l2norm(p["k"][sl].double())
        st = None if ctx[b] == 0 else ssm0[slots[b]].double()
        ro, rs = ref.gated_delta_chunked(q, k, p["v"][sl].double(), p["g"][sl].double(), p["beta"][sl].double(),
                                         st, d**-0.5)
        kc.close(o[sl], ro, 8 * kc.BF16_EPS, f"fla prefill output seq {b}")
        kc.close(p["ssm"][slots[b]], rs, 8 * kc.BF16_EPS, f"fla prefill state seq {b}")
        start += n


# ------------------------------------------------------------------------------------------ batch invariance


def test_affine_batch_invariance(mods, dev, small):
    n, k = (40, 256) if small else (2048, 2048)
    packed, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
    wd = torch.randn(n, k, device=dev).bfloat16()
    x = torch.randn(300, k, device=dev).bfloat16()
    ta = mods["affine"]
    alone = ta.affine_matmul(x[:1], packed, s, b, 4, 64)
    alone_d = ta.dense_matmul(x[:1], wd)
    for others in (*OTHERS, 299):
        assert torch.equal(ta.affine_matmul(x[: others + 1], packed, s, b, 4, 64)[:1], alone), f"q4 +{others}"
        assert torch.equal(ta.dense_matmul(x[: others + 1], wd)[:1], alone_d), f"bf16 +{others}"


def test_affine_wide_rows_independent_of_tile_position_and_equal_to_16_row_kernel(mods, dev, small):
    """The wide kernel (prefill, dense weights): every row of a 300-row call equals the same row computed at another
    position of its 128-row tile (the call shifted by 37 rows), and equals the 16-row mma.sync kernel's bits and the
    wide kernel's with the operands swapped or not."""
    ta = mods["affine"]
    for n, k in ((200, 256), (72, 512)) if small else ((9216, 2048), (2048, 4096), (1024, 2048)):
        packed, s, b, _ = kc.affine_weight((n, k), 4, 64, dev)
        x = torch.randn(300, k, device=dev).bfloat16()
        whole = ta.affine_matmul(x, packed, s, b, 4, 64)
        assert torch.equal(ta.affine_matmul(x[37:], packed, s, b, 4, 64), whole[37:]), f"{n}x{k} shifted"
        assert torch.equal(ta.affine_matmul(x, packed, s, b, 4, 64, config=(64, 128, 4, 3)), whole), f"{n}x{k} m16"
        for cfg in ((128, 64, 128, 4, 3, True), (128, 64, 128, 8, 3, False)):  # swapped operands and not
            assert torch.equal(ta.affine_matmul(x, packed, s, b, 4, 64, config=cfg), whole), f"{n}x{k} {cfg}"


@pytest.mark.parametrize("bits,group,dense", [(4, 64, False), (8, 64, False), (16, 1, True)])
def test_dense_dequant_path_equals_wide_kernel(mods, dev, small, bits, group, dense):
    """The dense prefill projections' dequant route (triton_affine.dense_path) against the wide kernel, bit for bit,
    at the 35B-A3B's shapes for every tile the library picks (by M; TMA) and a few others (TMA and cp.async), at row
    counts on both sides of launch_table "affine.dequant_min_rows" and of the 2048-row tile switch."""
    shapes = ((200, 256), (72, 512)) if small else ((12352, 2048), (9216, 2048), (2048, 4096))
    configs = ((128, 64, 64, 4, 4, True), (256, 128, 64, 8, 4, True), (128, 64, 64, 4, 4), (256, 128, 64, 8, 3),
               (128, 128, 64, 8, 4), (64, 128, 64, 4, 4), (128, 128, 128, 8, 3, True))
    for n, k in shapes if bits == 4 else shapes[:1]:
        kc.check_dense_dequant(mods, dev, bits, group, n, k, (1, 255, 256, 515, 2048, 4100), configs, dense=dense)


def test_affine_experts_batch_invariance(mods, dev, small):
    e, n, k = (4, 24, 128) if small else (16, 512, 2048)
    packed, s, b, _ = kc.affine_weight((e, n, k), 4, 64, dev)
    x = torch.randn(64, k, device=dev).bfloat16()
    ids = torch.randint(0, e, (64,), device=dev)
    ta = mods["affine"]
    alone = ta.affine_matmul_experts(x[:1], packed, s, b, ids[:1], 4, 64)
    for others in OTHERS:
        got = ta.affine_matmul_experts(x[: others + 1], packed, s, b, ids[: others + 1], 4, 64)
        assert torch.equal(got[:1], alone), f"+{others}"


def test_moe_decode_batch_invariance(mods, dev, small):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 256, 512, 8)
    x, kw, _ = kc.moe_problem(dev, 64, h, e, i, i, 4, 64)
    res = kw.pop("residual")
    md = mods["moe"]
    alone = md.moe_decode(x[:1], top_k=top_k, residual=res[:1], **kw)
    for others in OTHERS:
        got = md.moe_decode(x[: others + 1], top_k=top_k, residual=res[: others + 1], **kw)
        assert torch.equal(got[:1], alone), f"+{others}"


@pytest.mark.parametrize("dv_block", [32, 64])  # the batch-1 and the throughput deployments' (step_dv_block)
def test_gdn_decode_batch_invariance(mods, dev, small, dv_block):
    hk, hv, dk, dv = (2, 4, 16, 32) if small else (16, 32, 128, 128)
    inp = kc.gdn_inputs(dev, 64, hk, hv, dk, dv, 64)
    c = inp["qkv"].shape[1]
    conv_w = torch.randn(c, 4, device=dev).bfloat16()
    conv0 = torch.randn(64, c, 3, device=dev).bfloat16()
    ssm0 = inp["ssm"].clone()
    slots = torch.randperm(64, device=dev)
    ctx = torch.full((64,), 7, device=dev)
    gd = mods["gdn"]

    def step(bsz):
        conv, ssm = conv0.clone(), ssm0.clone()
        cu = torch.arange(bsz + 1, device=dev, dtype=torch.int32)
        xc = gd.causal_conv(inp["qkv"][:bsz], conv_w, conv, cu, slots[:bsz], ctx[:bsz], 1)
        o = gd.gdn_decode_step(xc, inp["z"][:bsz], inp["a"][:bsz], inp["b"][:bsz], inp["a_log"], inp["dt_bias"],
                               inp["norm_w"], ssm, slots[:bsz], ctx[:bsz], hk, 1e-6, dv_block=dv_block)
        return o[:1], conv[slots[0]], ssm[slots[0]]

    alone = step(1)
    for others in OTHERS:
        for a, b_ in zip(step(others + 1), alone):
            assert torch.equal(a, b_), f"+{others}"


def test_paged_attention_batch_invariance(mods, dev, small):
    hq, hkv, d, bs = (4, 2, 32, 8) if small else (16, 2, 256, 16)
    ctx = torch.randint(0, 60 if small else 3000, (64,)).tolist()
    ctx[0] = 40 if small else 2500
    p = kc.paged_problem(dev, ctx, [1] * 64, hq, hkv, d, bs)
    tp = mods["attn"]
    lens = torch.tensor([c + 1 for c in ctx], device=dev, dtype=torch.int32)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    q, scale = p["q"], d**-0.5
    alone = tp.paged_decode_attention(q[:1], p["kc"], p["vc"], p["tables"][:1], lens[:1], scale, int(lens[0]))
    for others in OTHERS:
        n = others + 1
        got = tp.paged_decode_attention(q[:n], p["kc"], p["vc"], p["tables"][:n], lens[:n], scale,
                                        int(lens[:n].max()))
        assert torch.equal(got[:1], alone), f"decode +{others}"
    # prefill: sequence 0's tokens alone == among other sequences
    seqs, pctx = [37, 5, 80, 1], [20, 0, 300, 9]
    p = kc.paged_problem(dev, pctx, seqs, hq, hkv, d, bs)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    ctx_t = torch.tensor(pctx, device=dev)
    alone = tp.paged_prefill_attention(p["q"][:37], p["kc"], p["vc"], p["tables"][:1], p["cu"][:2], ctx_t[:1],
                                       scale, 37)
    both = tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"], ctx_t, scale, max(seqs))
    assert torch.equal(both[:37], alone), "prefill"


def test_gdn_prefill_batch_invariance(mods, dev):
    if dev != "cuda":
        pytest.skip("fla-core's chunked kernel runs on CUDA only")
    pytest.importorskip("fla", reason="fla-core wheel not installed (wheels.txt)")
    seqs, ctx = [130, 7, 64, 300], [9, 0, 3, 0]
    p = _prefill_problem(dev, seqs, ctx, 4, 8, 128, 6)
    ssm0 = p["ssm"].clone()
    slots = torch.tensor([1, 3, 0, 5], device=dev)
    both = _run_prefill(mods["gdn"], p, seqs, ctx, slots, dev)[:130].clone()
    state_both = p["ssm"][1].clone()
    p["ssm"] = ssm0.clone()
    one = {k: v[:130] if k not in ("ssm",) else v for k, v in p.items()}
    alone = _run_prefill(mods["gdn"], one, seqs[:1], ctx[:1], slots[:1], dev)
    assert torch.equal(both, alone), "fla prefill output depends on the other sequences"
    assert torch.equal(p["ssm"][1], state_both), "fla prefill state depends on the other sequences"


# ------------------------------------------------------------------------------------------ fused attention decode
# flagship: Hq 16, Hkv 2, head_dim 256, rotary 64 (partial 0.25), interleaved mRoPE sections (11, 11, 10)


def _attn_dims(small):
    return dict(hq=4, hkv=2, d=32, rd=16) if small else dict(hq=16, hkv=2, d=256, rd=64)


@pytest.mark.parametrize("kind", ["text", "mrope3", "mrope_text"])
def test_qk_norm_rope_write(mods, dev, small, kind):
    for t in (1, 7, 64):
        ac.check_qk_prep(mods, dev, t, kind=kind, **_attn_dims(small))
    ac.check_qk_prep(mods, dev, 5, kind=kind, offset=0.0, **_attn_dims(small))
    ac.check_qk_prep(mods, dev, 7, kind=kind, table=True, **_attn_dims(small))


def test_qk_norm_rope_write_text_mrope(mods, dev, small):
    ac.check_qk_prep_mrope_text(mods, dev, 9, **_attn_dims(small))
    ac.check_qk_prep_errors(mods, dev)


def test_qk_norm_rope_write_batch_invariance(mods, dev, small):
    ac.check_qk_prep_invariance(mods, dev, OTHERS, **_attn_dims(small))


def test_decode_attention_gate(mods, dev, small):
    dims = (4, 2, 32, 8) if small else (16, 2, 256, 16)
    split = mods["attn"].split_tokens()
    ac.check_decode_gate(mods, dev, [1, 100, split, split + 1, 3 * split + 7, 2000], *dims, split)
    ac.check_decode_gate(mods, dev, [1, 17, split - 1, split], *dims, split)  # every row single-split
    if not small:  # 32k tokens: 256 splits, 8 merge steps of the default merge
        ac.check_decode_gate(mods, dev, [32768, 1, 4 * split + 5, 20000], *dims, split)
    ac.check_decode_merge_steps(mods, dev, [1, 9 * split + 3, 2 * split, 5 * split + 1], *dims, split, 2,
                                16 if small else 64)


def test_decode_attention_merge_prep(mods, dev, small):
    """The merge writing the out projection's GEMV prep: output and (xp, xs) == the plain launch then prep_x, bit
    for bit, poisoned buffers, single-split and merged rows (32K at the 35B shapes), both merge shapes in use."""
    dims = (4, 2, 32, 8) if small else (16, 2, 256, 16)
    split = mods["attn"].split_tokens()
    fmts = [(4, 32), (8, 16)] if small else [(4, 64), (8, 64), (4, 128)]
    lens = [1, 100, split, split + 1, 3 * split + 7, 2000] + ([] if small else [32768])
    ac.check_decode_merge_prep(mods, dev, lens, *dims, split, fmts,
                               merges=(None, mods["attn"].merge_shape(throughput=True)))


def test_decode_attention_long_split(mods, dev, small):
    """Long rows' splits (DELTASERVE_ATTN_LONG_SPLIT): short rows keep their bits, every row meets fp64, the settled
    form and the merge's prep give the plain launch's bits, batch invariance, fp8 caches, refusals."""
    dims = (4, 2, 32, 8) if small else (16, 2, 256, 64)
    split = mods["attn"].split_tokens()
    lens = [split + 5, 8192, 8193, 20000, 1] + ([] if small else [32768])
    longs = ((2 * split, 2), (split, 4)) if small else ((8192, 2), (8192, 8), (split, 2))
    ac.check_decode_long_split(mods, dev, [n if not small else min(n, 900) for n in lens], *dims, split, longs)


def test_decode_attention_strided(mods, dev, small):
    dims = (4, 2, 32, 8) if small else (16, 2, 256, 16)
    split = mods["attn"].split_tokens()
    ac.check_decode_strided(mods, dev, [1, 60, split, split + 1, 3 * split + 7, 2000, 32768 if not small else 900],
                            *dims, split, targets=(1, 3, 264))


@triton.jit
def _late_row_writer(src_ptr, dst_ptr, rows_ptr, spins, ROW: tl.constexpr, PDL: tl.constexpr):
    """Row r of src into row rows[r] of dst after a spin of `spins` dependent steps, in a launch that lets the next
    one start at once (pdl_open first): a writer the next kernel's prologue overlaps."""
    pdl_open(PDL)
    pdl_wait(PDL)
    r = tl.program_id(0)
    x = tl.load(src_ptr + r * ROW + tl.arange(0, ROW)).to(tl.float32)
    t = tl.sum(x, axis=0) * 0.0 + 1.0
    for _ in range(spins):
        t = t * 0.9999999 + 1e-7
    dst = tl.load(rows_ptr + r).to(tl.int64)
    tl.store(dst_ptr + dst * ROW + tl.arange(0, ROW), (x + (t - t)).to(dst_ptr.dtype.element_ty))  # x, after t


@pytest.mark.parametrize("long_split", ["off", "64x2"])
def test_decode_attention_settled_reads_the_newest_token_after_its_wait(mods, dev, small, monkeypatch, long_split):
    """Under PDL the settled split programs request a row's older K/V while the kernels before them still run. Here
    those kernels write each row's newest K and V and q after a long spin (~100 us), opening the next launch at once:
    the decode must see them (they are read after its wait) and equals the plain decode over the written cache and
    q, bit for bit, into a poisoned output. Also with long rows' splits (rows of 71 and 301 tokens in 128-token
    splits, whose programs wait before any read)."""
    from deltaserve.kernels.triton_pdl import pdl_args, pdl_enabled

    tp = mods["attn"]
    assert pdl_enabled(torch.empty(1, device=dev)), "this test needs PDL (sm_90, DELTASERVE_PDL unset)"
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", long_split)
    hq, hkv, d, bs = (4, 2, 32, 8) if small else (16, 2, 256, 16)
    ctx, seqs = [0, 70, 5, 300], [1, 1, 1, 1]
    p = kc.paged_problem(dev, ctx, seqs, hq, hkv, d, bs)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    lens = torch.tensor([c + 1 for c in ctx], device=dev, dtype=torch.int32)
    new_k, new_v = torch.randn_like(p["k"]), torch.randn_like(p["v"])
    new_q = torch.randn_like(p["q"])
    kc_w, vc_w = p["kc"].clone(), p["vc"].clone()
    tp.write_kv(kc_w, vc_w, p["slots"], new_k, new_v)
    want = tp.paged_decode_attention(new_q, kc_w, vc_w, p["tables"], lens, d**-0.5, int(lens.max()))
    q = p["q"].clone()
    slots, rows = p["slots"].to(torch.int32), torch.arange(len(seqs), device=dev, dtype=torch.int32)
    got = kc.poisoned(q.shape, q.dtype, dev)
    torch.cuda.synchronize()
    # nothing but the writers and the decode between here and the sync: no torch launch that would serialise them
    for src, dst, at in ((new_k, p["kc"], slots), (new_v, p["vc"], slots), (new_q, q, rows)):
        _late_row_writer[(len(seqs),)](src, dst, at, 100_000, ROW=src[0].numel(), **pdl_args(q))
    tp.paged_decode_attention(q, p["kc"], p["vc"], p["tables"], lens, d**-0.5, int(lens.max()), out=got,
                              settled=True)
    torch.cuda.synchronize()
    assert torch.equal(p["kc"], kc_w) and torch.equal(q, new_q), "the writers did not write"
    assert torch.equal(got, want), "the settled decode read a row's newest K/V or q before its wait"


def test_decode_attention_gate_batch_invariance(mods, dev, small):
    dims = (4, 2, 32, 8) if small else (16, 2, 256, 16)
    lens = torch.randint(1, 600 if small else 5000, (64,)).tolist()
    for first in (40, 129, 2500):  # row 0 single-split and merged
        ac.check_decode_gate_invariance(mods, dev, [first] + lens[1:], OTHERS, *dims)


def test_attention_decode_fused_vs_unfused(mods, dev, small):
    dims = (4, 2, 32, 16, 8) if small else (16, 2, 256, 64, 16)
    ac.check_attention_decode_fused(mods, dev, [1, 40, 128, 129, 700, 4000], *dims)
