"""The model's GPU fast path (model/fast.py and the Triton kernels behind it) run on CPU through Triton's
interpreter: decode logits match the reference path and a decoded row is bit-identical alone or in a batch.

A child process runs the check with TRITON_INTERPRET=1 set before Triton is imported (see test_triton_interpret.py
for why). Prefill on the fast path uses fla's chunked gated delta rule, which has no interpreter path (its autotuner
needs a GPU driver); the child substitutes the reference chunked rule for that one call (same signature and
meaning: gated_delta/triton_decode.py::gdn_prefill), so everything else of the fast path is what runs here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _reference_gdn_prefill(q, k, v, g, beta, cu, pool, slots, ctx, scale, cu_seqlens_cpu=None, memo=None):
    import torch

    from deltaserve.kernels.gated_delta import reference as ref

    outs = []
    for b in range(slots.numel()):
        lo, hi, slot = int(cu[b]), int(cu[b + 1]), int(slots[b])
        state = pool[slot] if int(ctx[b]) else None
        o, final = ref.gated_delta_chunked(
            ref.l2norm(q[lo:hi].float()), ref.l2norm(k[lo:hi].float()), v[lo:hi].float(), g[lo:hi], beta[lo:hi],
            state, scale,
        )
        pool[slot] = final
        outs.append(o.to(v.dtype))
    return torch.cat(outs)


def _child(ckpt: str) -> None:
    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.kernels import backend
    from deltaserve.kernels.gated_delta import triton_decode
    from deltaserve.model import ForwardBatch
    from deltaserve.weights.loader import load_checkpoint

    triton_decode.gdn_prefill = _reference_gdn_prefill
    model = load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False).model
    prompts = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22], [4, 4, 4], [17]]
    tables = [[4 * i + j for j in range(4)] for i in range(len(prompts))]

    def decode(fast: bool, rows: list[int], steps: int = 2, kv_dtype=None) -> torch.Tensor:
        backend.use_reference(not fast)
        cache = model.make_cache(16, 16, len(prompts), torch.bfloat16, kv_dtype=kv_dtype)
        with torch.no_grad():
            for i in rows:
                model(ForwardBatch.build([prompts[i]], [0], [tables[i]], [i], 16), cache)
            ctx = [len(prompts[i]) for i in rows]
            toks = [[prompts[i][-1]] for i in rows]
            out = []
            for _ in range(steps):
                fb = ForwardBatch.build(toks, ctx, [tables[i] for i in rows], rows, 16)
                logits = model(fb, cache)
                out.append(logits.float())
                ctx = [c + 1 for c in ctx]
                toks = [[int(t)] for t in logits.argmax(-1)]
        return torch.stack(out)  # [steps, rows, vocab]

    ref, fast = decode(False, [0, 1]), decode(True, [0, 1])
    rel = ((ref - fast).abs().max() / ref.abs().max()).item()
    assert rel < 0.02, f"fast-path decode logits differ from the reference by {rel:.3g} (relative)"
    assert torch.equal(ref.argmax(-1), fast.argmax(-1)), "fast path picks other greedy tokens"
    alone = decode(True, [0])[:, 0]
    # the batch of two decoded above serves as "among 1 other" (decoding it again costs ~1 min of interpreter time)
    four = decode(True, [0, 1, 2, 3])
    for others, got in ((1, fast[:, 0]), (3, four[:, 0])):
        assert torch.equal(got, alone), f"row 0 decoded among {others} others differs"

    # each DeltaNet mixer as two halves of the rows (fast.mixer_halves: two streams on CUDA, here one after the
    # other through the same slicing of rows, slots and the norm's prep): the 4-row step's logits, bit for bit
    from deltaserve.model import fast as fast_path

    halves_run, mixer_halves = [], fast_path.mixer_halves

    def spy(rows, x, kind="deltanet"):
        taken = mixer_halves(rows, x, kind)
        halves_run.append((rows, kind, taken))
        return taken

    fast_path.mixer_halves = spy
    rows_at, fast_path.MIXER_HALVES_ROWS = fast_path.MIXER_HALVES_ROWS, 2  # a 4-row step splits
    halves = decode(True, [0, 1, 2, 3], 1)
    fast_path.MIXER_HALVES_ROWS = rows_at
    fast_path.mixer_halves = mixer_halves
    taken = {kind for rows, kind, ok in halves_run if ok and rows == 4}
    assert taken == {"deltanet", "attention"}, f"the halves were not taken: {halves_run}"
    assert torch.equal(halves, four[:1]), "the mixers' halves change the logits"

    # the fp8 K/V cache (kernels/attention/kv_fp8.py): the fused q/k prep writing it, prefill and decode attention
    # reading it, against the reference path with the same cache format (one step: interpreter time)
    fp8 = torch.float8_e4m3fn
    ref8, fast8 = decode(False, [0, 1], 1, fp8), decode(True, [0, 1], 1, fp8)
    rel8 = ((ref8 - fast8).abs().max() / ref8.abs().max()).item()
    assert rel8 < 0.02, f"fp8 cache: fast-path decode logits differ from the reference by {rel8:.3g} (relative)"
    assert torch.equal(ref8.argmax(-1), fast8.argmax(-1)), "fp8 cache: fast path picks other greedy tokens"
    assert not torch.equal(fast8, fast[:1]), "fp8 cache: the same logits as the bf16 cache (was it used?)"

    # a prompt past MOE_GEMV_MAX_TOKENS takes the prefill kernels (grouped expert matmul with shared tiles, the
    # one-launch combine with the residual, varlen attention): every position's logits against the reference
    long_prompt = [(5 * j + 3) % 31 + 1 for j in range(24)]

    def prefill(fast: bool) -> torch.Tensor:
        backend.use_reference(not fast)
        cache = model.make_cache(16, 16, 1, torch.bfloat16)
        with torch.no_grad():
            return model(ForwardBatch.build([long_prompt], [0], [[0, 1]], [0], 16, logits="all"), cache).float()

    ref_p, fast_p = prefill(False), prefill(True)
    rel_p = ((ref_p - fast_p).abs().max() / ref_p.abs().max()).item()
    assert rel_p < 0.02, f"fast-path prefill logits differ from the reference by {rel_p:.3g} (relative)"
    agree = (ref_p.argmax(-1) == fast_p.argmax(-1)).float().mean().item()
    assert agree >= 0.9, f"fast-path prefill top-1 agrees with the reference at {agree:.0%} of positions"

    # DecodeGraph's step (run eagerly here: capture needs CUDA) feeds its own argmax back like the loop above
    from deltaserve.engine.cuda_graph import DecodeGraph

    cache = model.make_cache(16, 16, len(prompts), torch.bfloat16)
    with torch.no_grad():
        for i in (0, 1):
            model(ForwardBatch.build([prompts[i]], [0], [tables[i]], [i], 16), cache)
    dg = DecodeGraph(model, cache, 2, 4, greedy_feedback=True)
    ctx = torch.tensor([len(prompts[0]), len(prompts[1])])
    dg.load(torch.tensor([prompts[0][-1], prompts[1][-1]]), ctx, ctx, torch.tensor(tables[:2], dtype=torch.int32),
            torch.tensor([0, 1]))
    steps = torch.stack([dg.replay().float().clone() for _ in range(2)])
    assert torch.equal(steps, fast), "DecodeGraph steps differ from the same decode through ForwardBatch.build"
    print("OK", rel)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("triton", reason="the fast path's kernels need Triton (its interpreter on CPU)")
    from model_helpers import make_hf_model, ours_from_checkpoint

    path = tmp_path_factory.mktemp("fast")
    ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32), path)
    return path


def test_fast_path_decode_matches_reference_and_is_batch_invariant(checkpoint):
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))  # the repo too: no install needed
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _child(sys.argv[1])


def test_kernel_choices_off_the_gpu():
    import torch

    from deltaserve.model import fast

    pool, x = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.bfloat16)
    assert fast.conv_in_gemv(pool, x) and not fast.conv_in_gemv(pool.float(), x)  # the pool must match x's dtype
    assert fast.moe_kernels() == "mma" and fast.mma_moe_weights(None, x) is None  # CPU tensors: never repacked
