"""Shared parts of the verification tests (test_verify.py, test_verify_interpret.py, the GPU model tests):
rows of drafts, decoding them token after token, and the whole check of a verify forward against those decode steps
(logits bit for bit) and of its commit against decoding exactly the kept rows (DeltaNet windows and states, K/V)."""

from __future__ import annotations

import copy

import torch

from deltaserve.kernels import backend
from deltaserve.model import ForwardBatch

ROWS = [[5, 9, 2], [11], [3, 30], [7, 7, 7]]  # each sequence's last sampled token, then its drafts
PROMPTS = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22], [4, 4, 4], [17, 2]]
KEEP = [2, 1, 1, 3]  # 1 + the accepted drafts of each sequence


def decode_rows(model, cache, rows, ctx, tables, upto=None, device="cpu"):
    """Token after token: step i decodes token i of every sequence with more than i (and fewer than upto[b]) rows.
    Returns the logits of every row (flat, sequence after sequence) that was decoded."""
    upto = upto or [len(r) for r in rows]
    starts = [sum(len(r) for r in rows[:b]) for b in range(len(rows))]
    got = {}
    for i in range(max(upto)):
        seqs = [b for b, r in enumerate(rows) if i < min(len(r), upto[b])]
        if not seqs:
            continue
        fb = ForwardBatch.build([[rows[b][i]] for b in seqs], [ctx[b] + i for b in seqs], [tables[b] for b in seqs],
                                seqs, 16, device=device)
        logits = model(fb, cache)
        got.update({starts[b] + i: logits[j] for j, b in enumerate(seqs)})
    return torch.stack([got[r] for r in sorted(got)])


def prefilled(model, prompts, tables, dtype, device="cpu", reference=True):
    """A cache with the prompts prefilled (on the reference path when `reference`: no interpreter time)."""
    cache = model.make_cache(4 * len(prompts), 16, len(prompts), dtype, device)
    previous = backend.use_reference(True) if reference else None
    try:
        with torch.no_grad():
            for i, p in enumerate(prompts):
                model(ForwardBatch.build([p], [0], [tables[i]], [i], 16, device=device), cache)
    finally:
        if reference:
            backend.use_reference(previous)
    return cache


@torch.no_grad()
def check_verify_equals_decode(model, dtype, device="cpu", reference_prefill=True, rows=ROWS, keep=KEEP,
                               batch_invariant=True):
    """A verify forward of `rows` == decoding them token after token, logits bit for bit; after
    commit_verified(keep) the DeltaNet windows and states and the kept positions' K/V == decoding the kept rows.
    batch_invariant False (the fp32 CPU reference path, whose matmuls may round differently at other row counts):
    decoding the kept rows batches them otherwise than the verify did, so the cache is compared to fp32 rounding."""
    same = torch.equal if batch_invariant else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6))
    tables = [[4 * i + j for j in range(4)] for i in range(len(PROMPTS))]
    ctx = [len(p) for p in PROMPTS]
    base = prefilled(model, PROMPTS, tables, dtype, device, reference_prefill)
    want = decode_rows(model, copy.deepcopy(base), rows, ctx, tables, device=device)
    cache = copy.deepcopy(base)
    vb = ForwardBatch.build(rows, ctx, tables, list(range(len(rows))), 16, logits="all", verify=True, device=device)
    got = model(vb, cache)
    for r in range(got.shape[0]):
        assert torch.equal(got[r], want[r]), f"verify row {r}: logits differ from the decode step's"
    model.commit_verified(vb, cache, torch.tensor(keep, device=device))
    assert not cache.verify_inputs, "commit_verified left a verification record behind"
    ref = copy.deepcopy(base)
    decode_rows(model, ref, rows, ctx, tables, upto=keep, device=device)
    for b in range(len(rows)):
        for layer in ref.conv:
            assert same(cache.conv[layer][b], ref.conv[layer][b]), f"conv window of {b}, layer {layer}"
            assert same(cache.ssm[layer][b], ref.ssm[layer][b]), f"state of {b}, layer {layer}"
    for layer in ref.k:  # the K/V of every kept position (rejected ones are the engine's to free)
        for b, k in enumerate(keep):
            for pos in range(ctx[b] + k):
                blk, off = tables[b][pos // 16], pos % 16
                assert same(cache.k[layer][blk, off], ref.k[layer][blk, off]), f"K of {b} at {pos}"
                assert same(cache.v[layer][blk, off], ref.v[layer][blk, off]), f"V of {b} at {pos}"
