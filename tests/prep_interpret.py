"""Shared parts of the interpreted end-to-end tests of the kernels that write their out projection's GEMV prep
(test_gdn_prep_interpret.py: the DeltaNet step; test_attn_merge_prep_interpret.py: the attention merge). Each runs
its checks in a child process under Triton's interpreter on a q4 g64 checkpoint, spying on the kernel's prep
argument and counting the GEMVs' preps made by a launch (prep_x) against those carried in (check_prep)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_child(script: str, checkpoint) -> None:
    """`python script checkpoint` under the interpreter (the fast path on CPU tensors); asserts it printed OK."""
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, script, str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def spy_and_count(module, name: str) -> tuple[list, dict]:
    """In the child, before the model is built: module.name wrapped to record each call's `prep` keyword, and the
    decode GEMVs' preps counted: {"prep_x": made by a launch, "carried": carried in (a norm's, the kernel's)}."""
    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.kernels.quant import triton_gemv

    fn, preps = getattr(module, name), []

    def spy(*args, **kwargs):
        preps.append(kwargs.get("prep"))
        return fn(*args, **kwargs)

    setattr(module, name, spy)
    made = {"prep_x": 0, "carried": 0}

    def counting(key, inner):
        def wrapped(*args, **kwargs):
            made[key] += 1
            return inner(*args, **kwargs)
        return wrapped

    triton_gemv.prep_x = counting("prep_x", triton_gemv.prep_x)
    triton_gemv.check_prep = counting("carried", triton_gemv.check_prep)
    return preps, made


def prefilled_decoder(ckpt: str, prompts: list[list[int]], tables: list[list[int]], chooser: str):
    """The checkpoint's model (bf16) with the prompts prefilled through the reference path (no interpreter time)
    into one cache; returns decode(fused): one fast-path decode step of every row from a copy of that cache, its
    logits in fp32, with the kernel's prep (fused) or with model/fast.py's `chooser` answering None (the prep
    launch before the GEMV, the path of formats the kernel cannot prep)."""
    import torch

    from deltaserve.kernels import backend
    from deltaserve.model import ForwardBatch, fast
    from deltaserve.weights.loader import load_checkpoint

    model = load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False).model
    cache = model.make_cache(sum(map(len, tables)), 16, len(prompts), torch.bfloat16)
    backend.use_reference(True)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            model(ForwardBatch.build([p], [0], [tables[i]], [i], 16), cache)
    backend.use_reference(False)

    chosen = getattr(fast, chooser)

    def decode(fused: bool) -> torch.Tensor:
        setattr(fast, chooser, chosen if fused else (lambda *args, **kwargs: None))
        fb = ForwardBatch.build([[p[-1]] for p in prompts], [len(p) for p in prompts], tables,
                                list(range(len(prompts))), 16)
        try:
            with torch.no_grad():
                return model(fb, copy.deepcopy(cache)).float()
        finally:
            setattr(fast, chooser, chosen)

    return decode


def q4_checkpoint(tmp_path_factory, **text_overrides):
    """A tiny q4 g64 MoE checkpoint (our quantiser over a random transformers model: vocab 32, experts and the
    shared expert 64 wide) with the given text-config overrides; skips without Triton (the child needs it)."""
    import pytest

    pytest.importorskip("triton", reason="the fast path's kernels need Triton (its interpreter on CPU)")
    from model_helpers import make_hf_model, ours_from_checkpoint

    from deltaserve.weights.quantizer import quantize_checkpoint

    src = tmp_path_factory.mktemp("bf16")
    ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64,
                                       shared_expert_intermediate_size=64, **text_overrides), src)
    return quantize_checkpoint(src, tmp_path_factory.mktemp("q4"), 4, 64, progress=False)
