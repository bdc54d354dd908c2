"""Kernel-vs-reference cases shared by the CUDA tests (tests/gpu) and the interpreter tests (TRITON_INTERPRET=1).

Every case draws fresh random inputs, NaN-poisons the outputs (and the state slots that must be ignored) before the
kernel runs, and compares with an fp64 evaluation of the reference math. Tolerances are stated in units of the
activation dtype's rounding (bf16: 2^-8 relative), because the kernels round where the references round.
Kernel modules are passed in (`mods`) so the interpreter tests can hand over re-imported, interpreted modules.
"""

from __future__ import annotations

import contextlib
import importlib

import os
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from deltaserve.kernels.attention import reference as attn_ref
from deltaserve.kernels.gated_delta import reference as gdn_ref
from deltaserve.kernels.moe.routing import route_topk

BF16_EPS = 2.0**-8
# Triton 3.6's interpreter converts fp32 -> bf16 by truncation (1 ulp) where the GPU rounds to nearest (1/2 ulp):
# bf16 tolerances double there.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
SLACK = 2.0 if INTERPRETED else 1.0


def interpreter_numpy_shim() -> None:
    """Two adjustments to Triton 3.6's interpreter for the CPU tests.

    1. It passes scalar kernel arguments as 1-element arrays and calls int() on them, which numpy >= 2.4 refuses
       for 1-D arrays ("only 0-dimensional arrays can be converted"). Take the element.
    2. Speed: every call of a @triton.jit helper inside a kernel re-runs the language patching that the kernel's
       launch already did (`InterpretedFunction.__call__` -> `_patch_lang`: an `inspect.getmembers` scan of
       triton.language per call, ~1.5 ms, ~40% of the fast path's interpreter time). A helper whose language
       modules are already patched (their `load` is no longer the builtin) calls its rewritten function directly;
       the launch's own patch scope still restores everything afterwards. Semantics are unchanged: the nested
       patch found no builtin left to replace in those modules."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_deltaserve_shim", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._deltaserve_shim = True
    interpreter._patch_lang_tensor = patched

    call = interpreter.InterpretedFunction.__call__
    langs_of: dict = {}

    def helper_call(self, *args, **kwargs):
        langs = langs_of.get(self.fn)
        if langs is None:
            langs = langs_of[self.fn] = [v for v in self.fn.__globals__.values()
                                         if inspect.ismodule(v) and v in (tl, tl.core)]
        if not langs or any(tl.core.is_builtin(getattr(lang, "load", None)) for lang in langs):
            return call(self, *args, **kwargs)  # not patched yet: the interpreter's own path
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.InterpretedFunction.__call__ = helper_call


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes [..., n] -> MLX words uint32 [..., n*bits/32] (value i of a word at bits [i*bits, ...))."""
    per = 32 // bits
    *lead, n = q.shape
    q = q.to(torch.int64).reshape(*lead, n // per, per)
    return (q << (torch.arange(per, device=q.device) * bits)).sum(-1).to(torch.uint32)


def affine_weight(shape, bits: int, group: int, device, gen=None, bounded: bool = False):
    """Random packed weight: (packed, scales, biases, dense fp64 W = s*q + b). bounded: scales and biases within a
    factor of 3 of their typical size (as a quantiser's are), so every s*q + b is exact in fp32
    (wgmma_dense.bf16_fma_exact)."""
    *lead, n = shape
    q = torch.randint(0, 2**bits, tuple(shape), device=device)
    u_s, u_b = (torch.rand(*lead, n // group, device=device) for _ in range(2))
    if bounded:
        u_s, u_b = 0.5 + u_s, 0.5 + u_b
    s = (u_s * 0.04 / 2 ** (bits - 4)).bfloat16()
    b = (-u_b * 0.05).bfloat16()
    w = q.double().reshape(*lead, n // group, group) * s.double()[..., None] + b.double()[..., None]
    return pack(q, bits), s, b, w.reshape(shape)


def close(actual: torch.Tensor, ref: torch.Tensor, rel: float, what: str) -> None:
    """|actual - ref| <= rel * max|ref| everywhere, and no NaN (the poison must be overwritten)."""
    a = actual.double()
    assert not torch.isnan(a).any(), f"{what}: NaN in the output (poison left or NaN produced)"
    err = (a - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = rel * SLACK if rel >= BF16_EPS else rel
    assert err <= rel * scale + 1e-6, f"{what}: max error {err:.3g} > {rel:.3g} x max|ref| {scale:.3g}"


@contextlib.contextmanager
def env_values(**values: str):
    """The given environment variables set for the block, each put back (or removed) after it."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# ---------------------------------------------------------------- greedy feedback


def check_greedy_advance(mods, device, b, v, bs=16):
    """greedy_advance == the torch sequence it replaces (greedy_advance_reference) on every tensor it writes:
    random rows, a tie across chunks and within a block (the first index wins), an all -inf row (index 0), the
    maximum at the last index, contexts crossing a block boundary; bad shapes raise."""
    import pytest

    tg = mods["greedy"]
    logits = torch.randn(b, v, device=device)
    logits[0, [7, v - 5]] = 50.0  # a tie across chunks
    logits[1] = float("-inf")
    logits[2, v - 1] = 60.0
    logits[3, [1030, 1031]] = 40.0  # a tie inside one block
    if b > 4:
        logits[4, [100, 2000]] = 45.0  # a tie across blocks (of one chunk once chunks hold several blocks)
    blocks = 8
    tables = torch.randperm(b * blocks).view(b, blocks).to(torch.int32).to(device)
    ctx = torch.tensor([bs - 1, 0, 3 * bs + 2, 2 * bs - 1] + [5] * (b - 4), device=device)[:b]
    state = dict(input_ids=torch.full((b,), -1, device=device), positions=ctx.clone() + 7, context_lens=ctx.clone(),
                 slot_mapping=torch.full((b,), -1, device=device))
    got = {k: t.clone() for k, t in state.items()}
    want = {k: t.clone() for k, t in state.items()}
    tg.greedy_advance(logits, got["input_ids"], got["positions"], got["context_lens"], tables, got["slot_mapping"], bs)
    tg.greedy_advance_reference(logits, want["input_ids"], want["positions"], want["context_lens"], tables,
                                want["slot_mapping"], bs)
    for k in state:
        assert torch.equal(got[k], want[k]), f"greedy_advance {k}: {got[k].tolist()} != {want[k].tolist()}"
    assert got["input_ids"][:4].tolist() == [7, 0, v - 1, 1030] and (b < 5 or int(got["input_ids"][4]) == 100)
    with pytest.raises(ValueError, match="positions"):
        tg.greedy_advance(logits, got["input_ids"], got["positions"][:1], got["context_lens"], tables,
                          got["slot_mapping"], bs)


# ---------------------------------------------------------------- quantised embedding lookup


def check_affine_embed(mods, device, bits, group, v, h, t):
    """affine_embed == affine_gather_rows (the reference lookup) bit for bit: t random ids (repeats, the first and
    the last row among them) of a packed [v, h] table, output poisoned; bad formats and shapes raise."""
    import pytest

    from deltaserve.kernels.quant import affine_gather_rows, affine_quantize

    te = mods["embed"]
    w = torch.randn(v, h, device=device).bfloat16()
    packed, scales, biases = affine_quantize(w, bits, group)
    ids = torch.cat([torch.tensor([0, v - 1, v - 1]), torch.randint(0, v, (t - 3,))]).to(device)
    out = poisoned((t, h), torch.bfloat16, device)
    got = te.affine_embed(packed, scales, biases, ids, bits, group, out=out)
    want = affine_gather_rows(packed, scales, biases, ids, bits, group)
    assert got.data_ptr() == out.data_ptr() and not got.isnan().any(), f"embedding q{bits} g{group}: rows unwritten"
    if INTERPRETED:  # the interpreter's fp32 -> bf16 cast truncates where the GPU's and torch's round to nearest
        line = [x.view(torch.int16).to(torch.int32) for x in (got, want)]
        steps = (torch.where(line[0] < 0, -32768 - line[0], line[0]) - torch.where(line[1] < 0, -32768 - line[1],
                                                                                     line[1])).abs().max().item()
        assert steps <= 1, f"embedding q{bits} g{group}: {steps} bf16 steps from the reference"
    else:
        assert torch.equal(got, want), f"embedding q{bits} g{group}: bits differ from affine_gather_rows"
    assert te.affine_embed(packed, scales, biases, ids[:0], bits, group).shape == (0, h)
    with pytest.raises(ValueError, match="bits 3"):
        te.affine_embed(packed, scales, biases, ids, 3, group)
    with pytest.raises(ValueError, match="scales"):
        te.affine_embed(packed, scales[:, 1:], biases[:, 1:], ids, bits, group)


# ---------------------------------------------------------------- affine matmul


def check_affine(mods, device, bits, group, m, n, k):
    ta = mods["affine"]
    packed, s, b, w = affine_weight((n, k), bits, group, device)
    x = torch.randn(m, k, device=device).bfloat16()
    out = poisoned((m, n), torch.bfloat16, device)
    y = ta.affine_matmul(x, packed, s, b, bits, group, out=out)
    ref = x.double() @ w.t()
    close(y, ref, 4 * BF16_EPS, f"affine bits={bits} g={group} M={m}")
    # the reference's own rounding (dequantise to bf16, fp32 accumulation) is closer still
    ref_bf = x.double() @ w.bfloat16().double().t()
    close(y, ref_bf, 2 * BF16_EPS, f"affine bits={bits} g={group} M={m} vs bf16-dequantised")


def check_dense_dequant(mods, device, bits, group, n, k, ms, configs, dense=False):
    """The dense prefill path (triton_affine.dense_path "dequant"): `dequantize` gives dequant_tile's values (within
    a bf16 rounding of the fp64 weight, no poison left), `dense_mm` over them equals the wide kernel's result bit for
    bit for every tile in `configs` (the same products chained in the same K order; under the interpreter only tiles
    of the wide kernel's BK, 128, since its dot sums a whole K step in numpy before adding it), affine_matmul's
    dequant route equals its wide route (on the GPU; within tolerance under the interpreter, whose route runs BK
    64), and a row alone equals the same row among the others. dense: a bf16 weight (bits 16), multiplied as it
    is."""
    ta = mods["affine"]
    if dense:
        w16 = torch.randn(n, k, device=device).bfloat16()
        packed, s, b, wd, bits, group = w16, None, None, w16.double(), 16, 1
    else:
        packed, s, b, wd = affine_weight((n, k), bits, group, device)
    spec = ta.WeightSpec(packed, s, b, bits, group)
    if dense:
        deq = w16
    else:
        deq = ta.dequantize(spec, out=poisoned((n, k), torch.bfloat16, device))
        close(deq, wd, BF16_EPS, f"dequantize bits={bits} g={group}")
    x = torch.randn(max(ms), k, device=device).bfloat16()
    wide_cfg = ta.wide_config(spec)
    # every M through the dequant route, for the alone check
    with mock.patch.object(ta, "dense_path", lambda m: "dequant"):
        alone = ta.affine_matmul(x[:1], packed, s, b, bits, group)
        for m in ms:
            what = f"dense path bits={bits} g={group} {n}x{k} M={m}"
            wide = ta.affine_matmul(x[:m], packed, s, b, bits, group, config=wide_cfg)
            close(wide, x[:m].double() @ wd.t(), 4 * BF16_EPS, what + " (wide)")
            for cfg in configs:
                got = ta.dense_mm(x[:m], deq, poisoned((m, n), torch.bfloat16, device), cfg)
                assert torch.equal(got, wide), f"{what}: dense_mm {cfg} != the wide kernel"
            routed = ta.affine_matmul(x[:m], packed, s, b, bits, group, out=poisoned((m, n), torch.bfloat16, device))
            if device == "cpu":  # the route's BK 64 against the wide kernel's 128: the interpreter's rounding differs
                close(routed, x[:m].double() @ wd.t(), 4 * BF16_EPS, what + " (dequant route)")
            else:
                assert torch.equal(routed, wide), f"{what}: affine_matmul's dequant route != its wide route"
            assert torch.equal(routed[:1], alone), f"{what}: row 0 among {m - 1} others != alone"
        # x as a view whose row stride TMA cannot describe (odd K + 1 elements): the cp.async form, the same bits
        shifted = torch.zeros(max(ms), k + 1, device=device, dtype=torch.bfloat16)
        shifted[:, 1:] = x
        view = shifted[:, 1:]
        assert torch.equal(ta.affine_matmul(view, packed, s, b, bits, group), ta.affine_matmul(x, packed, s, b, bits,
                                                                                               group)), \
            f"dense path bits={bits} {n}x{k}: a strided x != a contiguous one"


def check_affine_experts(mods, device, bits, group, m, n, k, e, repeat):
    ta = mods["affine"]
    if bits == 16:
        w = torch.randn(e, n, k, device=device).bfloat16()
        packed, s, b, wd = w, None, None, w.double()
    else:
        packed, s, b, wd = affine_weight((e, n, k), bits, group, device)
    x = torch.randn(m, k, device=device).bfloat16()
    ids = torch.randint(0, e, (m * repeat,), device=device)
    out = poisoned((m * repeat, n), torch.bfloat16, device)
    y = ta.affine_matmul_experts(x, packed, s, b, ids, bits, group, x_repeat=repeat, out=out)
    ref = torch.einsum("mk,mnk->mn", x.double().repeat_interleave(repeat, 0), wd[ids])
    close(y, ref, 4 * BF16_EPS, f"affine experts bits={bits} M={m}x{repeat}")


def check_expert_tiles(mods, device, cases=((1, 4, 16), (37, 5, 16), (300, 8, 32), (130, 256, 16), (576, 257, 8),
                                            (1024, 257, 8), (1025, 64, 8), (4096, 256, 32), (4608, 257, 8),
                                            (9000, 257, 16))):
    """The expert-tile kernels give the torch reference's tensors exactly (a stable sort, so the same order too), for
    (rows, experts, rows per tile) with an expert left without rows, E not a power of two, M not a multiple of the
    kernels' block, on both sides of the one-launch limit (launch_table "affine.tiles_one_max", 1024 rows; 576 = 64
    tokens x 9 slots over 257 experts, the 35B-A3B's decode at 64 streams; 4608 = pp512's 512 tokens x 9 slots,
    whose 36 blocks of counts the serial scan reads in chunks of 8 with the last one partial; 9000 rows: 71 blocks,
    more than the parallel scan's 64 a load, and a tile table whose tail the rank programs share). Past the one-launch limit also
    with every 9th row on the last expert (the shared one: more tiles than the rank programs). Both scan modes."""
    from deltaserve.kernels import launch_table

    ta = mods["affine"]
    gen = torch.Generator().manual_seed(3)
    heavy = [(m, e, r, True) for m, e, r in cases if m > launch_table.value("affine.tiles_one_max")]
    for m, e, r, shared in [(m, e, r, False) for m, e, r in cases] + heavy:
        ids = torch.randint(0, e, (m,), generator=gen)
        if m > 100:
            ids[ids == 1] = 2
        if shared:  # every 9th row on the last expert, as the MoE stacks the shared one: one expert of many tiles
            ids[8::9] = e - 1
        ids = ids.to(device)
        ref = ta.expert_tiles_reference(ids, e, r)
        got = ta.expert_tiles(ids, e, r)
        for name, a, b in zip(("tile_e", "tile_lo", "tile_hi", "order"), got, ref):
            assert torch.equal(a, b), f"expert_tiles {name}: M={m} E={e} R={r}"


# ---------------------------------------------------------------- MoE decode


def moe_problem(device, t, h, e, i, i_s, bits, group, router_bits=8):
    """Weights and inputs of a small MoE block; returns (kwargs for moe_decode, fp64 pieces for the reference)."""
    from deltaserve.kernels.triton_common import WeightSpec

    def weight(shape, wbits):
        if wbits == 16:
            w = (torch.randn(*shape, device=device) * shape[-1] ** -0.5).bfloat16()
            return w, w.double()
        p, s, b, wd = affine_weight(shape, wbits, group, device)
        return WeightSpec(p, s, b, wbits, group), wd

    router, r64 = weight((e, h), router_bits)
    gate, g64 = weight((e, i, h), bits)
    up, u64 = weight((e, i, h), bits)
    down, d64 = weight((e, h, i), bits)
    sg, sg64 = weight((i_s, h), bits)
    su, su64 = weight((i_s, h), bits)
    sd, sd64 = weight((h, i_s), bits)
    sgate = (torch.randn(1, h, device=device) * h**-0.5).bfloat16()
    x = torch.randn(t, h, device=device).bfloat16()
    res = torch.randn(t, h, device=device).bfloat16()
    kw = dict(router=router, gate=gate, up=up, down=down, shared_gate_proj=sg, shared_up=su, shared_down=sd,
              shared_gate=sgate, residual=res)
    ref = dict(r=r64, g=g64, u=u64, d=d64, sg=sg64, su=su64, sd=sd64, sgate=sgate.double(), res=res.double())
    return x, kw, ref


def moe_reference(x, ref, top_k, normalize=True):
    xd = x.double()
    w, ids = route_topk(xd @ ref["r"].t(), top_k, normalize)

    def mlp(v, g, u, d):
        return (F.silu(v @ g.t()) * (v @ u.t())) @ d.t()

    out = torch.zeros_like(xd)
    for t in range(x.shape[0]):
        for j in range(top_k):
            e = int(ids[t, j])
            out[t] += w[t, j].double() * mlp(xd[t], ref["g"][e], ref["u"][e], ref["d"][e])
    out += torch.sigmoid(xd @ ref["sgate"].t()) * mlp(xd, ref["sg"], ref["su"], ref["sd"])
    return out + ref["res"], ids, w


def check_moe(mods, device, t, h, e, i, i_s, top_k, bits, group, normalize=True, router_bits=8):
    md = mods["moe"]
    x, kw, ref = moe_problem(device, t, h, e, i, i_s, bits, group, router_bits)
    out = poisoned((t, h), torch.bfloat16, device)
    y, routing = md.moe_decode(x, top_k=top_k, normalize=normalize, return_routing=True, out=out, **kw)
    want, ids, w = moe_reference(x, ref, top_k, normalize)
    order = ids.sort(-1)
    assert torch.equal(routing.ids.long().cpu(), order.values.cpu()), "MoE routing picked other experts"
    close(routing.weights, w.gather(1, order.indices).double(), 1e-5, "MoE routing weights")
    # a few bf16 roundings (gate, up, h, expert outputs, out, residual sum) stack up: 8 ulps of the largest value
    close(y, want, 8 * BF16_EPS, f"MoE decode T={t} bits={bits}")


def check_moe_ties(mods, device):
    """Equal router logits go to the lower expert id (the routing contract)."""
    md = mods["moe"]
    h, e = 64, 8
    row = torch.randn(1, h, device=device).bfloat16()
    router = row.repeat(e, 1)  # every expert has the same logit
    router[5] = (row.float() * 0.5).bfloat16()  # two experts lower
    router[2] = (row.float() * 0.5).bfloat16()
    x = row.clone()
    routing = md.moe_route(x, router, 3)
    assert routing.ids.tolist() == [[0, 1, 3]], routing.ids.tolist()
    assert torch.allclose(routing.weights, torch.full_like(routing.weights, 1 / 3))


# ---------------------------------------------------------------- Gated DeltaNet


def check_conv(mods, device, c, kw, seqs, ctx, num_slots=8):
    gd = mods["gdn"]
    from deltaserve.kernels.conv1d import causal_conv1d

    slots = torch.randperm(num_slots)[: len(seqs)].tolist()
    t = sum(seqs)
    x = torch.randn(t, c, device=device).bfloat16()
    w = (torch.randn(c, 1, kw, device=device) * 0.5).bfloat16()
    pool = torch.randn(num_slots, c, kw - 1, device=device).bfloat16()
    for b, cl in enumerate(ctx):
        if cl == 0:
            pool[slots[b]] = float("nan")  # a fresh sequence must not read its slot
    pool0 = pool.clone()
    cu = torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), device=device, dtype=torch.int32)
    out = poisoned((t, c), torch.bfloat16, device)
    y = gd.causal_conv(x, w[:, 0, :], pool, cu, torch.tensor(slots, device=device), torch.tensor(ctx, device=device),
                       max(seqs), out=out)
    for b, n in enumerate(seqs):
        sl = slice(int(cu[b]), int(cu[b + 1]))
        ry, rs = causal_conv1d(x[sl].double(), w[:, 0, :].double(), None if ctx[b] == 0 else pool0[slots[b]].double())
        close(y[sl], ry, 2 * BF16_EPS, f"conv seq {b}")
        assert torch.equal(pool[slots[b]].double(), rs), f"conv state of seq {b}"


def check_conv_chunks(mods, device, c, kw, t, cuts, taps_major=False):
    """causal_conv of one sequence in chunks [0, cuts[0]), [cuts[0], cuts[1]), ... (each resumed from the state the
    last left) == the whole sequence at once, bit for bit, and the same final state: a token's output does not depend
    on whether its inputs come from its own block, an earlier block or the conv state. taps_major: the weight as a
    [C, K] view of a [K, C] tensor (the model's prefill layout)."""
    gd = mods["gdn"]
    x = torch.randn(t, c + 8, device=device).bfloat16()[:, 3 : 3 + c]  # a column view
    w = (torch.randn(c, kw, device=device) * 0.5).bfloat16()
    if taps_major:
        w = w.t().contiguous().t()
    slot = torch.tensor([1], device=device)
    whole_pool = torch.full((3, c, kw - 1), float("nan"), device=device).bfloat16()
    want = gd.causal_conv(x, w, whole_pool, torch.tensor([0, t], device=device, dtype=torch.int32), slot,
                          torch.tensor([0], device=device), t)
    pool = torch.full((3, c, kw - 1), float("nan"), device=device).bfloat16()
    got = []
    for lo, hi in zip([0, *cuts], [*cuts, t]):
        cu = torch.tensor([0, hi - lo], device=device, dtype=torch.int32)
        got.append(gd.causal_conv(x[lo:hi], w, pool, cu, slot, torch.tensor([lo], device=device), hi - lo))
    got = torch.cat(got)
    diff = (got != want).sum().item()
    assert diff == 0, f"conv in chunks at {cuts}: {diff} of {got.numel()} outputs differ from the whole sequence"
    assert torch.equal(pool[1], whole_pool[1]), f"conv in chunks at {cuts}: final state differs"


def check_conv_sections(mods, device, s1, s2, s3, kw, seqs, ctx, num_slots=8):
    """causal_conv(sections=(s1, s2)) == causal_conv's column slices, bit for bit, and the same conv states: q, k, v
    written as three contiguous tensors for the DeltaNet prefill."""
    gd = mods["gdn"]
    c = s1 + s2 + s3
    slots = torch.tensor(torch.randperm(num_slots)[: len(seqs)].tolist(), device=device)
    t = sum(seqs)
    x = torch.randn(t, c + 24, device=device).bfloat16()[:, 7 : 7 + c]  # a column view, like the fused projection's
    w = (torch.randn(c, kw, device=device) * 0.5).bfloat16()
    pool = torch.randn(num_slots, c, kw - 1, device=device).bfloat16()
    pool2 = pool.clone()
    cu = torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), device=device, dtype=torch.int32)
    ctx_t = torch.tensor(ctx, device=device)
    y = gd.causal_conv(x, w, pool, cu, slots, ctx_t, max(seqs))
    parts = gd.causal_conv(x, w, pool2, cu, slots, ctx_t, max(seqs), sections=(s1, s2))
    for got, lo, hi in zip(parts, (0, s1, s1 + s2), (s1, s1 + s2, c)):
        assert got.is_contiguous() and got.shape == (t, hi - lo), f"conv section [{lo}, {hi}): {tuple(got.shape)}"
        assert torch.equal(got, y[:, lo:hi]), f"conv section [{lo}, {hi}) != the plain conv's columns"
    assert torch.equal(pool, pool2), "sectioned conv: conv states differ"


def check_initial_states(mods, device, hv=4, dk=16, dv=32, num_slots=6, ctx=(3, 0, 9, 0, 1)):
    """gdn_prefill's initial states (triton_decode.initial_states): the slot's state where the context is nonzero,
    zeros where it is fresh (its slot poisoned), the same as torch's index_select and where, into fresh memory."""
    gd = mods["gdn"]
    pool = torch.randn(num_slots, hv, dk, dv, device=device)
    slots = torch.randperm(num_slots)[: len(ctx)].to(device)
    ctx_t = torch.tensor(ctx, device=device)
    for b, cl in enumerate(ctx):
        if cl == 0:
            pool[slots[b]] = float("nan")
    want = torch.stack([pool[int(s)] if cl else torch.zeros(hv, dk, dv, device=device) for s, cl in zip(slots, ctx)])
    strided = torch.empty(num_slots, hv, dk, 2 * dv, device=device)[..., ::2]  # torch's form serves this pool
    strided.copy_(pool)
    for mode, p in (("one launch", pool), ("torch", strided)):
        for dtype in (torch.int32, torch.int64):  # the cache's slots, and gdn_prefill's int64 copy of them
            got = gd.initial_states(p, slots.to(dtype), ctx_t)
            assert got.shape == want.shape and torch.equal(got, want), f"initial states ({mode}, {dtype})"


def gdn_inputs(device, b, hk, hv, dk, dv, num_slots):
    c = 2 * hk * dk + hv * dv
    return dict(
        qkv=torch.randn(b, c, device=device).bfloat16(),
        z=torch.randn(b, hv * dv, device=device).bfloat16(),
        a=torch.randn(b, hv, device=device).bfloat16(),
        b=torch.randn(b, hv, device=device).bfloat16(),
        a_log=torch.randn(hv, device=device),
        dt_bias=torch.randn(hv, device=device).bfloat16(),
        norm_w=(1 + 0.1 * torch.randn(dv, device=device)).bfloat16(),
        ssm=torch.randn(num_slots, hv, dk, dv, device=device) * 0.3,
    )


def gdn_step_reference(inp, i, hk, dk, state):
    """fp64 reference of one token of sequence row i: returns (normed output [Hv*dv], new state)."""
    from deltaserve.kernels.norm import gated_rms_norm

    hv, dv = inp["a"].shape[1], inp["norm_w"].numel()
    q, k, v = inp["qkv"][i].double().split([hk * dk, hk * dk, hv * dv])
    q, k = gdn_ref.l2norm(q.view(1, hk, dk)), gdn_ref.l2norm(k.view(1, hk, dk))
    g, beta = gdn_ref.gdn_gates(inp["a"][i : i + 1], inp["b"][i : i + 1], inp["a_log"], inp["dt_bias"])
    o, s = gdn_ref.gated_delta_recurrent(q, k, v.view(1, hv, dv), g.double(), beta.double(), state, dk**-0.5)
    y = gated_rms_norm(o.to(torch.bfloat16), inp["z"][i].view(1, hv, dv), inp["norm_w"], 1e-6)
    return y.reshape(-1), s


def check_gdn_decode(mods, device, b, hk, hv, dk, dv, fresh_rows=(1,), num_slots=6, dv_block="default"):
    """gdn_decode_step (dv_block: "default" = the library's, None = one program per head, or an int) against
    the fp64 step reference, rows fresh and resumed; outputs poisoned first."""
    gd = mods["gdn"]
    kw = {} if dv_block == "default" else dict(dv_block=dv_block)
    inp = gdn_inputs(device, b, hk, hv, dk, dv, num_slots)
    slots = torch.randperm(num_slots)[:b].to(device)
    ctx = torch.tensor([0 if i in fresh_rows else 5 + i for i in range(b)], device=device)
    for i in fresh_rows:
        if i < b:
            inp["ssm"][slots[i]] = float("nan")  # a fresh sequence must not read its slot
    ssm0 = inp["ssm"].clone()
    out = poisoned((b, hv * dv), torch.bfloat16, device)
    o = gd.gdn_decode_step(inp["qkv"], inp["z"], inp["a"], inp["b"], inp["a_log"], inp["dt_bias"], inp["norm_w"],
                           inp["ssm"], slots, ctx, hk, 1e-6, out=out, **kw)
    for i in range(b):
        st = None if int(ctx[i]) == 0 else ssm0[slots[i]].double()
        y, s = gdn_step_reference(inp, i, hk, dk, st)
        close(o[i], y.double(), 4 * BF16_EPS, f"gdn decode row {i}")  # 4 bf16 roundings in the norm
        close(inp["ssm"][slots[i]], s, 1e-5, f"gdn state row {i}")


def check_moe_down_early(mods, device, t, h, e, i, top_k, bits, group, shared=True):
    """moe_decode_v2 with down's early form (the routing and the picked experts' first weight chunks read before
    its PDL wait, gate/up opening late; triton_moe_gemv.down_early forced on) == the late form: routing and output
    bit for bit, outputs poisoned first. On CUDA with PDL this is the real overlap; under the interpreter (no PDL)
    it runs the early form's code (its loads, its branch order) without the wait."""
    m2 = mods["moe2"]
    x, kw, _ = moe_problem(device, t, h, e, i, i, bits, group, router_bits=8 if bits != 16 else 16)
    if not shared:
        for key in ("shared_gate_proj", "shared_up", "shared_down", "shared_gate"):
            kw.pop(key)
    got = {}
    original = m2.down_early
    try:
        for early in (False, True):
            m2.down_early = lambda _x, tensor_cores=False, early=early: early
            out = poisoned((t, h), torch.bfloat16, device)
            got[early] = m2.moe_decode_v2(x, top_k=top_k, return_routing=True, out=out, **kw)
    finally:
        m2.down_early = original
    (y0, rt0), (y1, rt1) = got[False], got[True]
    assert torch.equal(rt0.ids, rt1.ids) and torch.equal(rt0.weights, rt1.weights), "down early: routing differs"
    assert torch.equal(y0, y1), f"down early: outputs differ at T={t} shared={shared}"


def check_gdn_prep(mods, device, b, hk, hv, dk, dv, dv_block="default", bits=4, group=64):
    """gdn_decode_step(prep=(bits, group)): the step's outputs and state are those of the step without prep, bit for
    bit; xp equals prep_x's of those outputs bit for bit (exact power-of-two scaling), xs its group sums to fp32
    rounding (the head's tile adds a group in its own order); and a row's prep alone == among the batch, bit for
    bit. Outputs poisoned first."""
    import importlib

    prep_x = importlib.import_module("deltaserve.kernels.quant.triton_gemv").prep_x
    gd = mods["gdn"]
    kw = {} if dv_block == "default" else dict(dv_block=dv_block)
    inp = gdn_inputs(device, b, hk, hv, dk, dv, b + 2)
    slots = torch.arange(b, device=device) + 1
    ctx = torch.tensor([0 if i == 1 else 4 + i for i in range(b)], device=device)

    def run(rows, prep):
        pool = inp["ssm"].clone()
        pick = lambda t: t[rows].contiguous()
        args = (pick(inp["qkv"]), pick(inp["z"]), pick(inp["a"]), pick(inp["b"]), inp["a_log"], inp["dt_bias"],
                inp["norm_w"], pool, slots[rows], ctx[rows], hk, 1e-6)
        out = poisoned((len(rows), hv * dv), torch.bfloat16, device)
        return gd.gdn_decode_step(*args, out=out, prep=prep, **kw), pool

    every = list(range(b))
    plain, pool0 = run(every, None)
    (o, (xp, xs)), pool1 = run(every, (bits, group))
    assert torch.equal(o, plain) and torch.equal(pool1, pool0), "prep changed the step's outputs or state"
    xp_ref, xs_ref = prep_x(o, bits, group)
    assert not torch.isnan(xp).any() and torch.equal(xp, xp_ref.view_as(xp)), "xp != prep_x's"
    close(xs, xs_ref.view_as(xs).double(), 1e-6, f"xs bits={bits} group={group} dv_block={dv_block}")
    (_, (xp1, xs1)), _ = run([b - 1], (bits, group))
    assert torch.equal(xp1[0], xp[b - 1]) and torch.equal(xs1[0], xs[b - 1]), "prep: row alone != in the batch"
    with pytest.raises(ValueError, match="prep"):
        run(every, (bits, 2 * dv))  # a group wider than a head: not the step's to prep


def check_gdn_step_maxnreg(mods, device, b, hk, hv, dk, dv, bv, cap):
    """The decode step with a register cap (launch_table "deltanet.step_maxnreg") against the compiler's choice:
    outputs, the out projection's prep and the state bit for bit (ptxas allocates registers; the arithmetic is
    the same compiled code), outputs poisoned first."""
    from deltaserve.kernels import launch_table

    gd = mods["gdn"]
    inp = gdn_inputs(device, b, hk, hv, dk, dv, b + 2)
    slots = torch.arange(b, device=device) + 1
    ctx = torch.tensor([0 if i == 1 else 4 + i for i in range(b)], device=device)
    runs = []
    for caps in (((bv, cap),), ()):
        pool = inp["ssm"].clone()
        out = poisoned((b, hv * dv), torch.bfloat16, device)
        with launch_table.override({"deltanet.step_maxnreg": caps}):
            o, (xp, xs) = gd.gdn_decode_step(inp["qkv"], inp["z"], inp["a"], inp["b"], inp["a_log"], inp["dt_bias"],
                                             inp["norm_w"], pool, slots, ctx, hk, 1e-6, out=out, dv_block=bv,
                                             prep=(4, 64))
        runs.append((o, xp, xs, pool))
    for name, capped, free in zip(("output", "prep xp", "prep xs", "state"), *runs):
        assert torch.equal(capped, free), f"gdn step, {bv} columns: a cap of {cap} registers changes the {name}"


def check_gdn_split_vs_whole(mods, device, b, hk, hv, dk, dv, blocks):
    """The split step (dv_block columns per program, norm at the head's last arrival) against the one-program-
    per-head step: the state to fp32 rounding (the S^T k and S^T q sums over dk follow the tile's layout, so the
    two orders differ on the GPU: seen on the H200), the output within 2 bf16 ulp; and each split result is the
    same bit for bit on a repeated call (fresh state copies), i.e. independent of which program arrives last."""
    from deltaserve.kernels.triton_sync import arrival_counters

    gd = mods["gdn"]
    inp = gdn_inputs(device, b, hk, hv, dk, dv, b + 2)
    slots = torch.arange(b, device=device) + 1
    ctx = torch.tensor([0 if i == 1 else 4 + i for i in range(b)], device=device)
    args = lambda pool: (inp["qkv"], inp["z"], inp["a"], inp["b"], inp["a_log"], inp["dt_bias"], inp["norm_w"],
                         pool, slots, ctx, hk, 1e-6)
    whole_pool = inp["ssm"].clone()
    whole = gd.gdn_decode_step(*args(whole_pool), dv_block=None)
    for bv in blocks:
        runs = []
        for _ in range(2):
            pool = inp["ssm"].clone()
            out = poisoned((b, hv * dv), torch.bfloat16, device)
            runs.append((gd.gdn_decode_step(*args(pool), out=out, dv_block=bv), pool))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), f"dv_block {bv}: repeat"
        close(runs[0][1], whole_pool.double(), 1e-6, f"dv_block {bv}: state vs one program per head")
        close(runs[0][0], whole.double(), 2 * BF16_EPS, f"dv_block {bv} vs one program per head")
        assert int(arrival_counters(device, b * hv)[: b * hv].abs().sum()) == 0, "arrival counters not reset"


# ---------------------------------------------------------------- attention


def paged_problem(device, ctx, seqs, hq, hkv, d, bs, num_blocks=None):
    """Random caches with sequence b's blocks scattered; returns a dict with q, k, v, caches, tables, slots."""
    need = [-(-(c + n) // bs) for c, n in zip(ctx, seqs)]
    num_blocks = num_blocks or sum(need) + 3
    perm = torch.randperm(num_blocks).tolist()
    tables, i = [], 0
    for nb in need:
        tables.append(perm[i : i + nb])
        i += nb
    bt = torch.full((len(seqs), max(need)), -1, dtype=torch.int32)
    for b, tb in enumerate(tables):
        bt[b, : len(tb)] = torch.tensor(tb)
    slots = [tables[b][p // bs] * bs + p % bs for b, (c, n) in enumerate(zip(ctx, seqs)) for p in range(c, c + n)]
    t = sum(seqs)
    return dict(
        kc=torch.randn(num_blocks, bs, hkv, d, device=device).bfloat16(),
        vc=torch.randn(num_blocks, bs, hkv, d, device=device).bfloat16(),
        q=torch.randn(t, hq, d, device=device).bfloat16(),
        k=torch.randn(t, hkv, d, device=device).bfloat16(),
        v=torch.randn(t, hkv, d, device=device).bfloat16(),
        tables=bt.to(device), slots=torch.tensor(slots, device=device),
        cu=torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), device=device, dtype=torch.int32),
    )


def settled_decode(tp, *args, **kw):
    """paged_decode_attention's settled form (the K rows of every position but a row's newest requested before the
    split programs' PDL wait) into a NaN-poisoned output."""
    q = args[0]
    return tp.paged_decode_attention(*args, out=poisoned(q.shape, q.dtype, q.device), settled=True, **kw)


def check_attention(mods, device, ctx, seqs, hq, hkv, d, bs):
    tp = mods["attn"]
    p = paged_problem(device, ctx, seqs, hq, hkv, d, bs)
    kc2, vc2 = p["kc"].clone(), p["vc"].clone()
    tp.write_kv(p["kc"], p["vc"], p["slots"], p["k"], p["v"])
    attn_ref.write_kv(kc2, vc2, p["slots"], p["k"], p["v"])
    assert torch.equal(p["kc"], kc2) and torch.equal(p["vc"], vc2), "write_kv differs from the reference"
    scale = d**-0.5
    ref = attn_ref.paged_attention(p["q"].double(), p["kc"].double(), p["vc"].double(), p["tables"], ctx, seqs, scale)
    out = poisoned(p["q"].shape, torch.bfloat16, device)
    o = tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"], torch.tensor(ctx, device=device),
                                   scale, max(seqs), out=out)
    # P is rounded to bf16 before P.V (as flash attention does): a few ulps of the output scale
    close(o, ref, 4 * BF16_EPS, "paged prefill attention")
    # the output gate in the epilogue, read in place from a column view (as the prefill's q|gate projection holds
    # it): o rounded, times bf16(sigmoid(gate)), rounded once; the same bits as the gate copied first
    qg = torch.randn(p["q"].shape[0], hq, 2 * d, device=device).bfloat16()
    gate = qg[..., d:]
    og = tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"], torch.tensor(ctx, device=device),
                                    scale, max(seqs), out=poisoned(p["q"].shape, torch.bfloat16, device), gate=gate)
    want = o.double() * torch.sigmoid(gate.double())
    close(og, want, 4 * BF16_EPS, "paged prefill attention, gated")
    # the kernel's launch (warps, pipeline stages) never changes a bit (prefill_launch; the interpreter ignores
    # warps and stages, so it checks one launch; Triton's 3 stages and 2, 5, 7)
    launches = ((8, None), (4, None), (8, 2), (8, 5), (8, 7))
    for launch in launches if torch.device(device).type == "cuda" else launches[:1]:
        alt = tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"],
                                         torch.tensor(ctx, device=device), scale, max(seqs),
                                         out=poisoned(p["q"].shape, torch.bfloat16, device), launch=launch)
        assert torch.equal(alt, o), f"paged prefill attention, launch {launch} != the default launch"
    assert torch.equal(og, tp.paged_prefill_attention(p["q"], p["kc"], p["vc"], p["tables"], p["cu"],
                                                      torch.tensor(ctx, device=device), scale, max(seqs),
                                                      gate=gate.contiguous())), "prefill gate in place != copied"
    last = p["cu"][1:].long() - 1
    lens = torch.tensor([c + n for c, n in zip(ctx, seqs)], device=device, dtype=torch.int32)
    out = poisoned((len(seqs), hq, d), torch.bfloat16, device)
    od = tp.paged_decode_attention(p["q"][last], p["kc"], p["vc"], p["tables"], lens, scale, int(lens.max()),
                                   out=out)
    close(od, ref[last], 4 * BF16_EPS, "paged decode attention")
    # other merge shapes (a deployment's merge_shape: BSP splits a step, BD columns a program) mean the same, and a
    # row alone gets the bits it gets in the batch under each (BSP 2: a row of 3 splits takes two steps)
    for merge in ((2, 16), (8, 32)) + (((16, 64), (16, 128), (16, 256)) if d >= 256 else ()):
        out = poisoned((len(seqs), hq, d), torch.bfloat16, device)
        om = tp.paged_decode_attention(p["q"][last], p["kc"], p["vc"], p["tables"], lens, scale, int(lens.max()),
                                       out=out, merge=merge)
        close(om, ref[last], 4 * BF16_EPS, f"paged decode attention, merge {merge}")
        b = len(seqs) - 1
        alone = tp.paged_decode_attention(p["q"][last][b:], p["kc"], p["vc"], p["tables"][b:], lens[b:], scale,
                                          int(lens.max()), merge=merge)
        assert torch.equal(alone[0], om[b]), f"paged decode attention, merge {merge}: a row alone != in the batch"
    assert torch.equal(settled_decode(tp, p["q"][last], p["kc"], p["vc"], p["tables"], lens, scale, int(lens.max())),
                       od), "paged decode attention: the settled form changes the bits"
    # BD (columns a program) is no arithmetic: the default's BSP with other column widths gives its bits
    for bd in [c for c in (16, 64) if c < d]:
        out = poisoned((len(seqs), hq, d), torch.bfloat16, device)
        ob = tp.paged_decode_attention(p["q"][last], p["kc"], p["vc"], p["tables"], lens, scale, int(lens.max()),
                                       out=out, merge=(tp.merge_shape()[0], bd))
        assert torch.equal(ob, od), f"paged decode attention: merge columns {bd} change the bits"


# ---------------------------------------------------------------- norms


def check_norms(mods, device, rows, n, dv):
    nm = mods["norm"]
    from deltaserve.kernels import norm as norm_ref

    x = torch.randn(rows, n, device=device).bfloat16()
    r = torch.randn(rows, n, device=device).bfloat16()
    w = (0.1 * torch.randn(n, device=device)).bfloat16()
    y = nm.rms_norm(x, w, 1e-6, 1.0, out=poisoned((rows, n), torch.bfloat16, device))
    close(y, norm_ref.rms_norm(x.double(), w.double(), 1e-6, 1.0), 2 * BF16_EPS, "rms_norm")
    y2, r2 = nm.add_rms_norm(x, r, w, 1e-6, 0.0)
    if INTERPRETED:
        close(r2, (x.double() + r.double()), BF16_EPS, "add_rms_norm residual sum")
    else:
        assert torch.equal(r2, x + r), "add_rms_norm residual sum"
    close(y2, norm_ref.rms_norm(r2.double(), w.double(), 1e-6, 0.0), 2 * BF16_EPS, "add_rms_norm")
    xg = torch.randn(rows, 3, dv, device=device).bfloat16()
    z = torch.randn(rows, 3, dv, device=device).bfloat16()
    wg = (1 + 0.1 * torch.randn(dv, device=device)).bfloat16()
    yg = nm.gated_rms_norm(xg, z, wg, 1e-6, out=poisoned(xg.shape, torch.bfloat16, device))
    close(yg, norm_ref.gated_rms_norm(xg, z, wg, 1e-6).double(), 2 * BF16_EPS, "gated_rms_norm")
    # z as the prefill holds it (a column view of the fused in-projection's output, token pitch > 3 dv) and x with
    # a head pitch of its own: read in place, the same bits as from contiguous copies and as rows of a 2-D copy
    wide = torch.randn(rows, 5 * dv + 7, device=device).bfloat16()
    zv = wide[:, 2 * dv + 7:].view(rows, 3, dv)
    xv = torch.randn(rows, 3, 2 * dv, device=device).bfloat16()[..., dv:]
    ys = nm.gated_rms_norm(xv, zv, wg, 1e-6, out=poisoned(xg.shape, torch.bfloat16, device))
    assert ys.is_contiguous() and tuple(ys.shape) == (rows, 3, dv)
    assert torch.equal(ys, nm.gated_rms_norm(xv.contiguous(), zv.contiguous(), wg, 1e-6)), "gated norm in place"
    flat = nm.gated_rms_norm(xv.reshape(rows * 3, dv), zv.reshape(rows * 3, dv), wg, 1e-6)
    assert torch.equal(ys, flat.view(rows, 3, dv)), "gated norm: in place != copied rows"
    # add_rms_norm's prep of its output (a power-of-two width): the full GEMV prep equals prep_x's of y bit for
    # bit, and sums_only writes the same group sums alone (the tensor-core MoE's input norm), made from its
    # registers; every group sum is the pairwise tree of pairwise_sums (fp32 adds of elements 2i and 2i + 1, ...)
    prep_x = importlib.import_module("deltaserve.kernels.quant.triton_gemv").prep_x
    for n2 in (128, n if n & (n - 1) == 0 else 256):
        x2, r2 = (torch.randn(rows, n2, device=device).bfloat16() * 3 for _ in range(2))
        w2 = (0.1 * torch.randn(n2, device=device)).bfloat16()
        y_full, s_full, (xp_full, xs_full) = nm.add_rms_norm(x2, r2, w2, 1e-6, 1.0, prep=(4, 64))
        y_sums, s_sums, (xp_sums, xs_sums) = nm.add_rms_norm(x2, r2, w2, 1e-6, 1.0, prep=(4, 64), sums_only=True)
        xp_ref, xs_ref = prep_x(y_full, 4, 64)
        assert torch.equal(xp_full, xp_ref.view_as(xp_full)) and torch.equal(xs_full, xs_ref), \
            f"norm prep != prep_x's (N={n2})"
        assert xp_sums is None and torch.equal(y_sums, y_full) and torch.equal(s_sums, s_full), "sums_only: y / r"
        assert torch.equal(xs_sums, xs_full), f"sums_only: group sums != the full prep's (N={n2})"
        tree = y_full.float().view(rows, n2 // 64, 64)
        while tree.shape[-1] > 1:
            tree = tree[..., 0::2] + tree[..., 1::2]
        assert torch.equal(xs_ref, tree[..., 0]), f"group sums are not the pairwise tree's (N={n2})"


# ---------------------------------------------------------------- fused decode paths (one launch instead of several)


def gemv_weight(n, k, bits, group, device):
    """((packed, scales, biases) or (dense, None, None), fp64 W) for affine_gemv."""
    if bits == 16:
        w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
        return (w, None, None), w.double()
    p, s, b, wd = affine_weight((n, k), bits, group, device)
    return (p, s, b), wd


def check_gemv_inline_prep(mods, device, bits, group, m, n, k, dtype=torch.bfloat16):
    """The one-launch GEMV (prep inlined) against fp64 and against the prep_x + GEMV path. The products are the
    same bits (exact power-of-two pre-scale); the group sums add the same values in another fixed order, so the
    two paths may differ in the last fp32 bit of a group sum: compared to 1/2 bf16 ulp, and their equality is
    reported by the return value (True where bit-identical)."""
    g = mods["gemv"]
    (p, s, b), wd = gemv_weight(n, k, bits, group, device)
    x = torch.randn(m, k, device=device).to(dtype)  # bf16 rows are read in pairs, fp16 ones one value at a time
    out = poisoned((m, n), dtype, device)
    y = g.affine_gemv(x, p, s, b, bits, group, out=out, inline_prep=True)
    close(y, x.double() @ wd.t(), 2 * BF16_EPS, f"inline-prep gemv bits={bits} g={group} M={m} {dtype}")
    y0 = g.affine_gemv(x, p, s, b, bits, group, out=poisoned((m, n), dtype, device), inline_prep=False)
    close(y, y0.double(), BF16_EPS, f"inline-prep vs prep path bits={bits} g={group} M={m}")
    return torch.equal(y, y0)


def check_gemv_inline_invariance(mods, device, n, k, others=(1, 3, 15)):
    """Row r alone == row r among others, bit for bit (r = 0 and the last row), with the prep inlined and with the
    prep launch (the lm_head's path under the auto choice)."""
    g = mods["gemv"]
    x = torch.randn(16, k, device=device).bfloat16()
    for bits, group, inline in ((4, 64, True), (8, 32, True), (4, 64, False)):
        (p, s, b), _ = gemv_weight(n, k, bits, group, device)
        alone = g.affine_gemv(x[:1], p, s, b, bits, group, inline_prep=inline)
        for o in others:
            got = g.affine_gemv(x[: o + 1], p, s, b, bits, group, inline_prep=inline)
            assert torch.equal(got[:1], alone), f"bits {bits} inline {inline}: row 0 alone != among {o} others"
            last = g.affine_gemv(x[o : o + 1], p, s, b, bits, group, inline_prep=inline)
            assert torch.equal(got[o : o + 1], last), f"bits {bits} inline {inline}: row {o} alone != among {o}"


def conv_problem(device, m, c, kw, num_slots, fresh):
    """Conv weight [C, K] (a strided view, as conv1d.weight[:, 0, :]), a pool [S, C, K-1] with the fresh rows'
    slots NaN-poisoned, distinct slots per row, context lengths (0 for the fresh rows)."""
    w = (torch.randn(c, 1, kw, device=device) * 0.5).bfloat16()[:, 0, :]
    pool = torch.randn(num_slots, c, kw - 1, device=device).bfloat16()
    slots = torch.randperm(num_slots)[:m].to(device)
    ctx = torch.tensor([0 if i in fresh else 3 + i for i in range(m)], device=device, dtype=torch.int32)
    for i in fresh:
        if i < m:
            pool[slots[i]] = float("nan")
    return w, pool, slots, ctx


def _affine_gemv_of(mods, bits, group):
    """The default GEMV for the conv checks: (p, s, b) -> f(x, out=None, conv=None) through affine_gemv."""
    g = mods["gemv"]

    def make(p, s, b):
        return lambda x, out=None, conv=None: g.affine_gemv(x, p, s, b, bits, group, out=out, conv=conv)
    return make


def check_gemv_conv(mods, device, bits, group, m, c, extra, k, kw=4, fresh=(1,), gemv=None):
    """gemv(conv=...) == gemv then causal_conv on the first C features, bit for bit (outputs and pool), and
    against fp64: features >= C plain, < C SiLU(conv) of the bf16 projection over [state ; y]. gemv: a factory
    (p, s, b) -> f(x, out=None, conv=None) for the GEMV under test (default: affine_gemv; the tensor-core GEMV
    passes one that repacks the weight)."""
    from deltaserve.kernels.conv1d import causal_conv1d

    gd = mods["gdn"]
    n = c + extra
    (p, s, b), wd = gemv_weight(n, k, bits, group, device)
    run = (gemv or _affine_gemv_of(mods, bits, group))(p, s, b)
    x = torch.randn(m, k, device=device).bfloat16()
    w, pool, slots, ctx = conv_problem(device, m, c, kw, 3 * m + 2, fresh)
    pool0, pool1 = pool.clone(), pool.clone()
    out = poisoned((m, n), torch.bfloat16, device)
    y = run(x, out=out, conv=(w, pool, slots, ctx, c))
    plain = run(x)
    cu = torch.arange(m + 1, device=device, dtype=torch.int32)
    conv = gd.causal_conv(plain[:, :c].contiguous(), w, pool1, cu, slots, ctx, 1)
    assert torch.equal(y[:, c:], plain[:, c:]), "fused conv GEMV: the plain features differ from the plain GEMV"
    assert torch.equal(y[:, :c], conv), "fused conv GEMV != the plain GEMV + causal_conv (conv channels)"
    assert torch.equal(pool, pool1), "fused conv GEMV: conv pool differs from causal_conv's"
    ref = x.double() @ wd.t()
    if extra:
        close(y[:, c:], ref[:, c:], 2 * BF16_EPS, "fused conv GEMV plain features")
    yb = ref[:, :c].bfloat16().double()
    for i in range(m):
        st = None if int(ctx[i]) == 0 else pool0[slots[i]].double()
        ry, rs = causal_conv1d(yb[i : i + 1], w.double(), st)
        close(y[i : i + 1, :c], ry, 4 * BF16_EPS, f"fused conv GEMV row {i} conv channels")
        close(pool[slots[i]], rs, 2 * BF16_EPS, f"fused conv GEMV row {i} new conv state")
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[slots.cpu()] = False
    assert torch.equal(pool[untouched.to(device)], pool0[untouched.to(device)]), "other slots were written"


def check_gemv_conv_early(mods, device, bits, group, c, extra, k, kw=4, fresh=(1,)):
    """check_gemv_conv at one row, the form whose conv inputs are requested before the GEMV's PDL wait: the same
    bits as the GEMV then causal_conv, and fp64."""
    check_gemv_conv(mods, device, bits, group, 1, c, extra, k, kw=kw, fresh=fresh)


def check_gemv_conv_invariance(mods, device, c, extra, k, others=(1, 3, 15), gemv=None):
    """Fused conv GEMV: row 0 (and row o) alone == among o others, output and conv state, bit for bit. gemv: as
    in check_gemv_conv."""
    (p, s, b), _ = gemv_weight(c + extra, k, 4, 64, device)
    gemv_fn = (gemv or _affine_gemv_of(mods, 4, 64))(p, s, b)
    x = torch.randn(16, k, device=device).bfloat16()
    w, pool, slots, ctx = conv_problem(device, 16, c, 4, 40, fresh=(2,))
    pool = pool.nan_to_num()

    def run(rows):
        pl = pool.clone()
        y = gemv_fn(x[rows], conv=(w, pl, slots[rows], ctx[rows], c))
        return y, pl[slots[rows]]

    alone = run(slice(0, 1))
    for o in others:
        y, st = run(slice(0, o + 1))
        assert torch.equal(y[:1], alone[0]) and torch.equal(st[:1], alone[1]), f"conv GEMV row 0 among {o}"
        last = run(slice(o, o + 1))
        assert torch.equal(y[o:], last[0]) and torch.equal(st[o:], last[1]), f"conv GEMV row {o} among {o}"


def check_moe_v2_fused(mods, device, t, h, e, i, top_k, bits, group, shared=True):
    """moe_decode_v2's 4-launch path (top-k at the router's last arrival, prep inlined) == its 6+-launch path (top-k
    and prep launches of their own): routing bit for bit (the same _topk on the same logits), outputs within 1 bf16
    ulp (the inline group sums add in another fixed order), equal to v1 moe_decode (its top-k in every gate/up
    program) within the block's rounding. Without a shared expert the shared weight
    must come back exactly 0 (written by the router kernel, no zeros fill). Returns whether the paths' outputs are
    bit-identical."""
    md, m2 = mods["moe"], mods["moe2"]
    x, kw, _ = moe_problem(device, t, h, e, i, i, bits, group, router_bits=8 if bits != 16 else 16)
    if not shared:
        for key in ("shared_gate_proj", "shared_up", "shared_down", "shared_gate"):
            kw.pop(key)
    out = poisoned((t, h), torch.bfloat16, device)
    y, rt = m2.moe_decode_v2(x, top_k=top_k, return_routing=True, out=out, **kw)
    y0, rt0 = m2.moe_decode_v2(x, top_k=top_k, return_routing=True, separate_topk=True, inline_prep=False, **kw)
    old = md.moe_decode(x, top_k=top_k, **kw)
    assert torch.equal(rt.ids, rt0.ids), f"router top-k ids {rt.ids.tolist()} != own launch {rt0.ids.tolist()}"
    assert torch.equal(rt.weights, rt0.weights), "router top-k weights != own launch"
    assert torch.equal(rt.shared_weight, rt0.shared_weight), "shared weight differs (own launch)"
    if not shared:
        assert torch.equal(rt.shared_weight, torch.zeros_like(rt.shared_weight)), "no shared expert: weight != 0"
    close(y, y0.double(), BF16_EPS, f"MoE v2 vs its unfused launches T={t} bits={bits} shared={shared}")
    close(y, old.double(), 8 * BF16_EPS, f"MoE v2 vs v1 T={t} bits={bits} shared={shared}")
    return torch.equal(y, y0)


def check_router_last_arrival(mods, device, ts=(1, 7, 64), h=64, e=12, top_k=3):
    """moe_route's top-k at each token's last-arriving router program == the top-k in its own launch, bit for bit,
    for several T and on repeated calls (the arrival counters must be back at zero after every launch), with
    the logits poisoned between calls so that a top-k reading stale values would show."""
    from deltaserve.kernels.triton_sync import arrival_counters

    md = mods["moe"]
    _, kw, _ = moe_problem(device, 1, h, e, 32, 32, 4, 32, router_bits=8)
    for t in ts:
        x = torch.randn(t, h, device=device).bfloat16()
        want = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"], separate_topk=True)
        for rep in range(3):
            got = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"])
            assert torch.equal(got.ids, want.ids), f"T={t} call {rep}: ids {got.ids.tolist()} != {want.ids.tolist()}"
            assert torch.equal(got.weights, want.weights), f"T={t} call {rep}: weights differ"
            assert torch.equal(got.shared_weight, want.shared_weight), f"T={t} call {rep}: shared weight differs"
            assert int(arrival_counters(device, t)[: t].abs().sum()) == 0, f"T={t}: counters not reset"


def check_route_tiles(mods, device, ts=(1, 33), h=64, e=12, top_k=3, rows=(8, 16), group=32, reps=3):
    """moe_route's tiles from the router's one launch (triton_route_tiles) == the split path's (the top-k launch with the shared slot, then mma_expert_tiles), bit for bit: ids, weights, the
    shared weight and the four tile tensors, for T on both sides of the bitmap's first word (32 tokens) and several
    rows per tile, on repeated calls with the last call's outputs poisoned (their blocks come back from the caching
    allocator), and the arrival counters (the bitmap and the starts' scratch among them) back at zero."""
    from deltaserve.kernels.moe import triton_route_tiles as rt
    from deltaserve.kernels.moe.triton_route_tiles import BITMAP_AT
    from deltaserve.kernels.triton_sync import arrival_counters

    md = mods["moe"]
    _, kw, _ = moe_problem(device, 1, h, e, 2 * group, 2 * group, 4, group, router_bits=8)
    for t in ts:
        x = torch.randn(t, h, device=device).bfloat16()
        for r in rows:
            with mock.patch.object(rt, "route_tiles_fit", lambda *args: False):  # the split path
                want = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"], separate_topk=True,
                                    shared_slot=e, tile_rows=r)
            for rep in range(reps):
                got = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"], shared_slot=e, tile_rows=r)
                what = f"route tiles T={t} rows={r} call {rep}"
                assert torch.equal(got.ids, want.ids), f"{what}: ids {got.ids.tolist()} != {want.ids.tolist()}"
                assert torch.equal(got.weights, want.weights), f"{what}: weights differ"
                assert torch.equal(got.shared_weight, want.shared_weight), f"{what}: shared weight differs"
                assert got.tiles.rows == r, what
                for name, a, b in zip(("tile_e", "tile_lo", "tile_hi", "order"), got.tiles[:4], want.tiles[:4]):
                    assert torch.equal(a, b), f"{what}: {name} {a.tolist()} != {b.tolist()}"
                assert int(arrival_counters(device, 1)[: BITMAP_AT * 16].abs().sum()) == 0, f"{what}: counters"
                for out in (*got[:3], *got.tiles[:4]):
                    out.fill_(-7)


def check_router_norm(mods, device, ts=(1, 3, 16), h=128, e=12, top_k=3, group=32, reps=2):
    """route_normed (the router launch making its input's add_rms_norm itself) == add_rms_norm(prep=(4, 64),
    sums_only=True) then moe_route on its output, bit for bit: y, the residual sum, y's group sums, ids, weights and
    the shared weight, with and without the stacked shared slot (shared_slot = E) and at both norm offsets (HF's 1,
    MLX's 0), on repeated calls with the last call's outputs poisoned, both ways of reading the norm's row for the
    dot product (router_norm_read: a scratch row, or made again at the x loads, the kernel's two forms); and y
    against fp64."""
    from deltaserve.kernels import norm as norm_ref

    md, nm = mods["moe"], mods["norm"]
    _, kw, _ = moe_problem(device, 1, h, e, 2 * group, 2 * group, 4, group, router_bits=8)
    for t in ts:
        x = torch.randn(t, h, device=device).bfloat16() * 3
        res = torch.randn(t, h, device=device).bfloat16()
        w = (0.1 * torch.randn(h, device=device)).bfloat16()
        for offset, slot in ((1.0, None), (0.0, e)):
            y, r, (_, xs) = nm.add_rms_norm(x, res, w, 1e-6, offset, prep=(4, 64), sums_only=True)
            want = md.moe_route(y, kw["router"], top_k, True, kw["shared_gate"], separate_topk=True,
                                shared_slot=slot)
            what = f"router norm T={t} offset={offset} slot={slot}"
            close(y, norm_ref.rms_norm(r.double(), w.double(), 1e-6, offset), 2 * BF16_EPS, what + ": y vs fp64")
            for rep, read in enumerate(("scratch", "tiles") * reps):
                with mock.patch.object(md, "router_norm_read", lambda read=read: read):
                    got, gy, gr, gxs = md.route_normed(x, res, w, 1e-6, offset, kw["router"], top_k, True,
                                                       kw["shared_gate"], shared_slot=slot)
                for name, a, b in (("y", gy, y), ("r", gr, r), ("xs", gxs, xs), ("ids", got.ids, want.ids),
                                   ("weights", got.weights, want.weights),
                                   ("shared weight", got.shared_weight, want.shared_weight)):
                    assert torch.equal(a, b), f"{what} call {rep} ({read}): {name} differs"
                for out in (gy, gr, gxs, *got[:3]):
                    out.fill_(float("nan") if out.is_floating_point() else -7)
                del got, gy, gr, gxs, out
    for bad in ((torch.zeros(17, h), "17 tokens"), (torch.zeros(1, 96), "96 features")):
        try:
            z = bad[0].to(device).bfloat16()
            md.route_normed(z, z, torch.zeros(z.shape[1], device=device).bfloat16(), 1e-6, 1.0, kw["router"], top_k)
        except ValueError as exc:
            assert "route_normed" in str(exc), str(exc)
        else:
            raise AssertionError(f"route_normed accepted {bad[1]}")


def check_router_rows(mods, device, ts=(1, 13, 40), h=64, e=12, router_bits=8, group=32, blocks=(1, 4),
                      gluon_shapes=()):
    """The router's logits and shared-gate sigmoid from the multi-row GEMV launch (router_rows_min(): from that many
    tokens on) == the per-token router launch's, bit for bit (the same per-row arithmetic), for T on both
    sides of a row block (8 tokens a program) and with the shared gate, with each program taking `blocks` row
    blocks of experts in turn (DELTASERVE_ROUTER_ROW_BLOCKS, an experiment; the last program's blocks past E masked); and a dense
    router keeps the per-token launch (the same result either way). gluon_shapes: "bn,mb" program shapes of the
    Gluon rows kernel (moe/gluon_router_rows; the router must be the format it serves, asserted) compared the same
    way, with its output poisoned first."""
    from deltaserve.kernels.moe import gluon_router_rows as grr

    md = mods["moe"]
    _, kw, _ = moe_problem(device, 1, h, e, 2 * group, 2 * group, 4, group, router_bits=router_bits)
    r, g = md._router_specs(torch.zeros(1, h, device=device).bfloat16(), kw["router"], 3, kw["shared_gate"])
    be, warps = md.merged_config(None)["router"]
    for t in ts:
        x = torch.randn(t + 3, h, device=device).bfloat16()[2 : 2 + t]  # an offset view: rows at a stride of h
        with mock.patch.object(md, "router_rows_min", lambda: 1 << 62):  # the per-token launch
            want = md._router_logits(x, r, g, True, md.merged_config(None))
            ref = md.moe_route(x, kw["router"], 3, True, kw["shared_gate"], separate_topk=True)
        variants = [("triton", {"DELTASERVE_ROUTER_ROW_BLOCKS": str(nb)}, None) for nb in blocks]
        variants += [("gluon", {}, tuple(int(v) for v in sh.split(","))) for sh in gluon_shapes]
        for kernel, env, shape in variants:
            label = f"{kernel} {env or shape}"
            with mock.patch.dict(os.environ, env), mock.patch.object(md, "router_rows_min", lambda: 1), \
                    mock.patch.object(md, "rows_fit", md.rows_fit if kernel == "gluon" else (lambda *args: False)), \
                    mock.patch.object(grr, "rows_launch", (lambda: shape) if shape else grr.rows_launch):
                if shape:
                    assert grr.rows_fit(x, r, md._router_cg(r, be, warps), warps), "the Gluon rows kernel must serve"
                    direct = poisoned((t, r.n), torch.float32, device)
                    grr.router_rows_logits(x, r, direct)
                    assert torch.equal(direct, want[0]), f"router rows T={t}, {label}: Gluon logits differ"
                got = md._router_logits(x, r, g, True, md.merged_config(None))
                routed = md.moe_route(x, kw["router"], 3, True, kw["shared_gate"], separate_topk=True)
            assert torch.equal(got[0], want[0]), f"router rows T={t}, {label}: logits differ"
            assert torch.equal(got[1], want[1]), f"router rows T={t}, {label}: shared gate differs"
            assert torch.equal(routed.ids, ref.ids) and torch.equal(routed.weights, ref.weights), f"T={t}: routing"


def check_moe_v2_fused_ties(mods, device):
    """Equal router logits go to the lower expert id in the fused top-k too (as check_moe_ties for moe_route)."""
    h, e = 64, 8
    row = torch.randn(1, h, device=device).bfloat16()
    router = row.repeat(e, 1)
    router[5] = (row.float() * 0.5).bfloat16()
    router[2] = (row.float() * 0.5).bfloat16()
    _, kw, _ = moe_problem(device, 1, h, e, 32, 32, 4, 32)
    kw["router"] = router
    _, rt = mods["moe2"].moe_decode_v2(row.clone(), top_k=3, return_routing=True, **kw)
    assert rt.ids.tolist() == [[0, 1, 3]], rt.ids.tolist()
    assert torch.allclose(rt.weights, torch.full_like(rt.weights, 1 / 3))


def check_topk_contract(mods, device, e, k, warps=4, normalize=True):
    """The in-kernel top-k (_topk, used by moe_route and inside the fused gate/up) on adversarial fp32 logits:
    ties among negatives, -0 against +0, integer-valued logits (many ties), E not a power of two. Ids must equal
    route_topk's (ties to the lower id) in ascending order, weights to fp32 rounding; at any num_warps (the split
    launch's router.topk_warps)."""
    md = mods["moe"]
    lg = torch.randn(4, e, device=device) * 3
    lg[0, ::3] = -1.5
    lg[1] = 0.0
    lg[1, 1::4] = -0.0
    lg[2] = lg[2].round()
    ids = torch.full((4, k), -1, dtype=torch.int32, device=device)
    w = poisoned((4, k), torch.float32, device)
    md._topk_kernel[(4,)](lg, ids, w, lg, e, EP=1 << (e - 1).bit_length(), TOPK=k, NORMALIZE=normalize,
                          num_warps=warps)
    rw, rid = route_topk(lg.double().cpu(), k, normalize)
    order = rid.sort(-1)
    assert torch.equal(ids.long().cpu(), order.values), f"top-k ids {ids.tolist()} != {order.values.tolist()}"
    close(w.cpu(), rw.gather(1, order.indices).double(), 1e-6, "top-k weights")
    # the shared expert as slot k: rows of k + 1, the routed slots' bits unchanged
    sw = torch.rand(4, device=device)
    ids_s = torch.full((4, k + 1), -1, dtype=torch.int32, device=device)
    w_s = poisoned((4, k + 1), torch.float32, device)
    md._topk_kernel[(4,)](lg, ids_s, w_s, sw, e, EP=1 << (e - 1).bit_length(), TOPK=k, NORMALIZE=normalize,
                          SHARED_ID=e, num_warps=warps)
    assert torch.equal(ids_s[:, :k], ids) and torch.equal(w_s[:, :k], w), "shared slot changed the routed slots"
    assert (ids_s[:, k] == e).all() and torch.equal(w_s[:, k], sw), "shared slot: (id, weight) not (E, sw)"


def check_topk_same_bits_any_warps(mods, device, e=256, k=8, tokens=4096):
    """The routing weights of _topk bit for bit the same at 1, 2, 4 and 8 warps (the launches that route a token
    differ in warps: the router's last arrival, the separate top-k, the route tiles), over many random tokens,
    and the same in the separate top-k launch as in moe_route's last-arrival top-k: the normaliser adds its k
    terms in one order whatever the layout (a 16-row verify and an 8-row decode step routed one token one bit
    apart before, and the 8-stream drafted replies differed from undrafted ones)."""
    md = mods["moe"]
    gen = torch.Generator(device="cpu").manual_seed(21)
    lg = (torch.randn(tokens, e, generator=gen) * 2).to(device)
    ep = 1 << (e - 1).bit_length()
    runs = []
    for warps in (1, 2, 4, 8):
        ids = torch.full((tokens, k), -1, dtype=torch.int32, device=device)
        w = poisoned((tokens, k), torch.float32, device)
        md._topk_kernel[(tokens,)](lg, ids, w, lg, e, EP=ep, TOPK=k, NORMALIZE=True, num_warps=warps)
        runs.append((warps, ids, w))
    _, ids0, w0 = runs[0]
    for warps, ids, w in runs[1:]:
        assert torch.equal(ids, ids0), f"top-k ids at {warps} warps differ from 1 warp"
        bad = (w != w0).any(-1).sum().item()
        assert bad == 0, f"top-k weights at {warps} warps differ from 1 warp in {bad} of {tokens} tokens"


def check_routing_forms_same_bits(mods, device, tokens=1024, h=256, e=256, k=8):
    """One token's routing, ids and weights, bit for bit the same from every launch that routes it in the model:
    the router's last-arriving program (moe_route), the separate top-k launch (separate_topk, with the shared
    expert's slot), the route tiles' launch (tile_rows, up to its token limit), over many tokens whose logits come
    from one router GEMV (so the launches' top-k forms alone are compared). An 8-token decode step and a 16-row
    verify took different forms and routed a token one bit apart before the normaliser's order was fixed."""
    from deltaserve.kernels.moe.triton_route_tiles import ROUTE_TILES_MAX_TOKENS

    md = mods["moe"]
    _, kw, _ = moe_problem(device, 1, h, e, 32, 32, 4, 32, router_bits=8)
    x = torch.randn(tokens, h, device=device).bfloat16()
    last = md.moe_route(x, kw["router"], k, True, kw["shared_gate"])
    split = md.moe_route(x, kw["router"], k, True, kw["shared_gate"], separate_topk=True, shared_slot=e)
    assert torch.equal(last.ids, split.ids[:, :k]), "ids: last arrival != separate launch"
    bad = (last.weights != split.weights[:, :k]).any(-1).sum().item()
    assert bad == 0, f"weights: last arrival != separate launch in {bad} of {tokens} tokens"
    t = min(tokens, ROUTE_TILES_MAX_TOKENS)
    tiled = md.moe_route(x[:t], kw["router"], k, True, kw["shared_gate"], shared_slot=e, tile_rows=8)
    assert torch.equal(tiled.ids, split.ids[:t]) and torch.equal(tiled.weights, split.weights[:t]), \
        "the route tiles' launch routes otherwise than the separate top-k launch"


def check_gemv_inline_unaligned(mods, device, n, k, m=3):
    """x rows that are not 4-byte aligned (a column view at an odd offset, odd pitch) take single loads instead of
    paired ones: the same values in the same arithmetic, so the result equals the aligned rows' bit for bit."""
    g = mods["gemv"]
    from deltaserve.kernels.quant.triton_gemv_inline import INLINE_PAIR, INLINE_SINGLE, inline_mode

    (p, s, b), _ = gemv_weight(n, k, 4, 64, device)
    wide = torch.randn(m, k + 1, device=device).bfloat16()
    view = wide[:, 1:]
    dense = view.contiguous()
    assert inline_mode(view, True) == INLINE_SINGLE and inline_mode(dense, True) == INLINE_PAIR
    got = g.affine_gemv(view, p, s, b, 4, 64, inline_prep=True)
    want = g.affine_gemv(dense, p, s, b, 4, 64, inline_prep=True)
    assert torch.equal(got, want), "unaligned x rows (single loads) != aligned rows (paired loads)"


def check_router_mma(mods, device, ts=(1, 13, 70), h=128, e=40, bits=8, group=64):
    """The prefill router on tensor cores (moe/triton_router_mma) against the fp64 product x . (s q + b) at fp32
    rounding, into a poisoned output; a token's logits bit for bit the same whatever the chunk around it: the
    first rows of T = 1 / 13 / 70 against the whole block, the block reversed, and rows read at a stride (an
    offset view). Bad inputs refused by name."""
    from deltaserve.kernels.moe import triton_router_mma as rm
    from deltaserve.kernels.triton_common import WeightSpec

    p, s, b, wd = affine_weight((e, h), bits, group, device)
    r = WeightSpec(p, s, b, bits, group)
    n = max(ts)
    base = torch.randn(n + 3, h, device=device).bfloat16()
    xs = base[2 : 2 + n]  # rows at a stride of h, two rows in
    whole = poisoned((n, e), torch.float32, device)
    rm.router_mma_logits(xs, r, whole)
    close(whole, xs.double() @ wd.t(), 1e-5, f"router mma T={n}")
    flipped = rm.router_mma_logits(xs.flip(0).contiguous(), r)
    assert torch.equal(flipped.flip(0), whole), "router mma: a token's logits moved with its place in the chunk"
    for t in ts:
        got = rm.router_mma_logits(xs[:t].contiguous(), r)
        assert torch.equal(got, whole[:t]), f"router mma: T={t} != the first {t} rows of T={n}"
    codes = rm.router_codes_bf16(r)  # the codes read from their bf16 copy: the same MMA operands
    q = torch.round((wd - b.double().repeat_interleave(group, 1)) / s.double().repeat_interleave(group, 1))
    assert torch.equal(codes.double(), q), "router_codes_bf16: not the weight's codes"
    via = poisoned((n, e), torch.float32, device)
    rm.router_mma_logits(xs, r, via, codes=codes)
    assert torch.equal(via, whole), "router mma: the bf16 codes changed a bit"
    fresh = xs.clone()  # written by the launch just before, as the model's norm writes x
    got = poisoned((n, e), torch.float32, device)
    rm.router_mma_logits(fresh, r, got)
    after = torch.empty_like(got).copy_(got)  # the successor reads what the router wrote
    assert torch.equal(after, whole), "router mma: after a writer of its x, a bit changed"
    try:
        rm.router_mma_logits(xs, r, codes=codes.float())
    except ValueError as exc:
        assert "codes must be bf16" in str(exc), str(exc)
    else:
        raise AssertionError("router_mma_logits accepted fp32 codes")
    for bad, what in ((dict(out=torch.empty(n, e, device=device)[:, :1]), "out must be fp32"),
                      (dict(x=xs.float()), "needs bf16 rows")):
        try:
            rm.router_mma_logits(bad.get("x", xs), r, bad.get("out"))
        except ValueError as exc:
            assert what in str(exc), str(exc)
        else:
            raise AssertionError(f"router_mma_logits accepted {what}")


def check_route_prefill_mma(mods, device, ts=(1, 3, 64, 515), h=2048, e=256, top_k=8, group=64):
    """moe_route(prefill=True) on an 8-bit router: the routing of triton_router_mma's logits at every T (ids ==
    route_topk's of those logits, ties to the lower id, weights to fp32 rounding), the shared slot and weight as
    the decode path's (the same shared-gate column), the tiles (asked for at T <= 64, where a decode takes them
    from its router launch) == mma_expert_tiles of those ids; each token's routing the same in every chunk; the
    router's codes given as bf16 (router_codes=) the same routing."""
    from deltaserve.kernels.moe import triton_router_mma as rm
    from deltaserve.kernels.moe.mma_experts import mma_expert_tiles

    md = mods["moe"]
    _, kw, _ = moe_problem(device, 1, h, e, 64, 64, 4, group, router_bits=8)
    r, _ = md._router_specs(torch.zeros(1, h, device=device).bfloat16(), kw["router"], top_k, kw["shared_gate"])
    xs = torch.randn(max(ts), h, device=device).bfloat16()
    first = None
    for t in ts:
        x = xs[:t]
        rows = 8 if t <= 64 else None
        got = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"], shared_slot=e, tile_rows=rows,
                           prefill=True)
        dec = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"], shared_slot=e, separate_topk=True)
        logits = rm.router_mma_logits(x, r)
        rw, rid = route_topk(logits.double().cpu(), top_k, True)
        order = rid.sort(-1)
        what = f"prefill route T={t}"
        assert torch.equal(got.ids[:, :top_k].long().cpu(), order.values), f"{what}: ids"
        close(got.weights[:, :top_k].cpu(), rw.gather(1, order.indices), 1e-6, f"{what}: weights")
        assert (got.ids[:, top_k] == e).all() and torch.equal(got.weights[:, top_k], dec.weights[:, top_k])
        assert torch.equal(got.shared_weight, dec.shared_weight), f"{what}: shared weight"
        if rows is not None:
            want = mma_expert_tiles(got.ids, e + 1, rows)
            for name, a, b in zip(("tile_e", "tile_lo", "tile_hi", "order"), got.tiles[:4], want[:4]):
                assert torch.equal(a, b), f"{what}: {name}"
        if first is None:
            first = got
            via = md.moe_route(x, kw["router"], top_k, True, kw["shared_gate"], shared_slot=e, tile_rows=rows,
                               prefill=True, router_codes=rm.router_codes_bf16(r))  # the codes' bf16 copy
            assert torch.equal(via.ids, got.ids) and torch.equal(via.weights, got.weights), f"{what}: codes"
        assert torch.equal(got.ids[:1], first.ids[:1]) and torch.equal(got.weights[:1], first.weights[:1])
    try:
        md.moe_route(xs[:2], kw["router"], top_k, True, kw["shared_gate"], prefill=True,
                     norm=(xs[:2], xs[0], 1e-6, 1.0, ()))
    except ValueError as exc:
        assert "norm" in str(exc), str(exc)
    else:
        raise AssertionError("moe_route(prefill=True, norm=...) accepted")

