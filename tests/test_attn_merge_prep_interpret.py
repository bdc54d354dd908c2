"""The decode attention's merge writing its out projection's GEMV prep (fast.attn_merge_prep,
DELTASERVE_ATTN_MERGE_PREP=merge), end to end on the model's fast path through Triton's interpreter: a q4 g64 model
of one full-attention layer whose heads are one q4 group wide (head_dim 64) decodes a step of two rows, one merged
over two splits (a 70-token context) and one finished by its split program, with logits equal to the prep launch's
bit for bit (the merge's prep is prep_row's arithmetic on the same values), the prep really made by the merge and
no prep launch for the out projection. (The kernel itself, bit for bit against prep_x with poisoned buffers:
tests/gpu/attn_fused_cases.check_decode_merge_prep, in test_triton_interpret.py and on the GPU.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _child(ckpt: str) -> None:
    import copy

    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.kernels import backend
    from deltaserve.kernels.attention import triton_paged
    from deltaserve.kernels.quant import triton_gemv
    from deltaserve.model import ForwardBatch
    from deltaserve.weights.loader import load_checkpoint

    attend, preps = triton_paged.paged_decode_attention, []

    def spy(*args, **kwargs):
        preps.append(kwargs.get("prep"))
        return attend(*args, **kwargs)

    triton_paged.paged_decode_attention = spy
    made = {"prep_x": 0, "carried": 0}  # the GEMVs' prep: made by a launch, or carried in (the norms', the merge's)
    prep_x, check_prep = triton_gemv.prep_x, triton_gemv.check_prep

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            made[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    triton_gemv.prep_x = counting("prep_x", prep_x)
    triton_gemv.check_prep = counting("carried", check_prep)
    model = load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False).model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 32, (70,), generator=g).tolist(), [8, 30, 5]]
    tables = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # 80 tokens a row: the host bound spans two splits of 64
    cache = model.make_cache(10, 16, 2, torch.bfloat16)
    backend.use_reference(True)  # the prompts through the reference path (no interpreter time); one cache for both
    with torch.no_grad():
        for i in (0, 1):
            model(ForwardBatch.build([prompts[i]], [0], [tables[i]], [i], 16), cache)
    backend.use_reference(False)

    def decode(mode: str) -> torch.Tensor:  # one fast-path decode step of both rows from a copy of that cache
        os.environ["DELTASERVE_ATTN_MERGE_PREP"] = mode
        fb = ForwardBatch.build([[p[-1]] for p in prompts], [len(p) for p in prompts], tables, [0, 1], 16)
        with torch.no_grad():
            return model(fb, copy.deepcopy(cache)).float()

    launch = decode("launch")
    assert preps == [None], preps
    counts, preps[:] = dict(made), []
    merged = decode("merge")
    assert preps == [(4, 64)], f"the merge's prep was not in use: {preps}"
    # the out projection took the merge's prep instead of a prep launch; every other GEMV as before
    assert made["prep_x"] - counts["prep_x"] == counts["prep_x"] - 1, (counts, made)
    assert made["carried"] - counts["carried"] == counts["carried"] + 1, (counts, made)
    assert torch.equal(merged, launch), "merge prep vs prep launch: the logits' bits changed"
    print("OK")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("triton", reason="the fast path's kernels need Triton (its interpreter on CPU)")
    from model_helpers import make_hf_model, ours_from_checkpoint

    from deltaserve.weights.quantizer import quantize_checkpoint

    src = tmp_path_factory.mktemp("bf16")
    # one full-attention layer (the DeltaNet layers' fast path is covered elsewhere; interpreter time), heads of 64
    ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64, num_hidden_layers=1,
                                       layer_types=["full_attention"], head_dim=64,
                                       shared_expert_intermediate_size=64,
                                       rope_parameters=dict(rope_type="default", rope_theta=1e7,
                                                            partial_rotary_factor=0.25, mrope_section=[3, 3, 2],
                                                            mrope_interleaved=True)), src)
    return quantize_checkpoint(src, tmp_path_factory.mktemp("q4"), 4, 64, progress=False)


@pytest.mark.slow
def test_merge_prep_equals_prep_launch_end_to_end(checkpoint):
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _child(sys.argv[1])
