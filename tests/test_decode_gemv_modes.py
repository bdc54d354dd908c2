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


def _gdn_prep(model, x):
    mixer = next(m for m in model.modules() if hasattr(m, "out_proj") and hasattr(m, "dv"))
    return fast.gdn_step_prep(mixer.out_proj, x, mixer.dv, mixer.hv)


def _merge_prep(model, x):
    from deltaserve.model.attention import GatedAttention

    attn = next(m for m in model.modules() if isinstance(m, GatedAttention))
    return fast.attn_merge_prep(attn.o_proj, x, attn.hq, attn.d)


@pytest.mark.parametrize("knob, modes, bad, prep", [
    ("DELTASERVE_GDN_PREP", ("step", "launch"), "kernel", _gdn_prep),
    ("DELTASERVE_ATTN_MERGE_PREP", ("merge", "launch"), "split", _merge_prep),
])
def test_prep_switches(monkeypatch, knob, modes, bad, prep):
    """The switches of the kernels that write their out projection's prep (the DeltaNet step, the attention merge)
    name their values; on the CPU (no fast path) neither preps."""
    model = tiny_model(moe=True)
    x = torch.zeros(1, model.config.hidden_size)
    for mode in modes:
        monkeypatch.setenv(knob, mode)
        assert prep(model, x) is None
    monkeypatch.setenv(knob, bad)
    with pytest.raises(ValueError, match=f"{knob} must be '{modes[0]}' or '{modes[1]}', found '{bad}'"):
        prep(model, x)


def test_merge_prep_formats():
    """The merge preps whole groups of a head: bits 4 or 8, a power-of-two group of 8 or more dividing head_dim."""
    from deltaserve.kernels.attention.triton_paged import merge_prep_supported

    assert merge_prep_supported(256, 4, 64) and merge_prep_supported(256, 8, 128) and merge_prep_supported(64, 4, 64)
    assert not merge_prep_supported(32, 4, 64)  # a group wider than a head
    assert not merge_prep_supported(256, 3, 64) and not merge_prep_supported(256, 4, 48)
    assert not merge_prep_supported(256, 4, 4)


def test_deployment_size_picks_the_mode():
    """A deployment's capacity, never its live batch, picks the GEMV: head for 1-3 streams, mma from 4."""
    assert [fast.decode_gemv_for_streams(n) for n in (1, 2, 3, 4, 8, 64)] == ["head"] * 3 + ["mma"] * 3
    with pytest.raises(ValueError, match="max_streams must be >= 1, found 0"):
        fast.decode_gemv_for_streams(0)


def test_set_decode_gemv_covers_every_linear_and_env_overrides(monkeypatch):
    """The mode is stamped on every module, the fused projections (kept outside the registered tree) included, and
    on weights fused afterwards; DELTASERVE_DECODE_GEMV still wins; a bad mode names the allowed ones."""
    from deltaserve.model import fusion

    monkeypatch.delenv("DELTASERVE_DECODE_GEMV", raising=False)
    model = tiny_model(moe=True)
    assert fast.decode_gemv(model.lm_head) == "head"  # nothing fixed yet
    fast.set_decode_gemv(model, "mma")
    assert model.fuse_projections() > 0  # fused after the stamp: they inherit it
    fused = [f for m in model.modules() for f in m.__dict__.values() if isinstance(f, fusion.FusedLinear)]
    assert fused and all(fast.decode_gemv(f) == "mma" for f in fused)
    assert all(fast.decode_gemv(m) == "mma" for m in model.modules())
    fast.set_decode_gemv(model, "head")
    assert all(fast.decode_gemv(f) == "head" for f in fused)
    monkeypatch.setenv("DELTASERVE_DECODE_GEMV", "cuda")
    assert fast.decode_gemv(model.lm_head) == "cuda"
    with pytest.raises(ValueError, match="decode GEMV mode must be one of mma, cuda, wide, head, found 'fast'"):
        fast.set_decode_gemv(model, "fast")


@pytest.mark.parametrize("seqs,choice,want", [(1, "auto", "head"), (3, "auto", "head"), (4, "auto", "mma"),
                                              (32, "auto", "mma"), (32, "head", "head"), (1, "wide", "wide")])
def test_engine_fixes_its_mode_from_max_num_seqs(monkeypatch, seqs, choice, want):
    from deltaserve.engine.engine import EngineConfig, LLMEngine

    monkeypatch.delenv("DELTASERVE_DECODE_GEMV", raising=False)
    model = tiny_model(moe=True)
    engine = LLMEngine(model, None, [], EngineConfig(num_blocks=8, max_num_seqs=seqs, max_model_len=64,
                                                     decode_gemv=choice))
    assert engine.decode_gemv == want
    assert fast.decode_gemv(model.layers[0].mlp.gate) == want


def test_engine_rejects_an_unknown_mode():
    from deltaserve.engine.engine import EngineConfig, LLMEngine

    with pytest.raises(ValueError, match="EngineConfig.decode_gemv must be 'auto' or one of .* found 'gpu'"):
        LLMEngine(tiny_model(moe=True), None, [], EngineConfig(num_blocks=8, max_model_len=64, decode_gemv="gpu"))
