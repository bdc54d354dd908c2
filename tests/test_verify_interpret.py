"""Speculative verification on the model's GPU fast path, run on CPU through Triton's interpreter: a verify forward
(ForwardBatch.verify: each sequence's last token and its drafts as decode rows) gives every row the logits of a
one-token decode step at that position, bit for bit; after commit_verified(keep) the cache (DeltaNet conv windows
and states, the K/V of the kept positions) is the cache of decoding exactly the kept rows, so every later step's
logits are the same bits too. On CUDA: tests/gpu/test_verify_gpu.py. The reference path's verify: tests/test_verify.py."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROWS = [[5, 9, 2], [11], [3, 30], [7, 7, 7]]  # each sequence's last sampled token, then its drafts


def decode_rows(model, cache, rows, ctx, tables, upto=None):
    """Token after token: step i decodes token i of every sequence with more than i (and fewer than upto[b]) rows.
    Returns the logits of every row (flat, sequence after sequence) that was decoded."""
    import torch

    from deltaserve.model import ForwardBatch

    upto = upto or [len(r) for r in rows]
    starts = [sum(len(r) for r in rows[:b]) for b in range(len(rows))]
    got = {}
    for i in range(max(upto)):
        seqs = [b for b, r in enumerate(rows) if i < min(len(r), upto[b])]
        if not seqs:
            continue
        fb = ForwardBatch.build([[rows[b][i]] for b in seqs], [ctx[b] + i for b in seqs], [tables[b] for b in seqs],
                                seqs, 16)
        logits = model(fb, cache)
        got.update({starts[b] + i: logits[j] for j, b in enumerate(seqs)})
    return torch.stack([got[r] for r in sorted(got)])


def prefilled(model, prompts, tables):
    import torch

    from deltaserve.kernels import backend
    from deltaserve.model import ForwardBatch

    cache = model.make_cache(4 * len(prompts), 16, len(prompts), torch.bfloat16)
    backend.use_reference(True)  # prefill on the reference path: no interpreter time, the same cache contents
    with torch.no_grad():
        for i, p in enumerate(prompts):
            model(ForwardBatch.build([p], [0], [tables[i]], [i], 16), cache)
    backend.use_reference(False)
    return cache


def _child(ckpt: str) -> None:
    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.model import ForwardBatch
    from deltaserve.weights.loader import load_checkpoint

    model = load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False).model
    prompts = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22], [4, 4, 4], [17, 2]]
    tables = [[4 * i + j for j in range(4)] for i in range(len(prompts))]
    ctx = [len(p) for p in prompts]
    base = prefilled(model, prompts, tables)
    with torch.no_grad():
        want = decode_rows(model, copy.deepcopy(base), ROWS, ctx, tables)
        cache = copy.deepcopy(base)
        vb = ForwardBatch.build(ROWS, ctx, tables, list(range(len(ROWS))), 16, logits="all", verify=True)
        got = model(vb, cache)
        for r in range(got.shape[0]):
            assert torch.equal(got[r], want[r]), f"verify row {r}: logits differ from the decode step's"
        keep = [2, 1, 1, 3]  # 1 + the accepted drafts of each sequence
        model.commit_verified(vb, cache, torch.tensor(keep))
        ref = copy.deepcopy(base)
        decode_rows(model, ref, ROWS, ctx, tables, upto=keep)
        for b, k in enumerate(keep):
            for layer in ref.conv:
                assert torch.equal(cache.conv[layer][b], ref.conv[layer][b]), f"conv window of {b}, layer {layer}"
                assert torch.equal(cache.ssm[layer][b], ref.ssm[layer][b]), f"state of {b}, layer {layer}"
        for layer in ref.k:  # the K/V of every kept position (rejected ones are the engine's to free)
            for b, k in enumerate(keep):
                for pos in range(ctx[b] + k):
                    blk, off = tables[b][pos // 16], pos % 16
                    assert torch.equal(cache.k[layer][blk, off], ref.k[layer][blk, off]), f"K of {b} at {pos}"
                    assert torch.equal(cache.v[layer][blk, off], ref.v[layer][blk, off]), f"V of {b} at {pos}"
    print("OK")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("triton", reason="the fast path's kernels need Triton (its interpreter on CPU)")
    from model_helpers import make_hf_model, ours_from_checkpoint

    path = tmp_path_factory.mktemp("verify")
    ours_from_checkpoint(make_hf_model(True, seed=1, vocab_size=32), path)
    return path


@pytest.mark.slow  # ~3 min of interpreter time
def test_verify_rows_are_decode_steps_and_commit_is_decoding_the_kept_rows(checkpoint):
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _child(sys.argv[1])
