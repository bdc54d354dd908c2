"""Every reference op against a float64 implementation of the spec's equations, on fresh random inputs.

The fp64 oracles here are written from the spec (shared ref, section 3) independently of deltaserve.kernels:
plain loops over tokens/heads, no shared helpers.
"""

from __future__ import annotations

import math

import pytest
import torch

from deltaserve.kernels.attention import paged_attention, write_kv
from deltaserve.kernels.conv1d import causal_conv1d
from deltaserve.kernels.gated_delta import gated_delta_chunked, gated_delta_recurrent, gdn_gates, l2norm
from deltaserve.kernels.moe import moe_combine_reference, route_topk
from deltaserve.kernels.norm import gated_rms_norm, rms_norm
from deltaserve.kernels.rope import apply_rope, rope_cos_sin

f64 = torch.float64


def close(got, want, tol):
    got, want = got.to(f64), want.to(f64)
    err = (got - want).abs().max().item()
    assert err <= tol * max(1.0, want.abs().max().item()), f"max |diff| {err:.3g} > {tol:g}"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(torch.seed() % 2**31)  # fresh inputs every run


def randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


# ---- norms ---------------------------------------------------------------------------------------------------


def test_rms_norm_matches_spec(gen):
    x, w = randn(gen, 7, 48), randn(gen, 48, scale=0.1)
    want = torch.stack([xi.to(f64) / math.sqrt((xi.to(f64) ** 2).mean() + 1e-6) * (1 + w.to(f64)) for xi in x])
    close(rms_norm(x, w, 1e-6), want, 1e-6)
    mlx_style = rms_norm(x, 1 + w, 1e-6, offset=0.0)  # +1 baked into the weight
    close(mlx_style, want, 1e-6)


def test_gated_rms_norm_matches_spec(gen):
    x, z, w = randn(gen, 5, 3, 16), randn(gen, 5, 3, 16), randn(gen, 16)
    xd = x.to(f64)
    normed = xd / torch.sqrt((xd**2).mean(-1, keepdim=True) + 1e-6) * w.to(f64)
    zd = z.to(f64)
    want = normed * zd / (1 + torch.exp(-zd))
    close(gated_rms_norm(x, z, w, 1e-6), want, 1e-6)


# ---- conv ----------------------------------------------------------------------------------------------------


def conv_oracle(x, w, state):
    """conv_c(t) = sum_j w[c, j] * x_c(t - K + 1 + j), zeros (or the state) before the start; then SiLU."""
    t_len, c = x.shape
    k = w.shape[1]
    hist = torch.cat([state.t().to(f64), x.to(f64)]) if state is not None else torch.cat([torch.zeros(k - 1, c, dtype=f64), x.to(f64)])
    out = torch.zeros(t_len, c, dtype=f64)
    for t in range(t_len):
        for j in range(k):
            out[t] += w[:, j].to(f64) * hist[t + j]
    return out * torch.sigmoid(out)


@pytest.mark.parametrize("t_len", [1, 2, 3, 9])
def test_causal_conv1d_matches_spec_and_carries_state(gen, t_len):
    c, k = 12, 4
    x, w, st = randn(gen, t_len, c), randn(gen, c, k), randn(gen, c, k - 1)
    y, new_state = causal_conv1d(x, w, st)
    close(y, conv_oracle(x, w, st), 1e-6)
    y0, _ = causal_conv1d(x, w, None)
    close(y0, conv_oracle(x, w, None), 1e-6)
    # the new state is the last K-1 inputs (oldest first), including the old state when t_len < K-1
    hist = torch.cat([st.t(), x])
    assert torch.equal(new_state, hist[-(k - 1) :].t())


def test_conv_split_equals_whole(gen):
    x, w = randn(gen, 11, 6), randn(gen, 6, 4)
    whole, _ = causal_conv1d(x, w, None)
    a, s = causal_conv1d(x[:5], w, None)
    b, s = causal_conv1d(x[5:6], w, s)
    c, _ = causal_conv1d(x[6:], w, s)
    close(torch.cat([a, b, c]), whole, 1e-6)


# ---- gated delta ---------------------------------------------------------------------------------------------


def gdn_inputs(gen, t_len, hk, hv, dk, dv):
    q = l2norm(randn(gen, t_len, hk, dk))
    k = l2norm(randn(gen, t_len, hk, dk))
    v = randn(gen, t_len, hv, dv)
    a, b = randn(gen, t_len, hv), randn(gen, t_len, hv)
    a_log, dt_bias = torch.log(torch.rand(hv, generator=gen) * 15 + 1), randn(gen, hv)
    g, beta = gdn_gates(a, b, a_log, dt_bias)
    state = randn(gen, hv, dk, dv, scale=0.5)
    return q, k, v, g, beta, state


def gdn_oracle(q, k, v, g, beta, state, scale):
    """Closed form per value head h (key head h // r): S_t = a_t (I - b_t k k^T) S_{t-1} + b_t k v^T; o_t = S_t^T q_t s."""
    t_len, hv, dv = v.shape
    hk, dk = q.shape[1], q.shape[2]
    r = hv // hk
    s = state.to(f64).clone()
    out = torch.zeros(t_len, hv, dv, dtype=f64)
    eye = torch.eye(dk, dtype=f64)
    for h in range(hv):
        kh = h // r
        for t in range(t_len):
            kt, qt = k[t, kh].to(f64), q[t, kh].to(f64)
            a, b = math.exp(g[t, h].item()), beta[t, h].item()
            s[h] = a * (eye - b * torch.outer(kt, kt)) @ s[h] + b * torch.outer(kt, v[t, h].to(f64))
            out[t, h] = s[h].t() @ qt * scale
    return out, s


def test_gdn_gates_match_spec(gen):
    a, b = randn(gen, 4, 6, scale=8), randn(gen, 4, 6)
    a_log, dt = randn(gen, 6), randn(gen, 6)
    g, beta = gdn_gates(a, b, a_log, dt)
    x = a.to(f64) + dt.to(f64)
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    close(g, -torch.exp(a_log.to(f64)) * softplus, 1e-6)
    close(beta, 1 / (1 + torch.exp(-b.to(f64))), 1e-6)


@pytest.mark.parametrize("hk,hv", [(2, 2), (2, 4)])
def test_recurrent_matches_closed_form(gen, hk, hv):
    q, k, v, g, beta, s0 = gdn_inputs(gen, 9, hk, hv, 8, 6)
    scale = 8**-0.5
    want_o, want_s = gdn_oracle(q, k, v, g, beta, s0, scale)
    o, s = gated_delta_recurrent(q, k, v, g, beta, s0, scale)
    close(o, want_o, 2e-5)
    close(s, want_s, 2e-5)


@pytest.mark.parametrize("t_len", [1, 63, 64, 65, 150])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_equals_recurrent_fp64(gen, t_len, with_state):
    q, k, v, g, beta, s0 = gdn_inputs(gen, t_len, 2, 4, 16, 8)
    s0 = s0 if with_state else None
    args = [x.to(f64) for x in (q, k, v, g, beta)]
    s64 = s0.to(f64) if s0 is not None else None
    o_r, s_r = gated_delta_recurrent(*args, s64, 0.25)
    o_c, s_c = gated_delta_chunked(*args, s64, 0.25)
    close(o_c, o_r, 1e-10)
    close(s_c, s_r, 1e-10)
    # and the fp32 chunked form against the fp64 step form
    o32, s32 = gated_delta_chunked(q, k, v, g, beta, s0, 0.25)
    assert o32.dtype == torch.float32
    close(o32, o_r, 2e-4)
    close(s32, s_r, 2e-4)


def test_chunked_state_handoff(gen):
    q, k, v, g, beta, s0 = gdn_inputs(gen, 100, 2, 2, 8, 8)
    args = [x.to(f64) for x in (q, k, v, g, beta)]
    whole_o, whole_s = gated_delta_chunked(*args, s0.to(f64), 0.3)
    o1, s1 = gated_delta_chunked(*(x[:37] for x in args), s0.to(f64), 0.3)
    o2, s2 = gated_delta_chunked(*(x[37:] for x in args), s1, 0.3)
    close(torch.cat([o1, o2]), whole_o, 1e-10)
    close(s2, whole_s, 1e-10)


# ---- rope ----------------------------------------------------------------------------------------------------


def rope_oracle(x, pos3, rotary_dim, theta, section):
    """Interleaved MRoPE (spec 3.7): frequency j uses H if j%3==1 and j<3*s1, W if j%3==2 and j<3*s2, else T."""
    t_len, h, d = x.shape
    half = rotary_dim // 2
    out = x.to(f64).clone()
    for t in range(t_len):
        for j in range(half):
            axis = 1 if (j % 3 == 1 and j < 3 * section[1]) else 2 if (j % 3 == 2 and j < 3 * section[2]) else 0
            phi = pos3[axis, t].item() * theta ** (-2 * j / rotary_dim)
            c, s = math.cos(phi), math.sin(phi)
            a, b = x[t, :, j].to(f64), x[t, :, j + half].to(f64)
            out[t, :, j] = a * c - b * s
            out[t, :, j + half] = b * c + a * s
    return out


def test_rope_partial_mrope_matches_spec(gen):
    x = randn(gen, 6, 3, 32)
    pos3 = torch.randint(0, 500, (3, 6), generator=gen)
    cos, sin = rope_cos_sin(pos3, 16, 1e4, (3, 3, 2), True)
    close(apply_rope(x, cos, sin), rope_oracle(x, pos3, 16, 1e4, (3, 3, 2)), 1e-5)
    # text: equal T/H/W ids == plain 1-D positions
    p = torch.randint(0, 1000, (6,), generator=gen)
    c1, s1 = rope_cos_sin(p, 16, 1e7, (3, 3, 2), True)
    c3, s3 = rope_cos_sin(p.expand(3, -1), 16, 1e7, (3, 3, 2), True)
    assert torch.equal(c1, c3) and torch.equal(s1, s3)
    # angles are built in fp32 (as the published model does): error up to ~ position * 2^-24 rad
    close(apply_rope(x, c1, s1), rope_oracle(x, p.expand(3, -1), 16, 1e7, (3, 3, 2)), 1000 * 2**-24 * 4)


# ---- paged attention -----------------------------------------------------------------------------------------


def test_paged_attention_matches_dense_causal(gen):
    hq, hkv, d, bs = 4, 2, 8, 4
    ctx, new = [0, 5, 9], [6, 1, 3]
    n_blocks = 16
    kc, vc = torch.zeros(n_blocks, bs, hkv, d), torch.zeros(n_blocks, bs, hkv, d)
    perm = torch.randperm(n_blocks, generator=gen).tolist()  # scattered blocks
    tables, full_k, full_v, slots = [], [], [], []
    for c, n in zip(ctx, new):
        need = -(-(c + n) // bs)
        table = [perm.pop() for _ in range(need)]
        tables.append(table + [-1] * (4 - need))
        keys, vals = randn(gen, c + n, hkv, d), randn(gen, c + n, hkv, d)
        full_k.append(keys)
        full_v.append(vals)
        for i in range(c):  # pre-existing context
            kc[table[i // bs], i % bs], vc[table[i // bs], i % bs] = keys[i], vals[i]
        slots += [table[i // bs] * bs + i % bs for i in range(c, c + n)]
    q = randn(gen, sum(new), hq, d)
    write_kv(kc, vc, torch.tensor(slots), torch.cat([k[c:] for k, c in zip(full_k, ctx)]),
             torch.cat([v[c:] for v, c in zip(full_v, ctx)]))
    out = paged_attention(q, kc, vc, torch.tensor(tables, dtype=torch.int32), ctx, new, d**-0.5)
    start = 0
    for b, (c, n) in enumerate(zip(ctx, new)):
        for i in range(n):
            for h in range(hq):
                kk, vv = full_k[b][: c + i + 1, h // 2].to(f64), full_v[b][: c + i + 1, h // 2].to(f64)
                p = torch.softmax(kk @ q[start + i, h].to(f64) * d**-0.5, 0)
                close(out[start + i, h], p @ vv, 1e-5)
        start += n


# ---- MoE -----------------------------------------------------------------------------------------------------


def test_routing_contract(gen):
    logits = randn(gen, 20, 16)
    w, ids = route_topk(logits, 4)
    p = torch.softmax(logits.to(f64), -1)
    top, top_ids = torch.topk(p, 4)
    assert torch.equal(ids, top_ids)
    close(w, top / top.sum(-1, keepdim=True), 1e-6)
    w_raw, _ = route_topk(logits, 4, normalize=False)
    close(w_raw, top, 1e-6)
    # ties go to the lower expert id
    tied = torch.zeros(1, 8)
    tied[0, [6, 2, 5]] = 1.0
    _, tid = route_topk(tied, 2)
    assert tid.tolist() == [[2, 5]]


def test_moe_combine_matches_direct_sum(gen):
    n, h, e, k = 9, 12, 6, 3
    x = randn(gen, n, h)
    mats = randn(gen, e, h, h, scale=0.3)
    w, ids = route_topk(randn(gen, n, e), k)
    shared, gate = randn(gen, n, h), randn(gen, n, 1)
    got = moe_combine_reference(x, w, ids, lambda xs, ei: xs @ mats[ei].t(), shared, gate)
    want = torch.zeros(n, h, dtype=f64)
    for i in range(n):
        for j in range(k):
            want[i] += w[i, j].to(f64) * (mats[ids[i, j]].to(f64) @ x[i].to(f64))
        want[i] += torch.sigmoid(gate[i].to(f64)) * shared[i].to(f64)
    close(got, want, 1e-5)


def test_norm_prep_support_is_one_rule():
    """rms_norm(prep=) and the model's norm_for_gemv share one predicate: formats and widths it refuses raise in
    rms_norm (before any launch) and make norm_for_gemv fall back to the plain norm."""
    pytest.importorskip("triton")
    from deltaserve.kernels import triton_norm as tn

    assert tn.prep_supported(2048, 4, 64) and tn.prep_supported(4096, 8, 32)
    for n, bits, group in ((3072, 4, 64), (2048, 16, 64), (2 * tn.PREP_MAX_N, 4, 64), (32, 4, 64)):
        assert not tn.prep_supported(n, bits, group)
        x = torch.zeros(1, n, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="rms_norm prep"):
            tn.rms_norm(x, torch.ones(n), 1e-6, prep=(bits, group))
