"""The DeltaNet decode step writing its out projection's GEMV prep (fast.gdn_step_prep, DELTASERVE_GDN_PREP=step),
end to end on the model's fast path through Triton's interpreter: a q4 g64 model whose value heads are one q4
group wide (dv = 64, the smallest the step can prep) decodes the same greedy tokens with logits equal to the prep
launch's within fp32 rounding of the group sums, the prep really in use at every DeltaNet layer. (The kernel itself,
with a row alone == in the batch: tests/gpu/kernel_cases.check_gdn_prep, in test_triton_interpret.py and
on the GPU; the GPU model test: test_model_mma_path.py's prep_model.)"""

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
    from deltaserve.kernels.gated_delta import triton_decode
    from deltaserve.model import ForwardBatch
    from deltaserve.weights.loader import load_checkpoint

    step_fn, preps = triton_decode.gdn_decode_step, []

    def spy(*args, **kwargs):
        preps.append(kwargs.get("prep"))
        return step_fn(*args, **kwargs)

    triton_decode.gdn_decode_step = spy
    from deltaserve.kernels.quant import triton_gemv

    made = {"prep_x": 0, "carried": 0}  # the GEMVs' prep: made by a launch, or carried in (the norm's, the step's)
    prep_x, check_prep = triton_gemv.prep_x, triton_gemv.check_prep

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            made[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    triton_gemv.prep_x = counting("prep_x", prep_x)
    triton_gemv.check_prep = counting("carried", check_prep)
    model = load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False).model
    prompts, tables = [[3, 5, 7], [8, 30]], [[0, 1], [2, 3]]
    cache = model.make_cache(4, 16, 2, torch.bfloat16)
    backend.use_reference(True)  # the prompts through the reference path (no interpreter time); one cache for both
    with torch.no_grad():
        for i in (0, 1):
            model(ForwardBatch.build([prompts[i]], [0], [tables[i]], [i], 16), cache)
    backend.use_reference(False)

    def decode(mode: str) -> torch.Tensor:  # one fast-path decode step of both rows from a copy of that cache
        os.environ["DELTASERVE_GDN_PREP"] = mode
        fb = ForwardBatch.build([[p[-1]] for p in prompts], [len(p) for p in prompts], tables, [0, 1], 16)
        with torch.no_grad():
            return model(fb, copy.deepcopy(cache)).float()

    launch = decode("launch")
    assert set(preps) == {None}, preps
    counts, preps[:] = dict(made), []
    step = decode("step")
    assert set(preps) == {(4, 64)} and len(preps) == 2, f"the step's prep was not in use at every layer: {preps}"
    # each DeltaNet layer's out projection took the step's prep instead of a prep launch
    assert made["prep_x"] - counts["prep_x"] == counts["prep_x"] - 2, (counts, made)
    assert made["carried"] - counts["carried"] == counts["carried"] + 2, (counts, made)
    rel = ((step - launch).abs().max() / launch.abs().max()).item()
    assert rel < 1e-3 and torch.equal(step.argmax(-1), launch.argmax(-1)), f"step prep vs launch: {rel:.3g}"
    print("OK", rel)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("triton", reason="the fast path's kernels need Triton (its interpreter on CPU)")
    from model_helpers import make_hf_model, ours_from_checkpoint

    from deltaserve.weights.quantizer import quantize_checkpoint

    src = tmp_path_factory.mktemp("bf16")
    # two DeltaNet layers (no attention layer: the fast path's attention is covered elsewhere; interpreter time)
    ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64, num_hidden_layers=2,
                                       shared_expert_intermediate_size=64, linear_value_head_dim=64), src)
    return quantize_checkpoint(src, tmp_path_factory.mktemp("q4"), 4, 64, progress=False)


@pytest.mark.slow
def test_step_prep_equals_prep_launch_end_to_end(checkpoint):
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _child(sys.argv[1])
