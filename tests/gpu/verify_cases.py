"""Speculative verification's DeltaNet kernels (kernels/gated_delta/triton_verify.py) against the decode step,
shared by the interpreter tests (tests/test_gdn_verify_interpret.py) and the GPU tests (test_gdn_verify_gpu.py).

The contract is exactness, so the oracle is the decode kernels themselves, token after token: for sequences of
n_b rows (the last sampled token and its drafts), row i out of gdn_verify_step (resp. causal_conv over the rows with
write_state=False) has the bits gdn_decode_step (resp. the one-token causal_conv, which equals the decode GEMV's
conv epilogue) gives it after rows 0 .. i-1 were decoded; and after gdn_verify_commit / conv_commit with keep_b
rows, the state slots hold the bits of decoding exactly those keep_b rows. Fresh inputs each case; outputs and the
slots of fresh sequences NaN-poisoned.
"""

from __future__ import annotations

import torch

from kernel_cases import close, gdn_inputs, gdn_step_reference, poisoned


def _rows(seqs: list[int]) -> list[tuple[int, int]]:
    """(sequence, index in it) of each row, sequence after sequence."""
    return [(b, i) for b, n in enumerate(seqs) for i in range(n)]


def _decode_rows(gd, inp, rows_of, slots, ctx, pool, hk, upto, step_kw, prep=None):
    """Decode rows token after token with gdn_decode_step: step i takes row i of every sequence with more than i
    rows (and i < upto[b]), at context ctx_b + i. Returns (outputs by global row, preps by global row)."""
    outs, preps = {}, {}
    for i in range(max(upto)):
        batch = [(b, r) for b, r in enumerate(rows_of) if i < min(len(r), upto[b])]
        if not batch:
            continue
        idx = torch.tensor([r[i] for _, r in batch], device=pool.device)
        sl = torch.stack([slots[b] for b, _ in batch])
        cl = torch.stack([ctx[b] + i for b, _ in batch])
        got = gd.gdn_decode_step(inp["qkv"][idx], inp["z"][idx], inp["a"][idx], inp["b"][idx], inp["a_log"],
                                 inp["dt_bias"], inp["norm_w"], pool, sl, cl, hk, 1e-6, prep=prep, **step_kw)
        o, made = (got[0], got[1]) if prep is not None else (got, None)
        for j, (b, r) in enumerate(batch):
            outs[r[i]] = o[j]
            if made is not None:
                preps[r[i]] = (made[0][j], made[1][j])
    return outs, preps


def check_verify_step(mods, device, seqs, hk, hv, dk, dv, dv_block, fresh=(1,), prep=None, num_slots=None):
    """gdn_verify_step == gdn_decode_step token after token, bit for bit (outputs and the out projection's prep);
    the state slots untouched for sequences of several rows, the decode's for one-row ones; then
    gdn_verify_commit(keep) == decoding exactly keep_b rows, for keep_b in 0 .. n_b; and the rows against the
    fp64 step reference."""
    gd, gv = mods["gdn"], mods["verify"]
    nseq, t = len(seqs), sum(seqs)
    num_slots = num_slots or nseq + 2
    inp = gdn_inputs(device, t, hk, hv, dk, dv, num_slots)
    slots = torch.randperm(num_slots)[:nseq].to(device)
    ctx = torch.tensor([0 if b in fresh else 7 + 3 * b for b in range(nseq)], device=device)
    for b in fresh:
        if b < nseq:
            inp["ssm"][slots[b]] = float("nan")  # a fresh sequence must not read its slot
    pool0 = inp["ssm"].clone()
    rows_of, start = [], 0
    for n in seqs:
        rows_of.append(list(range(start, start + n)))
        start += n
    cu = torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), device=device, dtype=torch.int32)
    step_kw = {"dv_block": dv_block}
    dec_pool = pool0.clone()
    want, want_prep = _decode_rows(gd, inp, rows_of, slots, ctx, dec_pool, hk, seqs, step_kw, prep)
    pool = pool0.clone()
    out = poisoned((t, hv * dv), torch.bfloat16, device)
    got = gv.gdn_verify_step(inp["qkv"], inp["z"], inp["a"], inp["b"], inp["a_log"], inp["dt_bias"], inp["norm_w"],
                             pool, cu, slots, ctx, hk, 1e-6, out=out, prep=prep, **step_kw)
    o, made = (got[0], got[1]) if prep is not None else (got, None)
    for r, (b, i) in enumerate(_rows(seqs)):
        assert torch.equal(o[r], want[r]), f"verify row {r} (sequence {b}, token {i}) != the decode step's"
        if made is not None:
            assert torch.equal(made[0][r], want_prep[r][0]) and torch.equal(made[1][r], want_prep[r][1]), \
                f"verify row {r}: the out projection's prep != the decode step's"
    for b, n in enumerate(seqs):
        s = int(slots[b])
        if n == 1:
            assert torch.equal(pool[s], dec_pool[s]), f"one-row sequence {b}: state != the decode step's"
        else:
            assert torch.equal(pool[s], pool0[s], ) or (b in fresh and torch.isnan(pool[s]).all()), \
                f"sequence {b} of {n} rows: the verify wrote its state"
    # against the fp64 reference too (the decode step's own check), every row in order
    for b, rows in enumerate(rows_of):
        st = None if b in fresh else pool0[slots[b]].double()
        for r in rows:
            y, st = gdn_step_reference(inp, r, hk, dk, st)
            close(o[r], y.double(), 4 * 2.0**-8, f"verify row {r} vs fp64")
    for keep in ([min(1, n) for n in seqs], list(seqs), [n // 2 for n in seqs], [0] * nseq):
        kept = pool.clone()
        gv.gdn_verify_commit(inp["qkv"], inp["z"], inp["a"], inp["b"], inp["a_log"], inp["dt_bias"], inp["norm_w"],
                             kept, cu, slots, ctx, torch.tensor(keep, device=device), hk, 1e-6, prep=prep, **step_kw)
        ref = pool0.clone()
        upto = [k if n > 1 else 0 for k, n in zip(keep, seqs)]  # one-row sequences: the verify wrote them
        if max(upto):  # (the decode steps of the same deployment: the verify's prep too)
            _decode_rows(gd, inp, rows_of, slots, ctx, ref, hk, upto, step_kw, prep)
        for b, n in enumerate(seqs):
            s = int(slots[b])
            if n == 1:
                assert torch.equal(kept[s], dec_pool[s]), f"commit touched one-row sequence {b}"
            elif upto[b] == 0:
                assert torch.equal(kept[s], pool0[s]) or (b in fresh and torch.isnan(kept[s]).all()), \
                    f"keep 0 of sequence {b}: state changed"
            else:
                assert torch.equal(kept[s], ref[s]), f"commit of {upto[b]} of {n} rows of sequence {b} != decoding them"


def check_conv_verify(mods, device, c, kw, seqs, fresh=(1,), num_slots=None):
    """causal_conv(write_state=False) over the sequences' rows == the one-token causal_conv token after token (the
    decode GEMV's conv epilogue bits), the windows untouched; conv_commit(keep) == the window after keep_b rows."""
    gd, gv = mods["gdn"], mods["verify"]
    nseq, t = len(seqs), sum(seqs)
    num_slots = num_slots or nseq + 2
    slots = torch.randperm(num_slots)[:nseq].to(device)
    ctx = torch.tensor([0 if b in fresh else 4 + b for b in range(nseq)], device=device)
    x = torch.randn(t, c, device=device).bfloat16()
    w = (torch.randn(c, kw, device=device) * 0.5).bfloat16()
    pool0 = torch.randn(num_slots, c, kw - 1, device=device).bfloat16()
    for b in fresh:
        if b < nseq:
            pool0[slots[b]] = float("nan")
    cu = torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), device=device, dtype=torch.int32)
    starts = cu[:-1].tolist()

    def decode(upto):  # one token per sequence per call, as a decode step: outputs by row, the windows after
        pool, outs = pool0.clone(), {}
        for i in range(max(upto, default=0)):
            batch = [b for b in range(nseq) if i < min(seqs[b], upto[b])]
            if not batch:
                continue
            rows = torch.tensor([starts[b] + i for b in batch], device=device)
            one = torch.arange(len(batch) + 1, device=device, dtype=torch.int32)
            y = gd.causal_conv(x[rows], w, pool, one, slots[batch], ctx[batch] + i, 1)
            outs.update({starts[b] + i: y[j] for j, b in enumerate(batch)})
        return outs, pool

    want, _ = decode(list(seqs))
    pool = pool0.clone()
    y = gd.causal_conv(x, w, pool, cu, slots, ctx, max(seqs), out=poisoned((t, c), torch.bfloat16, device),
                       write_state=False)
    for r in range(t):
        assert torch.equal(y[r], want[r]), f"conv verify row {r} != the one-token conv's"
    assert torch.equal(pool.nan_to_num(7.0), pool0.nan_to_num(7.0)), "causal_conv(write_state=False) wrote a window"
    for keep in (list(seqs), [1] * nseq, [n // 2 for n in seqs], [0] * nseq):
        kept = pool.clone()
        gv.conv_commit(x, kept, cu, slots, ctx, torch.tensor(keep, device=device))
        _, ref = decode(keep)
        for b in range(nseq):
            s = int(slots[b])
            if keep[b] == 0:
                assert torch.equal(kept[s].nan_to_num(7.0), pool0[s].nan_to_num(7.0)), f"keep 0 of {b}: changed"
            else:
                assert torch.equal(kept[s], ref[s]), f"conv commit of {keep[b]} rows of sequence {b} != decoding them"
