"""Decode GEMV (`kernels/quant/triton_gemv.py`) and parallel MoE decode (`kernels/moe/triton_moe_gemv.py`) on
CUDA at the 35B-A3B shapes: fp64 references, NaN-poisoned outputs, bit-for-bit batch invariance. The check_*
functions are shared with the interpreter test (tests/test_triton_gemv_interpret.py), which runs them at toy sizes.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import kernel_cases as kc

pytestmark = pytest.mark.gpu


# ------------------------------------------------------------------------------------------ checks (shared)


def _weight(n, k, bits, group, device):
    if bits == 16:
        w = torch.randn(n, k, device=device).bfloat16()
        return (w, None, None), w.double()
    p, s, b, wd = kc.affine_weight((n, k), bits, group, device)
    return (p, s, b), wd


def check_gemv(mods, device, bits, group, m, n, k):
    (p, s, b), wd = _weight(n, k, bits, group, device)
    x = torch.randn(m, k, device=device).bfloat16()
    out = kc.poisoned((m, n), torch.bfloat16, device)
    y = mods["gemv"].affine_gemv(x, p, s, b, bits, group, out=out)
    assert y.data_ptr() == out.data_ptr(), "affine_gemv did not write into out"
    ref = x.double() @ wd.t()
    # fp32 accumulation of exact products (w is never rounded), one rounding to bf16: 1/2 ulp (+ fp32 noise)
    kc.close(y, ref, 2 * kc.BF16_EPS, f"gemv bits={bits} g={group} M={m} N={n} K={k}")
    # row-wise too: small rows must not hide behind the largest one
    rowscale = ref.abs().amax(1, keepdim=True).clamp_min(1e-3)
    err = ((y.double() - ref).abs() / rowscale).max().item()
    assert err <= 2 * kc.BF16_EPS * kc.SLACK, f"gemv bits={bits} g={group} M={m}: row-relative error {err:.3g}"


def check_gemv_invariance(mods, device, n, k, others=(1, 3, 15)):
    """Row r alone == row r among others, bit for bit; r = 0 and the last row (a different row block)."""
    g = mods["gemv"]
    x = torch.randn(16, k, device=device).bfloat16()
    for bits, group in ((4, 64), (8, 32), (16, 64)):
        (p, s, b), _ = _weight(n, k, bits, group, device)
        alone = g.affine_gemv(x[:1], p, s, b, bits, group)
        for o in others:
            got = g.affine_gemv(x[: o + 1], p, s, b, bits, group)
            assert torch.equal(got[:1], alone), f"bits {bits}: row 0 alone != among {o} others"
            last = g.affine_gemv(x[o : o + 1], p, s, b, bits, group)
            assert torch.equal(got[o : o + 1], last), f"bits {bits}: row {o} alone != among {o} others"


def check_gemv_row_pair(mods, device, n, k):
    """gemv_row_pair (the MoE gate/up's two weights, loads issued together) gives each weight exactly the bits of
    a gemv_row call, and is close to the fp64 product."""
    from pair_kernel import pair_and_singles

    for bits, group in ((4, 64), (8, 32)):
        first, wd1 = _weight(n, k, bits, group, device)
        second, wd2 = _weight(n, k, bits, group, device)
        x = torch.randn(k, device=device).bfloat16()
        p1, p2, one1, one2 = pair_and_singles(x, first, second, bits, group)
        assert torch.equal(p1, one1) and torch.equal(p2, one2), f"bits {bits}: pair != two gemv_row calls"
        kc.close(p2, wd2 @ x.double(), 2 * kc.BF16_EPS * kc.SLACK, f"gemv_row_pair bits={bits}")


def check_norm_prep(mods, device, n, k):
    """The RMSNorm that also writes its GEMV's prep (triton_norm.rms_norm(prep=), used by model/fast.norm_for_gemv):
    its output equals the plain norm's, its (xp, xs) equal prep_x of that output, and the GEMV reading them equals
    the GEMV with its own prep launch, all bit for bit, for every row count of the decode (the prep is per row)."""
    from deltaserve.kernels import triton_norm as tn

    g = mods["gemv"]
    for bits, group in ((4, 64), (8, 32)):
        (p, s, b), _ = _weight(n, k, bits, group, device)
        nw = torch.randn(k, device=device)
        for m in (1, 3, 16):
            x = (4 * torch.randn(m, k, device=device)).bfloat16()
            y, (xp, xs) = tn.rms_norm(x, nw, 1e-6, 1.0, prep=(bits, group))
            assert torch.equal(y, tn.rms_norm(x, nw, 1e-6, 1.0)), f"bits {bits} M={m}: prepped norm != norm"
            xp0, xs0 = g.prep_x(y, bits, group)
            assert torch.equal(xp, xp0) and torch.equal(xs, xs0), f"bits {bits} M={m}: norm's prep != prep_x"
            out = kc.poisoned((m, n), torch.bfloat16, device)
            got = g.affine_gemv(y, p, s, b, bits, group, out=out, prep=(xp, xs))
            assert torch.equal(got, g.affine_gemv(y, p, s, b, bits, group)), f"bits {bits} M={m}: prep= != own"
            # the residual-add form (the MoE input's norm, model/fast.moe_prep): the same three equalities
            res = torch.randn(m, k, device=device).bfloat16()
            y2, r2, (xp2, xs2) = tn.add_rms_norm(x, res, nw, 1e-6, 1.0, prep=(bits, group))
            y1, r1 = tn.add_rms_norm(x, res, nw, 1e-6, 1.0)
            assert torch.equal(y2, y1) and torch.equal(r2, r1), f"bits {bits} M={m}: prepped add-norm != add-norm"
            xp1, xs1 = g.prep_x(y1, bits, group)
            assert torch.equal(xp2, xp1) and torch.equal(xs2, xs1), f"bits {bits} M={m}: add-norm's prep != prep_x"
    with pytest.raises(ValueError, match="xs must be contiguous fp32"):
        g.affine_gemv(y, p, s, b, bits, group, prep=(xp, xs[:, :1]))


def check_gemv_vs_matmul(mods, device, n, k):
    """The new GEMV and the old affine_matmul agree to bf16 rounding (the old one rounds w to bf16 first)."""
    for bits, group in ((4, 64), (8, 128)):
        (p, s, b), wd = _weight(n, k, bits, group, device)
        x = torch.randn(4, k, device=device).bfloat16()
        new = mods["gemv"].affine_gemv(x, p, s, b, bits, group).double()
        old = mods["affine"].affine_matmul(x, p, s, b, bits, group).double()
        kc.close(new, old, 4 * kc.BF16_EPS, f"gemv vs affine_matmul bits={bits}")


def check_gemv_errors(mods, device):
    g = mods["gemv"]
    (p, s, b), _ = _weight(16, 64, 4, 32, device)
    x = torch.zeros(1, 64, device=device).bfloat16()
    for args, msg in (((x, p, s[:, :1], b, 4, 32), "scales shape"), ((x, p, s, b, 2, 32), "bits 2"),
                      ((x[:, :32], p, s, b, 4, 32), "input has 32 features"),
                      ((torch.zeros(17, 64, device=device).bfloat16(), p, s, b, 4, 32), "17 rows"),
                      ((x.float(), p, s, b, 4, 32), "bf16 or fp16")):
        try:
            g.affine_gemv(*args)
        except ValueError as exc:
            assert msg in str(exc), f"{msg!r} not in {exc}"
        else:
            raise AssertionError(f"no error for {msg}")


def check_moe_v2(mods, device, t, h, e, i, top_k, bits, group, normalize=True, i_s=None, inline_prep=True):
    """moe_decode_v2 against the fp64 reference (routing + block), as kernel_cases.check_moe does for v1, and
    against v1 itself (same rounding points: a few bf16 ulps apart at most). i_s: the shared expert's
    intermediate size (default i); inline_prep=False: the prep launches of x and of the SwiGLU rows."""
    x, kw, ref = kc.moe_problem(device, t, h, e, i, i if i_s is None else i_s, bits, group,
                                router_bits=8 if bits != 16 else 16)
    out = kc.poisoned((t, h), torch.bfloat16, device)
    y, routing = mods["moe2"].moe_decode_v2(x, top_k=top_k, normalize=normalize, return_routing=True, out=out,
                                            inline_prep=inline_prep, **kw)
    assert y.data_ptr() == out.data_ptr(), "moe_decode_v2 did not write into out"
    want, ids, w = kc.moe_reference(x, ref, top_k, normalize)
    order = ids.sort(-1)
    assert torch.equal(routing.ids.long().cpu(), order.values.cpu()), "MoE v2 routing picked other experts"
    kc.close(routing.weights, w.gather(1, order.indices).double(), 1e-5, "MoE v2 routing weights")
    kc.close(y, want, 8 * kc.BF16_EPS, f"MoE v2 T={t} bits={bits}")
    old = mods["moe"].moe_decode(x, top_k=top_k, normalize=normalize, **kw)
    kc.close(y, old.double(), 8 * kc.BF16_EPS, f"MoE v2 vs v1 T={t} bits={bits}")


def check_moe_v2_invariance(mods, device, h, e, i, top_k, others=(1, 3, 15)):
    x, kw, _ = kc.moe_problem(device, 16, h, e, i, i, 4, 64 if h % 64 == 0 and i % 64 == 0 else 32)
    res = kw.pop("residual")
    md = mods["moe2"]
    alone = md.moe_decode_v2(x[:1], top_k=top_k, residual=res[:1], **kw)
    for o in others:
        got = md.moe_decode_v2(x[: o + 1], top_k=top_k, residual=res[: o + 1], **kw)
        assert torch.equal(got[:1], alone), f"MoE v2: token 0 alone != among {o} others"
        last = md.moe_decode_v2(x[o : o + 1], top_k=top_k, residual=res[o : o + 1], **kw)
        assert torch.equal(got[o : o + 1], last), f"MoE v2: token {o} alone != among {o} others"


# ------------------------------------------------------------------------------------------ CUDA tests


@pytest.fixture(scope="module")
def mods(dev):
    return {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("gemv", "quant.triton_gemv"), ("affine", "quant.triton_affine"), ("moe", "moe.triton_decode"),
        ("moe2", "moe.triton_moe_gemv"))}


@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128), (16, 64)])
def test_gemv(mods, dev, small, bits, group):
    # every format at a ragged N; the 35B-A3B q4g64 shapes in full (each (K, rows-per-program) pair compiles once)
    shapes = [(24, 256)] if small else ([(1000, 2048)] if (bits, group) != (4, 64) else
                                        [(8192, 2048), (2048, 4096), (512, 2048), (1000, 2048)])
    for n, k in shapes:
        for m in (1, 8, 16):
            check_gemv(mods, dev, bits, group, m=m, n=n, k=k)


def test_gemv_lm_head_shape(mods, dev, small):
    n = 40 if small else 248320
    check_gemv(mods, dev, 4, 64, m=1, n=n, k=2048 if not small else 128)


def test_gemv_row_pair(mods, dev, small):
    tg_n, tg_k = (12, 512) if small else (512, 2048)  # an expert's gate and up: I = 512 rows each, K = H
    check_gemv_row_pair(mods, dev, tg_n, tg_k)


def test_norm_prep(mods, dev, small):
    check_norm_prep(mods, dev, *((24, 256) if small else (12352, 2048)))


def test_gemv_batch_invariance(mods, dev, small):
    check_gemv_invariance(mods, dev, *((24, 256) if small else (2048, 2048)))


def test_gemv_vs_affine_matmul(mods, dev, small):
    check_gemv_vs_matmul(mods, dev, *((24, 256) if small else (4096, 2048)))


def test_gemv_errors(mods, dev):
    check_gemv_errors(mods, dev)


@pytest.mark.parametrize("t", [1, 8])
def test_moe_v2_q4(mods, dev, small, t):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 256, 512, 8)
    check_moe_v2(mods, dev, t=t, h=h, e=e, i=i, top_k=top_k, bits=4, group=64)


def test_moe_v2_bf16(mods, dev, small):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 64, 512, 8)
    check_moe_v2(mods, dev, t=3, h=h, e=e, i=i, top_k=top_k, bits=16, group=64)


def test_moe_v2_batch_invariance(mods, dev, small):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 256, 512, 8)
    check_moe_v2_invariance(mods, dev, h=h, e=e, i=i, top_k=top_k)


# ------------------------------------------------------------------------------------------ fused decode paths


@pytest.fixture(scope="module")
def fused_mods(mods):
    return {**mods, "gdn": importlib.import_module("deltaserve.kernels.gated_delta.triton_decode")}


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 64)])
def test_gemv_inline_prep(fused_mods, dev, small, bits, group):
    # one launch (x read raw) against fp64 and the prep path; bit-identity of the two is reported, not required
    n, k = (24, 256) if small else (2048, 2048)
    for m in (1, 4, 16):
        same = kc.check_gemv_inline_prep(fused_mods, dev, bits, group, m=m, n=n, k=k)
        print(f"inline prep == prep path, bits={bits} M={m}: {same}")


def test_gemv_inline_unaligned(fused_mods, dev, small):
    kc.check_gemv_inline_unaligned(fused_mods, dev, *((16, 128) if small else (2048, 2048)))


def test_gemv_inline_invariance(fused_mods, dev, small):
    kc.check_gemv_inline_invariance(fused_mods, dev, *((24, 256) if small else (2048, 2048)))


def test_gemv_conv(fused_mods, dev, small):
    # 35B-A3B DeltaNet fused projection: qkv C = 8192 conv channels | z 4096 | b 32 | a 32, K = 2048
    c, extra, k = (40, 24, 128) if small else (8192, 4160, 2048)
    for m in (1, 4):
        kc.check_gemv_conv(fused_mods, dev, 4, 64, m=m, c=c, extra=extra, k=k, fresh=(1,))


def test_gemv_conv_early(fused_mods, dev, small):
    """The one-row conv GEMV, its conv's inputs requested before its PDL wait."""
    c, extra, k = (40, 24, 128) if small else (8192, 4160, 2048)
    kc.check_gemv_conv_early(fused_mods, dev, 4, 64, c=c, extra=extra, k=k, fresh=(1,))
    kc.check_gemv_conv_early(fused_mods, dev, 4, 64, c=c, extra=extra, k=k, fresh=(0,))


def test_gemv_conv_invariance(fused_mods, dev, small):
    kc.check_gemv_conv_invariance(fused_mods, dev, *((16, 8, 128) if small else (8192, 4160, 2048)))


@pytest.mark.parametrize("t,shared", [(1, True), (3, False)])
def test_moe_v2_fused(fused_mods, dev, small, t, shared):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 256, 512, 8)
    same = kc.check_moe_v2_fused(fused_mods, dev, t, h, e, i, top_k, 4, 64, shared=shared)
    print(f"MoE v2 4-launch == prep/top-k launches, T={t}: {same}")


@pytest.mark.parametrize("t,shared", [(1, True), (3, False), (64, True)])
def test_moe_v2_down_early_same_bits(fused_mods, dev, small, t, shared):
    h, e, i, top_k = (64, 8, 64, 3) if small else (2048, 256, 512, 8)
    kc.check_moe_down_early(fused_mods, dev, t, h, e, i, top_k, 4, 64, shared=shared)


def test_router_last_arrival(fused_mods, dev, small):
    kc.check_router_last_arrival(fused_mods, dev, **({} if small else dict(
        ts=(1, 7, 64, 512), h=2048, e=256, top_k=8)))


def test_moe_v2_fused_ties(fused_mods, dev):
    kc.check_moe_v2_fused_ties(fused_mods, dev)


def test_topk_same_bits_any_warps(fused_mods, dev):
    kc.check_topk_same_bits_any_warps(fused_mods, dev)


def test_routing_forms_same_bits(fused_mods, dev):
    kc.check_routing_forms_same_bits(fused_mods, dev)


@pytest.mark.parametrize("warps", [1, 2, 4])
def test_topk_contract(fused_mods, dev, warps):
    for e, k in ((37, 8), (256, 8), (37, 3)):
        kc.check_topk_contract(fused_mods, dev, e, k, warps)
