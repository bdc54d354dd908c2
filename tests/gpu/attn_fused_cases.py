"""Cases of the fused attention-layer decode kernels (helper module beside kernel_cases, same conventions):
qk_norm_rope_write (attention/triton_qk_prep.py) and paged_decode_attention's output gate (attention/triton_paged.py).

Each case NaN-poisons what the kernel must write, compares with an fp64 evaluation at the reference's rounding
points, with the unfused sequence the model runs today (rms_norm -> apply_rope -> write_kv; attention then
o * torch.sigmoid(gate)) in bf16 steps, and checks that everything the kernel must not touch kept its bits.
`mods` carries "qkprep", "attn" and "norm" (interpreted modules under the interpreter).
"""

from __future__ import annotations

import torch

from deltaserve.kernels import launch_table
from deltaserve.kernels.attention import reference as attn_ref
from deltaserve.kernels.rope import apply_rope, rope_cos_sin, rope_inv_freq
from kernel_cases import BF16_EPS, INTERPRETED, close, paged_problem, poisoned

THETA = 10_000_000.0
EPS = 1e-6


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance of two bf16 tensors in bf16 steps (bit patterns mapped onto one ordered line)."""
    def line(x):
        i = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -32768 - i, i)

    return (line(a) - line(b)).abs()


def _sections(half: int) -> tuple[int, int, int]:
    """mRoPE sections in the published proportions: (11, 11, 10) for rotary_dim 64."""
    s2 = half // 3
    s1 = (half - s2) // 2
    return (half - s1 - s2, s1, s2)


def qk_positions(kind: str, t: int, device) -> torch.Tensor:
    if kind == "text":
        return torch.randint(0, 60000, (t,), device=device)
    if kind == "mrope_text":  # text-only multimodal ids: three equal rows
        return torch.randint(0, 60000, (t,), device=device).expand(3, t).contiguous()
    return torch.randint(0, 3000, (3, t), device=device)  # distinct T/H/W ids


def qk_problem(device, t, hq, hkv, d, rd, kind="text", offset=1.0, bs=4, pad_row=1):
    """Inputs of one qk_norm_rope_write call; token `pad_row` has slot -1 (padding). Written cache slots are NaN;
    the cache has a few blocks more than the tokens need (slots outside slot_mapping must keep their bits)."""
    nb = t // bs + 3
    qg = torch.randn(t, hq * 2 * d, device=device).bfloat16()
    w_scale, w_base = (0.2, 0.0) if offset else (0.2, 1.0)
    slots = torch.randperm(nb * bs, device=device)[:t]
    if 0 <= pad_row < t:
        slots[pad_row] = -1
    kc = torch.randn(nb, bs, hkv, d, device=device).bfloat16()
    vc = torch.randn(nb, bs, hkv, d, device=device).bfloat16()
    live = slots[slots >= 0]
    kc.view(-1, hkv, d)[live] = float("nan")
    vc.view(-1, hkv, d)[live] = float("nan")
    return dict(
        qg=qg, q=qg.view(t, hq, 2 * d)[..., :d], k=(3 * torch.randn(t, hkv, d, device=device)).bfloat16(),
        v=torch.randn(t, hkv, d, device=device).bfloat16(),
        qw=(w_base + w_scale * torch.randn(d, device=device)).bfloat16(),
        kw=(w_base + w_scale * torch.randn(d, device=device)).bfloat16(),
        pos=qk_positions(kind, t, device), invf=rope_inv_freq(rd, THETA, device), kc=kc, vc=vc, slots=slots,
        offset=offset, sec=_sections(rd // 2), rd=rd,
    )


def run_qk_prep(mods, p, out=None, cos_sin=None):
    return mods["qkprep"].qk_norm_rope_write(
        p["q"], p["k"], p["v"], p["qw"], p["kw"], EPS, p["offset"], p["pos"], p["invf"], p["kc"], p["vc"],
        p["slots"], mrope_section=p["sec"], mrope_interleaved=True, out=out, cos_sin=cos_sin)


def _norm_rope_fp64(x, w, offset, cos, sin):
    """fp64 rms_norm rounded to bf16 (the reference's rounding point), then fp64 RoPE."""
    xd = x.double()
    n = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * (offset + w.double())).to(x.dtype).double()
    return apply_rope(n, cos.double(), sin.double())


def check_qk_prep(mods, device, t, hq, hkv, d, rd, kind="text", offset=1.0, table=False):
    """table: the kernel reads rope_cos_sin's tables instead of computing cos/sin from the positions."""
    p = qk_problem(device, t, hq, hkv, d, rd, kind, offset)
    kc0, vc0 = p["kc"].clone(), p["vc"].clone()
    cos, sin = rope_cos_sin(p["pos"], rd, THETA, p["sec"], True)  # the model's cos/sin, fp32
    q = run_qk_prep(mods, p, out=poisoned((t, hq, d), torch.bfloat16, device), cos_sin=(cos, sin) if table else None)
    close(q, _norm_rope_fp64(p["q"], p["qw"], p["offset"], cos, sin), 2 * BF16_EPS, f"qk prep q ({kind})")
    live = p["slots"] >= 0
    slots = p["slots"][live]
    hd = p["kc"].shape[2]
    k_ref = _norm_rope_fp64(p["k"], p["kw"], p["offset"], cos, sin)[live]
    close(p["kc"].view(-1, hd, d)[slots], k_ref, 2 * BF16_EPS, f"qk prep k cache ({kind})")
    assert torch.equal(p["vc"].view(-1, hd, d)[slots], p["v"][live]), "qk prep: v cache slots != v"
    untouched = torch.ones(p["kc"].shape[0] * p["kc"].shape[1], dtype=torch.bool, device=device)
    untouched[slots] = False
    for new, old, what in ((p["kc"], kc0, "k"), (p["vc"], vc0, "v")):
        assert torch.equal(new.view(-1, hd, d)[untouched], old.view(-1, hd, d)[untouched]), f"{what} cache: " \
            "a slot outside slot_mapping changed (or the padding token wrote)"
    # the unfused sequence of the fast path today: Triton rms_norm -> torch apply_rope -> Triton write_kv
    kc_u, vc_u = kc0.clone(), vc0.clone()
    qn = mods["norm"].rms_norm(p["q"], p["qw"], EPS, p["offset"])
    kn = mods["norm"].rms_norm(p["k"], p["kw"], EPS, p["offset"])
    q_u = apply_rope(qn, cos, sin)
    mods["attn"].write_kv(kc_u, vc_u, p["slots"], apply_rope(kn, cos, sin), p["v"])
    steps = max(bf16_ulps(q, q_u).max().item(), bf16_ulps(p["kc"], kc_u).max().item())
    assert steps <= 1, f"qk prep ({kind}) vs unfused: {steps} bf16 steps apart (at most 1 allowed)"
    assert torch.equal(p["vc"], vc_u), "qk prep vs unfused: v cache differs"
    return q


def check_qk_prep_mrope_text(mods, device, t, hq, hkv, d, rd):
    """[3, T] positions with equal rows == [T] positions, bit for bit (interleaved mRoPE reduces to RoPE)."""
    p = qk_problem(device, t, hq, hkv, d, rd, "mrope_text")
    q3 = run_qk_prep(mods, p)
    k3 = p["kc"].clone()
    p["pos"] = p["pos"][0].contiguous()
    assert torch.equal(run_qk_prep(mods, p), q3), "[3, T] equal rows vs [T]: q differs"
    assert torch.equal(p["kc"], k3), "[3, T] equal rows vs [T]: k cache differs"
    c3, s3 = rope_cos_sin(p["pos"].expand(3, t), rd, THETA, p["sec"], True)
    c1, s1 = rope_cos_sin(p["pos"], rd, THETA)
    assert torch.equal(c3, c1) and torch.equal(s3, s1), "rope_cos_sin: text-only mRoPE != plain RoPE"


def check_qk_prep_errors(mods, device):
    p = qk_problem(device, 3, 2, 1, 32, 16)
    for pos, msg in ((torch.zeros(2, 3, dtype=torch.long, device=device), "unsupported"),
                     (torch.zeros(3, 3, 1, dtype=torch.long, device=device), "unsupported"),
                     (torch.zeros(3, device=device), "integer")):
        p["pos"] = pos
        try:
            run_qk_prep(mods, p)
        except ValueError as exc:
            assert msg in str(exc), str(exc)
        else:
            raise AssertionError(f"no error for positions {tuple(pos.shape)} {pos.dtype}")
    p["pos"], p["sec"] = torch.zeros(3, 3, dtype=torch.long, device=device), (4, 4, 4)
    try:
        run_qk_prep(mods, p)
    except ValueError as exc:
        assert "mrope_section" in str(exc), str(exc)
    else:
        raise AssertionError("no error for an mrope_section that does not sum to rotary_dim/2")


def check_qk_prep_invariance(mods, device, others, hq, hkv, d, rd):
    """Token 0 alone == token 0 among `others` more tokens (q row and its cache slot)."""
    p = qk_problem(device, max(others) + 1, hq, hkv, d, rd, pad_row=-1)
    kc0, vc0 = p["kc"].clone(), p["vc"].clone()

    def first(n):
        sub = dict(p, q=p["q"][:n], k=p["k"][:n], v=p["v"][:n], pos=p["pos"][:n], slots=p["slots"][:n],
                   kc=kc0.clone(), vc=vc0.clone())
        q = run_qk_prep(mods, sub)
        s = int(p["slots"][0])
        return q[0], sub["kc"].view(-1, hkv, d)[s]

    alone = first(1)
    for n in others:
        for a, b in zip(first(n + 1), alone):
            assert torch.equal(a, b), f"qk prep: token 0 changed among {n} others"


# ---------------------------------------------------------------- gated decode attention


def gated_decode_problem(tp, device, lens, hq, hkv, d, bs):
    """One decode row per kv length in `lens` over a written paged cache: (problem, context lengths, q, gate), q
    and the gate the two halves of one [B, Hq, 2D] projection (strided views, as the model passes them)."""
    ctx = [n - 1 for n in lens]
    p = paged_problem(device, ctx, [1] * len(lens), hq, hkv, d, bs)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    qg = torch.randn(len(lens), hq, 2 * d, device=device).bfloat16()
    return p, ctx, qg[..., :d], qg[..., d:]


def check_decode_gate(mods, device, lens, hq, hkv, d, bs, split):
    """Gated decode over rows of kv length `lens` (some <= the split size, finished by their split program; some
    longer, merged): vs fp64, vs the unfused kernel-then-torch gate, and the same bits for any host bound."""
    tp = mods["attn"]
    b = len(lens)
    p, ctx, q, gate = gated_decode_problem(tp, device, lens, hq, hkv, d, bs)
    kv = torch.tensor(lens, device=device, dtype=torch.int32)
    scale = d**-0.5
    o = tp.paged_decode_attention(q, p["kc"], p["vc"], p["tables"], kv, scale, max(lens),
                                  out=poisoned((b, hq, d), torch.bfloat16, device), gate=gate)
    ref = attn_ref.paged_attention(q.double(), p["kc"].double(), p["vc"].double(), p["tables"], ctx, [1] * b, scale)
    want = ref.bfloat16().double() * torch.sigmoid(gate.double()).bfloat16().double()
    close(o, want, 4 * BF16_EPS, "gated decode attention vs fp64")
    plain = tp.paged_decode_attention(q, p["kc"], p["vc"], p["tables"], kv, scale, max(lens))
    close(plain, ref, 4 * BF16_EPS, "ungated decode attention vs fp64")
    unfused = plain * torch.sigmoid(gate)
    steps = bf16_ulps(o, unfused).max().item()
    # tl.exp is not torch's exp: bf16(sigmoid) may land one step off, the product then one step at most; the
    # interpreter truncates both roundings (sigmoid and product) where torch rounds: up to 3 steps there
    limit = 3 if INTERPRETED else 1
    assert steps <= limit, f"gated decode vs o * torch.sigmoid(gate): {steps} bf16 steps apart (> {limit})"
    ctx_t = torch.tensor(ctx, device=device, dtype=torch.int64)  # the model's context_lens, + 1 in the kernel
    again = tp.paged_decode_attention(q, p["kc"], p["vc"], p["tables"], ctx_t, scale, max(lens), gate=gate,
                                      lens_add=1)
    assert torch.equal(again, o), "gated decode: context lengths + lens_add=1 != kv lengths"
    for bound in (max(lens) + split, 5 * split):  # more splits in the grid, or a single-split grid: same bits
        if bound >= max(lens):
            again = tp.paged_decode_attention(q, p["kc"], p["vc"], p["tables"], kv, scale, bound, gate=gate)
            assert torch.equal(again, o), f"gated decode: bits change with the host bound {bound}"
    return o


def check_decode_gate_invariance(mods, device, lens, others, hq, hkv, d, bs):
    """Row 0 alone == row 0 among the next `others` rows (their lengths differ; the host bound grows with them)."""
    tp = mods["attn"]
    p = paged_problem(device, [n - 1 for n in lens], [1] * len(lens), hq, hkv, d, bs)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    qg = torch.randn(len(lens), hq, 2 * d, device=device).bfloat16()
    kv = torch.tensor(lens, device=device, dtype=torch.int32)

    def first(n):
        return tp.paged_decode_attention(qg[:n, :, :d], p["kc"], p["vc"], p["tables"][:n], kv[:n], d**-0.5,
                                         max(lens[:n]), gate=qg[:n, :, d:])[0]

    alone = first(1)
    for n in others:
        assert torch.equal(first(n + 1), alone), f"gated decode: row 0 changed among {n} others"


def check_decode_merge_steps(mods, device, lens, hq, hkv, d, bs, split, bsp, bd):
    """The one-pass split merge over several steps and column blocks (the running maximum rescales acc and l when
    a later step holds a larger logit), reached at small lengths by shrinking the merge's step (launch table
    "attention.merge_bsp") and column block ("attention.merge_bd"): vs fp64, host-bound independence and batch
    invariance."""
    with launch_table.override({"attention.merge_bsp": bsp, "attention.merge_bd": bd}):
        check_decode_gate(mods, device, lens, hq, hkv, d, bs, split)
        check_decode_gate_invariance(mods, device, lens, (1, 2), hq, hkv, d, bs)


def check_decode_merge_prep(mods, device, lens, hq, hkv, d, bs, split, fmts, merges=(None,)):
    """The merge writing the out projection's GEMV prep (paged_decode_attention(prep=(bits, group))): the output
    equals the unprepped launch's bit for bit, and (xp, xs) equal prep_x of that output bit for bit, every element
    written (NaN-poisoned buffers), for rows finished by their split program and merged rows, at each merge shape
    and with a host bound <= the split size (no merge launch: prep_x); a row's prep alone == among the others."""
    from deltaserve.kernels.quant.triton_gemv import prep_x

    tp = mods["attn"]
    b = len(lens)
    p, ctx, q, gate = gated_decode_problem(tp, device, lens, hq, hkv, d, bs)
    ctx_t = torch.tensor(ctx, device=device, dtype=torch.int32)

    def run(rows, bound, merge, fmt):
        out = poisoned((rows, hq, d), torch.bfloat16, device)
        bufs = None if fmt is None else (poisoned((rows, hq * d), torch.float32, device),
                                         poisoned((rows, hq * d // fmt[1]), torch.float32, device))
        return tp.paged_decode_attention(q[:rows], p["kc"], p["vc"], p["tables"][:rows], ctx_t[:rows], d**-0.5,
                                         bound, out=out, gate=gate[:rows], lens_add=1, merge=merge, prep=fmt,
                                         prep_out=bufs)

    for merge in merges:
        plain = run(b, max(lens), merge, None)
        for fmt in fmts:
            got, (xp, xs) = run(b, max(lens), merge, fmt)
            assert torch.equal(got, plain), f"merge prep {fmt} {merge}: the output changed"
            want_xp, want_xs = prep_x(plain.view(b, hq * d), *fmt)
            assert torch.equal(xp, want_xp), f"merge prep {fmt} {merge}: xp != prep_x (NaN: unwritten)"
            assert torch.equal(xs, want_xs), f"merge prep {fmt} {merge}: xs != prep_x (NaN: unwritten)"
            _, (xp1, xs1) = run(1, lens[0], merge, fmt)
            assert torch.equal(xp1[0], xp[0]) and torch.equal(xs1[0], xs[0]), \
                f"merge prep {fmt} {merge}: row 0's prep alone != among {b - 1} others"
    short = [i for i, n in enumerate(lens) if n <= split]
    if short:  # a host bound <= the split size: no merge launch, the prep launch makes the same bits
        rows = short[-1] + 1
        if max(lens[:rows]) <= split:
            for fmt in fmts:
                got, (xp, xs) = run(rows, split, None, fmt)
                want_xp, want_xs = prep_x(got.view(rows, hq * d), *fmt)
                assert torch.equal(xp, want_xp) and torch.equal(xs, want_xs), f"prep {fmt} without a merge launch"
    for bad in ((4, d * 2), (5, 16), (4, 12)):
        try:
            run(b, max(lens), None, bad)
        except ValueError as e:
            assert "prep" in str(e), e
        else:
            raise AssertionError(f"paged_decode_attention accepted prep {bad} at head_dim {d}")


def check_decode_strided(mods, device, lens, hq, hkv, d, bs, split, targets=(1, 3, 1000)):
    """Split programs looping over a row's splits (DECODE_PROGRAMS: P programs per (row, KV head), program p runs
    splits p, p + P, ...) compute every split as one program per split does: the same bits over bf16 and fp8
    caches for each target, and with one of them on, the gated decode's fp64 and host-bound checks and batch
    invariance hold."""
    import kv_fp8_cases as fc

    tp = mods["attn"]
    ctx = [n - 1 for n in lens]
    p = paged_problem(device, ctx, [1] * len(lens), hq, hkv, d, bs)
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    kc8, ks = fc.fp8_cache_like(p["kc"])
    vc8, vs = fc.fp8_cache_like(p["vc"])
    qg = torch.randn(len(lens), hq, 2 * d, device=device).bfloat16()
    kv = torch.tensor(lens, device=device, dtype=torch.int32)
    saved = tp.DECODE_PROGRAMS
    try:
        for kc, vc, ksc, vsc in ((p["kc"], p["vc"], None, None), (kc8, vc8, ks, vs)):
            got = {}
            for target in (None, *targets):
                tp.DECODE_PROGRAMS = target
                got[target] = tp.paged_decode_attention(qg[..., :d], kc, vc, p["tables"], kv, d**-0.5, max(lens),
                                                        gate=qg[..., d:], k_scale=ksc, v_scale=vsc)
            for target in targets:
                assert torch.equal(got[target], got[None]), \
                    f"decode with {target} split programs changed the bits ({kc.dtype} cache)"
        tp.DECODE_PROGRAMS = targets[1]
        check_decode_gate(mods, device, lens, hq, hkv, d, bs, split)
        check_decode_gate_invariance(mods, device, lens, (1, 2), hq, hkv, d, bs)
    finally:
        tp.DECODE_PROGRAMS = saved


def check_decode_long_split(mods, device, lens, hq, hkv, d, bs, split, longs):
    """Long rows' splits (long_split(): a row of more than FROM tokens in splits of TILES * split tokens), each
    (FROM, TILES) of `longs` set through DELTASERVE_ATTN_LONG_SPLIT: a row of at most FROM tokens keeps the bits it
    has without them; every row meets fp64 and the host-bound, lens_add and batch-invariance checks; the settled
    form (K rows before the wait), 2 pipeline stages and the merge's prep give the plain launch's bits; fp8 caches
    too; long splits with strided programs are refused by name (the setting's own refusals: tests/test_env_knobs)."""
    import kv_fp8_cases as fc
    from kernel_cases import env_values, settled_decode

    tp = mods["attn"]
    b = len(lens)
    p, ctx, q, gate = gated_decode_problem(tp, device, lens, hq, hkv, d, bs)
    kv = torch.tensor(lens, device=device, dtype=torch.int32)
    kc8, ks = fc.fp8_cache_like(p["kc"])
    vc8, vs = fc.fp8_cache_like(p["vc"])

    def run(caches=(p["kc"], p["vc"], None, None), **kw):
        kc, vc, ksc, vsc = caches
        return tp.paged_decode_attention(q, kc, vc, p["tables"], kv, d**-0.5, max(lens), gate=gate, k_scale=ksc,
                                         v_scale=vsc, out=poisoned((b, hq, d), torch.bfloat16, device), **kw)

    fp8 = (kc8, vc8, ks, vs)
    with env_values(DELTASERVE_ATTN_LONG_SPLIT="off"):
        plain, plain8 = run(), run(fp8)
    for first, tiles in longs:
        with env_values(DELTASERVE_ATTN_LONG_SPLIT=f"{first}x{tiles}"):
            assert tp.long_split() == (first, tiles)
            check_decode_gate(mods, device, lens, hq, hkv, d, bs, split)  # its own rows of these lengths
            got, got8 = run(), run(fp8)
            short = [i for i, n in enumerate(lens) if n <= first]
            long_rows = [i for i, n in enumerate(lens) if n > first]
            assert short and long_rows, f"long splits {first}x{tiles}: lengths {lens} need rows on both sides"
            assert torch.equal(got[short], plain[short]) and torch.equal(got8[short], plain8[short]), \
                f"long splits {first}x{tiles}: a row of <= {first} tokens changed its bits"
            # the long rows took the longer splits (another summation order, so other bits somewhere), not the off path
            assert not torch.equal(got[long_rows], plain[long_rows]), \
                f"long splits {first}x{tiles}: the long rows kept the 64-token splits' bits"
            ref = attn_ref.paged_attention(q.double(), fc.fp64_cache(kc8, ks), fc.fp64_cache(vc8, vs), p["tables"],
                                           ctx, [1] * b, d**-0.5)
            want = ref.bfloat16().double() * torch.sigmoid(gate.double()).bfloat16().double()
            close(got8, want, 4 * BF16_EPS, f"long splits {first}x{tiles}, fp8 cache vs fp64")
            settled = settled_decode(tp, q, p["kc"], p["vc"], p["tables"], kv, d**-0.5, max(lens), gate=gate)
            assert torch.equal(settled, got), f"long splits {first}x{tiles}: the settled form changed the bits"
            saved_stages, tp.LONG_STAGES = tp.LONG_STAGES, 2  # pipelined long loops: no arithmetic
            try:
                assert torch.equal(run(), got) and torch.equal(run(fp8), got8), \
                    f"long splits {first}x{tiles}: 2 pipeline stages changed the bits"
            finally:
                tp.LONG_STAGES = saved_stages
            check_decode_gate_invariance(mods, device, lens, (1, b - 1), hq, hkv, d, bs)
            check_decode_merge_prep(mods, device, lens, hq, hkv, d, bs, split, [(4, min(64, d))])
            saved = tp.DECODE_PROGRAMS
            tp.DECODE_PROGRAMS = 3
            try:
                run()
                raise AssertionError("long splits with strided split programs were accepted")
            except ValueError as e:
                assert "DECODE_PROGRAMS" in str(e), e
            finally:
                tp.DECODE_PROGRAMS = saved


# ---------------------------------------------------------------- the layer's decode, fused vs unfused


def check_attention_decode_fused(mods, device, lens, hq, hkv, d, rd, bs):
    """The attention layer's decode between its projections, both ways on the same cache: today's sequence
    (rms_norm x2, rope_cos_sin + apply_rope x2, write_kv, decode attention, o * torch.sigmoid(gate)) and the fused
    one (qk_norm_rope_write, paged_decode_attention(gate=..., lens_add=1)). Outputs and caches agree within bf16
    rounding; row order of the result follows the batch."""
    tp, qp, nm = mods["attn"], mods["qkprep"], mods["norm"]
    b, ctx = len(lens), [n - 1 for n in lens]
    p = paged_problem(device, ctx, [1] * b, hq, hkv, d, bs)
    qg = torch.randn(b, hq * 2 * d, device=device).bfloat16()
    q, gate = qg.view(b, hq, 2 * d)[..., :d], qg.view(b, hq, 2 * d)[..., d:]
    qw, kw = (0.2 * torch.randn(d, device=device)).bfloat16(), (0.2 * torch.randn(d, device=device)).bfloat16()
    pos = torch.tensor(ctx, device=device)
    sec = _sections(rd // 2)
    ctx_t, kv = pos.clone(), (pos + 1).to(torch.int32)
    scale = d**-0.5
    kc_u, vc_u = p["kc"].clone(), p["vc"].clone()
    cos, sin = rope_cos_sin(pos, rd, THETA, sec, True)
    qn = apply_rope(nm.rms_norm(q, qw, EPS, 1.0), cos, sin)
    kn = apply_rope(nm.rms_norm(p["k"], kw, EPS, 1.0), cos, sin)
    tp.write_kv(kc_u, vc_u, p["slots"], kn, p["v"])
    o_u = tp.paged_decode_attention(qn.contiguous(), kc_u, vc_u, p["tables"], kv, scale, max(lens))
    o_u = o_u.reshape(b, hq * d) * torch.sigmoid(gate.reshape(b, hq * d))
    qf = qp.qk_norm_rope_write(q, p["k"], p["v"], qw, kw, EPS, 1.0, pos, rope_inv_freq(rd, THETA, device), p["kc"],
                               p["vc"], p["slots"], mrope_section=sec, mrope_interleaved=True)
    o_f = tp.paged_decode_attention(qf, p["kc"], p["vc"], p["tables"], ctx_t, scale, max(lens), gate=gate,
                                    lens_add=1)
    assert bf16_ulps(p["kc"], kc_u).max().item() <= 1 and torch.equal(p["vc"], vc_u), "fused layer: caches differ"
    # q/k one bf16 step apart at most move the softmax slightly: a few steps of the output's scale
    close(o_f.reshape(b, hq * d), o_u.double(), 4 * BF16_EPS, "fused layer decode vs unfused")
