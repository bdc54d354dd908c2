"""Metamorphic properties of the forward contract on the reference path (fp32, CPU).

chunked == whole == token-by-token, batched == alone, reused state slot == clean slot.
"""

from __future__ import annotations

import pytest
import torch

from model_helpers import Session, greedy, make_hf_model, ours_from_state_dict, prompt, rel_err


@pytest.fixture(scope="module")
def model():
    return ours_from_state_dict(make_hf_model(moe=True, seed=11))


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_chunked_prefill_equals_whole(model, chunk):
    p = prompt(150)
    _, whole = greedy(model, p, 0)
    _, chunked = greedy(model, p, 0, prefill_chunk=chunk)
    assert rel_err(chunked, whole) < 1e-5


def test_prefill_then_decode_equals_whole(model):
    p = prompt(90, seed=1)
    _, whole = greedy(model, p, 0)
    sess = Session(model)
    ctx = {0: 0}
    got = [sess.step({0: p[:40]}, ctx, logits="all")]
    got += [sess.step({0: [t]}, ctx) for t in p[40:]]  # decode steps hand the state along
    assert rel_err(torch.cat(got), whole) < 1e-5


def test_greedy_tokens_same_for_every_chunking(model):
    p = prompt(100, seed=2)
    ref, _ = greedy(model, p, 16)
    assert len(set(ref)) > 3  # a non-degenerate continuation
    for chunk in (1, 16, 64):
        assert greedy(model, p, 16, prefill_chunk=chunk)[0] == ref


def test_batch_of_different_lengths_equals_alone(model):
    prompts = {0: prompt(5, 3), 1: prompt(70, 4), 2: prompt(1, 5), 3: prompt(33, 6)}
    alone = {}
    for s, p in prompts.items():
        alone[s] = greedy(model, p, 8)[0]
    sess = Session(model)
    ctx = {s: 0 for s in prompts}
    logits = sess.step(dict(prompts), ctx)
    toks = {s: [int(logits[i].argmax())] for i, s in enumerate(sorted(prompts))}
    for _ in range(7):
        logits = sess.step({s: [toks[s][-1]] for s in prompts}, ctx)
        for i, s in enumerate(sorted(prompts)):
            toks[s].append(int(logits[i].argmax()))
    assert toks == alone


def test_mixed_prefill_and_decode_in_one_call(model):
    a, b = prompt(40, 7), prompt(25, 8)
    ref_a, logits_a = greedy(model, a, 3)
    _, logits_b = greedy(model, b, 0)
    sess = Session(model)
    ctx = {0: 0, 1: 0}
    sess.step({0: a}, ctx)
    out = sess.step({0: [ref_a[0]], 1: b}, ctx, logits="all")  # one decode token beside a whole prefill
    assert rel_err(out[1:], logits_b) < 1e-5


def test_reused_slot_starts_fresh(model):
    p = prompt(30, 9)
    _, clean = greedy(model, p, 0)
    sess = Session(model)
    for layer in sess.cache.ssm:  # garbage in every slot: a context_len of 0 must ignore it
        sess.cache.ssm[layer].normal_()
        sess.cache.conv[layer].normal_()
    got = sess.step({0: p}, {0: 0}, logits="all")
    assert rel_err(got, clean) < 1e-6


def test_logits_of_every_row_read_without_a_gather(model):
    """ForwardBatch.logits_all_rows (logits_indices == arange(T), e.g. a decode step) lets the model skip the
    gather before the final norm: the same logits as gathering; the flag is set only when it holds."""
    import dataclasses

    from deltaserve.model import ForwardBatch

    a, b = prompt(12, 3), prompt(9, 4)
    cache = model.make_cache(8, 16, 2)
    with torch.no_grad():
        prefill = ForwardBatch.build([a, b], [0, 0], [[0, 1], [2, 3]], [0, 1], 16)
        assert not prefill.logits_all_rows  # the last token of each of two prompts
        model(prefill, cache)
        step = ForwardBatch.build([[5], [6]], [12, 9], [[0, 1], [2, 3]], [0, 1], 16)
        assert step.logits_all_rows and ForwardBatch.build([a], [0], [[0]], [0], 16, logits="all").logits_all_rows
        assert not ForwardBatch.build([[5], [6]], [12, 9], [[0, 1], [2, 3]], [0, 1], 16, logits=[1]).logits_all_rows
        direct = model(step, cache)
    cache2 = model.make_cache(8, 16, 2)
    with torch.no_grad():
        model(prefill, cache2)
        gathered = model(dataclasses.replace(step, logits_all_rows=False), cache2)
    assert torch.equal(direct, gathered)
