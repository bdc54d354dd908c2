"""The decode GEMV modes of model/fast.py (DELTASERVE_DECODE_GEMV): which weights each may hand to the tensor-core
GEMV. The GEMV itself is tested in test_mma_gemv.py and on the GPU (tests/gpu/test_model_mma_path.py runs the
"head" and "mma" modes end to end); here the mode's parsing and the model's marking of its output head."""

from __future__ import annotations

import pytest
import torch

from deltaserve.model import fast
from engine_helpers import tiny_model


def test_modes_parse(monkeypatch):
    for mode in ("cuda", "mma", "wide", "head"):
        monkeypatch.setenv("DELTASERVE_DECODE_GEMV", mode)
        assert fast.decode_gemv() == mode
    monkeypatch.setenv("DELTASERVE_DECODE_GEMV", "lm_head")
    with pytest.raises(ValueError, match="DELTASERVE_DECODE_GEMV must be .* found 'lm_head'"):
        fast.decode_gemv()


@pytest.mark.parametrize("tie", [False, True])
def test_the_output_head_alone_is_marked(tie):
    """"head" serves exactly the linear that makes the logits: the lm_head, or the embedding table when tied."""
    model = tiny_model(moe=True, tie_word_embeddings=tie)
    marked = [name for name, m in model.named_modules() if m.__dict__.get(fast.OUTPUT_HEAD_ATTR)]
    assert marked == (["embed_tokens"] if tie else ["lm_head"])


def test_head_mode_leaves_cpu_tensors_alone(monkeypatch):
    """The tensor-core GEMV is CUDA-only: on the CPU every mode keeps the reference linear (no repacked copy)."""
    monkeypatch.setenv("DELTASERVE_DECODE_GEMV", "head")
    model = tiny_model(moe=True)
    assert fast.mma_weights(model.lm_head, torch.zeros(1, model.config.hidden_size)) is None
    assert fast.MMA_ATTR not in model.lm_head.__dict__


def test_default_is_head(monkeypatch):
    monkeypatch.delenv("DELTASERVE_DECODE_GEMV", raising=False)
    assert fast.decode_gemv() == "head"


def test_gdn_step_prep_switch(monkeypatch):
    """DELTASERVE_GDN_PREP names its values; on the CPU (no fast path) the step never preps."""
    model = tiny_model(moe=True)
    mixer = next(m for m in model.modules() if hasattr(m, "out_proj") and hasattr(m, "dv"))
    x = torch.zeros(1, model.config.hidden_size)
    for mode in ("step", "launch"):
        monkeypatch.setenv("DELTASERVE_GDN_PREP", mode)
        assert fast.gdn_step_prep(mixer.out_proj, x, mixer.dv, mixer.hv) is None
    monkeypatch.setenv("DELTASERVE_GDN_PREP", "kernel")
    with pytest.raises(ValueError, match="DELTASERVE_GDN_PREP must be 'step' or 'launch', found 'kernel'"):
        fast.gdn_step_prep(mixer.out_proj, x, mixer.dv, mixer.hv)
