"""Cases of the fp8 K/V cache (kernels/attention/kv_fp8.py) for the Triton writers and readers (helper module beside
kernel_cases, same conventions; run under the interpreter by tests/test_triton_interpret.py and on CUDA by
tests/gpu/test_kv_fp8_gpu.py).

Writers: the bytes and scales each kernel writes == kv_fp8.quantize_rows of the rows the bf16 cache would hold, bit
for bit (the interpreter; on the GPU within one e4m3 step, since the compiler may contract the bf16 RoPE
differently in two kernels), padding slots and other slots untouched. Readers: decode and prefill attention over an
fp8 cache against fp64 attention over the dequantised cache, NaN-poisoned outputs, and a decode row alone == the
same row among others, bit for bit.
"""

from __future__ import annotations

import torch

import attn_fused_cases as ac
from deltaserve.kernels.attention import reference as attn_ref
from deltaserve.kernels.attention.kv_fp8 import FP8, dequantize_rows, quantize_rows
from kernel_cases import BF16_EPS, INTERPRETED, close, paged_problem, poisoned


def fp8_cache_like(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 cache holding quantize_rows(cache) with its scales (so untouched slots have meaningful bytes)."""
    x8, sc = quantize_rows(cache)
    return x8, sc.contiguous()


def e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance of two fp8 tensors in e4m3 steps (codes mapped onto one ordered line)."""
    def line(x):
        i = x.contiguous().view(torch.uint8).to(torch.int32)
        return torch.where(i >= 128, 128 - i, i)

    return int((line(a) - line(b)).abs().max()) if a.numel() else 0


def check_format(device):
    """quantize_rows: the rounding bound, zero rows, saturation-free maximum, NaN-free codes."""
    x = torch.cat([torch.randn(7, 64, device=device) * 10 ** torch.randn(7, 1, device=device),
                   torch.zeros(1, 64, device=device)]).bfloat16()
    x8, sc = quantize_rows(x)
    assert x8.dtype == FP8 and sc.dtype == torch.float32 and tuple(sc.shape) == (8,)
    assert not torch.isnan(x8.float()).any(), "quantize_rows made a NaN code"
    assert float(sc[-1]) == 1.0 and not x8[-1].float().any(), "a zero row: scale 1, codes 0"
    amax = x.float().abs().amax(-1)[:-1].double()
    assert torch.equal(sc[:-1], (amax / 448).float()), "scale must be amax / 448 correctly rounded (IEEE division)"
    back = dequantize_rows(x8, sc)
    err = (back - x.float()).abs()
    bound = x.float().abs() * 2.0**-4 + sc[:, None] * 2.0**-10
    assert bool((err <= bound * (1 + 1e-6)).all()), f"rounding beyond half an e4m3 step: {(err - bound).max()}"
    assert bool((x8[:-1].float().abs().amax(-1) == 448).all()), "each row's largest value must map to 448"


def check_write_kv(mods, device, ctx, seqs, hq, hkv, d, bs):
    """triton_paged.write_kv into fp8 caches == quantize_rows of the rows, bit for bit; the rest untouched."""
    tp = mods["attn"]
    p = paged_problem(device, ctx, seqs, hq, hkv, d, bs)
    p["slots"][1] = -1  # a padding token writes nothing
    kc, ks = fp8_cache_like(p["kc"])
    vc, vs = fp8_cache_like(p["vc"])
    kc0, vc0, ks0, vs0 = kc.clone(), vc.clone(), ks.clone(), vs.clone()
    tp.write_kv(kc, vc, p["slots"], p["k"], p["v"], ks, vs)
    rk, rv, rks, rvs = kc0.clone(), vc0.clone(), ks0.clone(), vs0.clone()
    live = p["slots"] >= 0
    attn_ref.write_kv(rk, rv, p["slots"][live], p["k"][live], p["v"][live], rks, rvs)
    for got, want, what in ((kc, rk, "k"), (vc, rv, "v")):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"fp8 write_kv: {what} codes differ"
    assert torch.equal(ks, rks) and torch.equal(vs, rvs), "fp8 write_kv: scales differ"
    assert not torch.equal(kc.view(torch.uint8), kc0.view(torch.uint8)), "fp8 write_kv wrote nothing"


def check_qk_prep(mods, device, t, hq, hkv, d, rd):
    """qk_norm_rope_write into fp8 caches == quantize_rows of what it writes into bf16 caches (the same kernel's
    rows), the scales included; q is the same bits; padding and untouched slots keep theirs."""
    p = ac.qk_problem(device, t, hq, hkv, d, rd, "text")
    kc16, vc16 = p["kc"].nan_to_num(), p["vc"].nan_to_num()
    p["kc"], p["vc"] = kc16.clone(), vc16.clone()
    q16 = ac.run_qk_prep(mods, p)
    want_k, want_ks = quantize_rows(p["kc"])
    want_v, want_vs = quantize_rows(p["vc"])
    kc8, ks = fp8_cache_like(kc16)
    vc8, vs = fp8_cache_like(vc16)
    q8 = mods["qkprep"].qk_norm_rope_write(
        p["q"], p["k"], p["v"], p["qw"], p["kw"], ac.EPS, p["offset"], p["pos"], p["invf"], kc8, vc8, p["slots"],
        mrope_section=p["sec"], mrope_interleaved=True, k_scale=ks, v_scale=vs)
    if INTERPRETED:
        assert torch.equal(q8, q16), "fp8 qk prep: q differs from the bf16-cache call"
        assert torch.equal(kc8.view(torch.uint8), want_k.view(torch.uint8)), "fp8 qk prep: k codes differ"
        assert torch.equal(ks, want_ks), "fp8 qk prep: k scales differ"
    else:  # the bf16 RoPE may be contracted differently in the two compiled kernels: one bf16 step, one e4m3 step
        assert int(ac.bf16_ulps(q8, q16).max()) <= 1, "fp8 qk prep: q more than one bf16 step from the bf16 call's"
        assert e4m3_steps(kc8, want_k) <= 1, "fp8 qk prep: k codes more than one e4m3 step from the bf16 row's"
        close(ks, want_ks.double(), 2 * BF16_EPS, "fp8 qk prep: k scales")
    assert torch.equal(vc8.view(torch.uint8), want_v.view(torch.uint8)) and torch.equal(vs, want_vs), \
        "fp8 qk prep: v codes or scales differ"


def fp64_cache(c8, sc):
    """An fp8 cache's meaning in fp64 (e4m3 codes times their row's scale, exactly)."""
    return c8.double() * sc.double()[..., None]


def check_attention(mods, device, ctx, seqs, hq, hkv, d, bs):
    """Prefill and decode attention over an fp8 cache (written by write_kv) against fp64 attention over the
    dequantised cache; a decode row alone == among the others."""
    tp = mods["attn"]
    p = paged_problem(device, ctx, seqs, hq, hkv, d, bs)
    kc, ks = fp8_cache_like(p["kc"] * 4)
    vc, vs = fp8_cache_like(p["vc"])
    tp.write_kv(kc, vc, p["slots"], (p["k"] * 4).bfloat16(), p["v"], ks, vs)
    scale = d**-0.5
    ref = attn_ref.paged_attention(p["q"].double(), fp64_cache(kc, ks), fp64_cache(vc, vs), p["tables"], ctx, seqs,
                                   scale)
    ref_ds = attn_ref.paged_attention(p["q"], kc, vc, p["tables"], ctx, seqs, scale, ks, vs)  # the reference path
    close(ref_ds, ref, 2 * BF16_EPS, "reference attention over an fp8 cache")
    out = poisoned(p["q"].shape, torch.bfloat16, device)
    o = tp.paged_prefill_attention(p["q"], kc, vc, p["tables"], p["cu"], torch.tensor(ctx, device=device), scale,
                                   max(seqs), out=out, k_scale=ks, v_scale=vs)
    close(o, ref, 4 * BF16_EPS, "fp8 paged prefill attention")
    last = p["cu"][1:].long() - 1
    lens = torch.tensor([c + n for c, n in zip(ctx, seqs)], device=device, dtype=torch.int32)
    od = tp.paged_decode_attention(p["q"][last], kc, vc, p["tables"], lens, scale, int(lens.max()),
                                   out=poisoned((len(seqs), hq, d), torch.bfloat16, device), k_scale=ks, v_scale=vs)
    close(od, ref[last], 4 * BF16_EPS, "fp8 paged decode attention")
    for b in range(len(seqs)):
        alone = tp.paged_decode_attention(p["q"][last][b : b + 1].clone(), kc, vc, p["tables"][b : b + 1].clone(),
                                          lens[b : b + 1].clone(), scale, int(lens.max()), k_scale=ks, v_scale=vs)
        assert torch.equal(alone, od[b : b + 1]), f"fp8 decode attention: row {b} alone differs from the batch"


def check_errors(mods, device):
    """Mismatched cache kinds and missing or misshapen scales are refused with what was expected."""
    tp = mods["attn"]
    p = paged_problem(device, [0], [3], 2, 1, 32, 4)
    kc, ks = fp8_cache_like(p["kc"])
    vc, vs = fp8_cache_like(p["vc"])
    cases = (((kc, p["vc"], p["slots"], p["k"], p["v"], ks, vs), "must both be fp8"),
             ((kc, vc, p["slots"], p["k"], p["v"], None, vs), "needs k_scale"),
             ((kc, vc, p["slots"], p["k"], p["v"], ks[:1], vs), "needs k_scale"),
             ((p["kc"], p["vc"], p["slots"], p["k"], p["v"], ks, vs), "scales are for fp8 caches only"))
    for args, msg in cases:
        try:
            tp.write_kv(*args)
        except ValueError as exc:
            assert msg in str(exc), str(exc)
        else:
            raise AssertionError(f"no error for: {msg}")
