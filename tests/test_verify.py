"""Speculative verification on the reference path (fp32, CPU): a verify forward (ForwardBatch.verify) is the decode
steps it stands for, and commit_verified(keep) leaves the cache of decoding exactly the kept rows. (The fast path,
bit for bit against its decode kernels: test_verify_interpret.py, and on CUDA the GPU model tests.)"""

from __future__ import annotations

import copy

import pytest
import torch

from deltaserve.model import ForwardBatch
from model_helpers import make_hf_model, ours_from_state_dict
from verify_helpers import ROWS, check_verify_equals_decode, decode_rows


@pytest.fixture(scope="module")
def model():
    return ours_from_state_dict(make_hf_model(True, seed=2, vocab_size=32))


def test_build_fills_the_rows_metadata():
    fb = ForwardBatch.build([[1, 2, 3], [4]], [5, 6], [[0, 1], [2, 3]], [0, 1], 4, verify=True)
    assert fb.verify and fb.decode_rows and fb.max_seqlen == 3
    assert fb.row_context_lens.tolist() == [5, 6, 7, 6]
    assert fb.row_block_tables.tolist() == [[0, 1], [0, 1], [0, 1], [2, 3]]
    plain = ForwardBatch.build([[1, 2, 3]], [5], [[0, 1]], [0], 4)
    assert not plain.verify and not plain.decode_rows and plain.row_context_lens is None


def test_verify_equals_decode_steps_fp32(model):
    check_verify_equals_decode(model, torch.float32, batch_invariant=False)


@torch.no_grad()
def test_verify_is_the_decode_steps_and_commit_keeps_the_kept_rows(model):
    prompts = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22], [4, 4, 4], [17, 2]]
    tables = [[4 * i + j for j in range(4)] for i in range(len(prompts))]
    ctx = [len(p) for p in prompts]
    base = model.make_cache(16, 16, 4, torch.float32)
    for i, p in enumerate(prompts):
        model(ForwardBatch.build([p], [0], [tables[i]], [i], 16), base)
    want = decode_rows(model, copy.deepcopy(base), ROWS, ctx, tables)
    cache = copy.deepcopy(base)
    vb = ForwardBatch.build(ROWS, ctx, tables, list(range(len(ROWS))), 16, logits="all", verify=True)
    got = model(vb, cache)
    assert torch.equal(got, want)  # the same decode steps, the same batches: the same bits
    keep = [1, 1, 2, 2]
    model.commit_verified(vb, cache, torch.tensor(keep))
    assert not cache.verify_inputs
    ref = copy.deepcopy(base)
    decode_rows(model, ref, ROWS, ctx, tables, upto=keep)
    for layer in ref.conv:
        assert torch.equal(cache.conv[layer][:4], ref.conv[layer][:4]) and torch.equal(cache.ssm[layer][:4],
                                                                                      ref.ssm[layer][:4])
    step = ForwardBatch.build([[6], [6], [6], [6]], [c + k for c, k in zip(ctx, keep)], tables, [0, 1, 2, 3], 16)
    assert torch.equal(model(step, cache), model(step, ref))


def test_commit_needs_a_verification(model):
    fb = ForwardBatch.build([[1]], [3], [[0]], [0], 16)
    cache = model.make_cache(2, 16, 1, torch.float32)
    with pytest.raises(ValueError, match="not a verification"):
        model.commit_verified(fb, cache, torch.tensor([1]))
    vb = ForwardBatch.build([[1, 2]], [3], [[0]], [0], 16, verify=True)
    with pytest.raises(ValueError, match="keep has 2 entries for 1 sequences"):
        model.commit_verified(vb, cache, torch.tensor([1, 1]))
