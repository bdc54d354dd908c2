"""The kernel plan (model/plan.py): a deployment's choices, resolved once from its configuration, frozen, fixed on
every module of its model (fused projections included) and named by the engine. The decode GEMV modes decide which
weights each may hand to the tensor-core GEMV; the GEMV itself is tested in test_mma_gemv.py and on the GPU
(tests/gpu/test_model_mma_path.py runs the "head" and "mma" modes end to end)."""

from __future__ import annotations

import pytest
import torch

from deltaserve.model import fast
from deltaserve.model.plan import KernelPlan, decode_gemv_for_rows, decode_rows, resolve_plan
from engine_helpers import tiny_model


def test_plan_fields_are_checked():
    for mode in ("cuda", "mma", "wide", "head"):
        assert KernelPlan(decode_gemv=mode).decode_gemv == mode
    with pytest.raises(ValueError, match="decode GEMV mode must be one of mma, cuda, wide, head, found 'lm_head'"):
        KernelPlan(decode_gemv="lm_head")
    with pytest.raises(ValueError, match="MoE kernels must be one of mma, cuda, found 'tensor'"):
        KernelPlan(moe="tensor")
    with pytest.raises(Exception):  # frozen: a deployment's plan never changes under it
        KernelPlan().moe = "cuda"
    assert KernelPlan().describe() == "decode_gemv=head moe=mma throughput_shapes=off launch_table=default"
    assert KernelPlan("mma", "cuda").describe() == "decode_gemv=mma moe=cuda throughput_shapes=on launch_table=default"


def test_resolve_plan():
    assert resolve_plan() == KernelPlan("head", "mma")
    assert resolve_plan("auto", "cuda", max_num_seqs=8) == KernelPlan("mma", "cuda")
    assert resolve_plan("wide", max_num_seqs=64).decode_gemv == "wide"
    with pytest.raises(ValueError, match="decode_gemv must be 'auto' or one of .* found 'gpu'"):
        resolve_plan("gpu")
    with pytest.raises(ValueError, match="moe_kernels must be one of mma, cuda, found 'auto'"):
        resolve_plan(moe_kernels="auto")


@pytest.mark.parametrize("tie", [False, True])
def test_the_output_head_alone_is_marked(tie):
    """"head" serves exactly the linear that makes the logits: the lm_head, or the embedding table when tied."""
    model = tiny_model(moe=True, tie_word_embeddings=tie)
    marked = [name for name, m in model.named_modules() if fast.state(m).output_head]
    assert marked == (["embed_tokens"] if tie else ["lm_head"])


def test_head_mode_leaves_cpu_tensors_alone():
    """The tensor-core GEMV is CUDA-only: on the CPU every mode keeps the reference linear (no repacked copy)."""
    model = tiny_model(moe=True)
    fast.set_decode_gemv(model, "head")
    assert fast.mma_weights(model.lm_head, torch.zeros(1, model.config.hidden_size)) is None
    assert fast.state(model.lm_head).mma is None


def test_default_is_head():
    assert fast.decode_gemv() == "head" and fast.moe_kernels() == "mma"


def _gdn_prep(model, x):
    mixer = next(m for m in model.modules() if hasattr(m, "out_proj") and hasattr(m, "dv"))
    return fast.gdn_step_prep(mixer.out_proj, x, mixer.dv, mixer.hv)


def _merge_prep(model, x):
    from deltaserve.model.attention import GatedAttention

    attn = next(m for m in model.modules() if isinstance(m, GatedAttention))
    return fast.attn_merge_prep(attn.o_proj, x, attn.hq, attn.d)


@pytest.mark.parametrize("prep", [_gdn_prep, _merge_prep])
def test_no_prep_off_the_fast_path(prep):
    """On the CPU (no fast path) neither the DeltaNet step nor the attention merge preps its out projection."""
    model = tiny_model(moe=True)
    assert prep(model, torch.zeros(1, model.config.hidden_size)) is None


def test_merge_prep_formats():
    """The merge preps whole groups of a head: bits 4 or 8, a power-of-two group of 8 or more dividing head_dim."""
    from deltaserve.kernels.attention.triton_paged import merge_prep_supported

    assert merge_prep_supported(256, 4, 64) and merge_prep_supported(256, 8, 128) and merge_prep_supported(64, 4, 64)
    assert not merge_prep_supported(32, 4, 64)  # a group wider than a head
    assert not merge_prep_supported(256, 3, 64) and not merge_prep_supported(256, 4, 48)
    assert not merge_prep_supported(256, 4, 4)


def test_deployment_size_picks_the_mode():
    """A deployment's capacity, never its live batch, picks the GEMV: head for decode forwards of 1-3 rows, mma from
    4; a drafting deployment's rows are its streams' verify rows (k + 1 each)."""
    assert [decode_gemv_for_rows(n) for n in (1, 2, 3, 4, 8, 64)] == ["head"] * 3 + ["mma"] * 3
    with pytest.raises(ValueError, match="max_rows must be >= 1, found 0"):
        decode_gemv_for_rows(0)
    assert [decode_rows(1, k) for k in range(5)] == [1, 2, 3, 4, 5] and decode_rows(8, 2) == 24
    assert resolve_plan(max_num_seqs=1, speculative_tokens=2).decode_gemv == "head"
    assert resolve_plan(max_num_seqs=1, speculative_tokens=3).decode_gemv == "mma"
    assert resolve_plan(max_num_seqs=2, speculative_tokens=1).decode_gemv == "mma"
    assert resolve_plan("head", max_num_seqs=1, speculative_tokens=3).decode_gemv == "head"  # as given


def test_the_plan_covers_every_linear():
    """The plan is stamped on every module, the fused projections (kept outside the registered tree) included, and
    on weights fused afterwards; a bad mode names the allowed ones."""
    from deltaserve.model import fusion

    model = tiny_model(moe=True)
    assert fast.decode_gemv(model.lm_head) == "head"  # nothing fixed yet
    fast.set_decode_gemv(model, "mma")
    assert model.fuse_projections() > 0  # fused after the stamp: they inherit it
    fused = [f for m in model.modules() for f in m.__dict__.values() if isinstance(f, fusion.FusedLinear)]
    assert fused and all(fast.decode_gemv(f) == "mma" for f in fused)
    assert all(fast.decode_gemv(m) == "mma" for m in model.modules())
    fast.set_decode_gemv(model, "head")
    assert all(fast.decode_gemv(f) == "head" for f in fused)
    fast.set_plan(model, KernelPlan("cuda", "cuda"))
    assert fast.decode_gemv(model.lm_head) == "cuda" and fast.moe_kernels(model.layers[0].mlp) == "cuda"
    with pytest.raises(ValueError, match="decode GEMV mode must be one of mma, cuda, wide, head, found 'fast'"):
        fast.set_decode_gemv(model, "fast")


@pytest.mark.parametrize("seqs,choice,want", [(1, "auto", "head"), (3, "auto", "head"), (4, "auto", "mma"),
                                              (32, "auto", "mma"), (32, "head", "head"), (1, "wide", "wide")])
def test_engine_fixes_its_mode_from_max_num_seqs(seqs, choice, want):
    from deltaserve.engine.engine import EngineConfig, LLMEngine

    model = tiny_model(moe=True)
    engine = LLMEngine(model, None, [], EngineConfig(num_blocks=8, max_num_seqs=seqs, max_model_len=64,
                                                     decode_gemv=choice))
    assert engine.decode_gemv == want and engine.plan == KernelPlan(want, "mma")
    assert fast.decode_gemv(model.layers[0].mlp.gate) == want


def test_engine_rejects_an_unknown_mode():
    from deltaserve.engine.engine import EngineConfig, LLMEngine

    with pytest.raises(ValueError, match="decode_gemv must be 'auto' or one of .* found 'gpu'"):
        LLMEngine(tiny_model(moe=True), None, [], EngineConfig(num_blocks=8, max_model_len=64, decode_gemv="gpu"))


def test_info_prints_the_plan(tmp_path, capsys):
    from deltaserve.cli import main

    out = tmp_path / "cfg"
    assert main(["make-checkpoint", str(out), "--preset", "tiny-moe", "--config-only"]) == 0
    capsys.readouterr()
    assert main(["info", str(out), "--plan", "--max-num-seqs", "8"]) == 0
    text = capsys.readouterr().out
    assert "kernel plan: decode_gemv=mma moe=mma throughput_shapes=on" in text
    assert "DeltaNet decode step: 64 state columns a program" in text
    assert main(["info", str(out), "--plan", "--moe-kernels", "cuda"]) == 0
    assert "kernel plan: decode_gemv=head moe=cuda throughput_shapes=off" in capsys.readouterr().out


def _q4_linear(n: int = 32, k: int = 128):
    from deltaserve.quant.affine import AffineLinear, AffineSpec

    lin = AffineLinear(k, n, AffineSpec(bits=4, group_size=64))
    gen = torch.Generator().manual_seed(3)
    lin.weight.data = torch.randint(0, 2**31, lin.weight.shape, generator=gen, dtype=torch.int64).to(torch.uint32)
    lin.scales.data = torch.rand(lin.scales.shape, generator=gen).bfloat16()
    lin.biases.data = torch.rand(lin.biases.shape, generator=gen).bfloat16()
    return lin


def test_a_modules_fast_state_is_one_record_built_once():
    """The fast path keeps everything of a module in one FastState: the plan set_plan fixed, the output-head mark,
    the specs and the tensor-core GEMV's repacked copy, built once on first use (the same object after), counted by
    decode_copy_bytes; "head" repacks the output head alone, "mma" every eligible weight. (The copy is CUDA-only:
    a stand-in activation that says it is on CUDA drives the choice; the repack itself is plain torch.)"""
    from types import SimpleNamespace

    from deltaserve.kernels.quant import mma_gemv

    if not mma_gemv.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon: the tensor-core GEMV is never chosen")
    on_cuda = SimpleNamespace(is_cuda=True)
    model = torch.nn.Module()
    model.head, model.other = _q4_linear(), _q4_linear()
    fast.mark_output_head(model.head)
    fast.set_plan(model, KernelPlan("head", "mma"))
    assert fast.state(model.head).plan == fast.state(model.other).plan == KernelPlan("head", "mma")
    assert fast.mma_weights(model.other, on_cuda) is None and fast.state(model.other).mma is None
    copy = fast.mma_weights(model.head, on_cuda)
    assert copy is not None and fast.mma_weights(model.head, on_cuda) is copy and fast.state(model.head).mma is copy
    assert fast.weight_spec(model.head) is fast.state(model.head).specs["weight"] is fast.weight_spec(model.head)
    head_bytes = sum(t.numel() * t.element_size() for t in copy)
    assert fast.decode_copy_bytes(model) == head_bytes > 0
    fast.set_decode_gemv(model, "mma")
    other = fast.mma_weights(model.other, on_cuda)
    assert other is not None and fast.decode_copy_bytes(model) == 2 * head_bytes
    codes, scales, biases = mma_gemv.unpack_q4(*other)  # the copy holds the weight it was made from
    assert torch.equal(scales, model.other.scales) and torch.equal(biases, model.other.biases)
    want = (model.other.weight.to(torch.int64)[..., None] >> (4 * torch.arange(8))) & 15  # MLX: code j at bits 4j
    assert torch.equal(codes, want.reshape(codes.shape))


def test_an_moe_blocks_repacked_experts_live_in_its_fast_state(tmp_path):
    """The tensor-core MoE's repack of a q4 g64 block, on first use: the experts (the shared one stacked last) in the
    block's FastState, built once (the same object after), their MLX tensors released (the bank's record says so and
    its stacked specs are refused), counted by decode_copy_bytes; a deployment on the CUDA-core MoE builds none.
    (CUDA-only in use: a stand-in activation that says it is on CUDA drives the choice; the repack is plain torch.)"""
    from types import SimpleNamespace

    from deltaserve.kernels.quant import mma_gemv
    from deltaserve.weights.loader import load_checkpoint
    from deltaserve.weights.quantizer import quantize_checkpoint
    from model_helpers import make_hf_model, ours_from_checkpoint

    if not mma_gemv.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon: the tensor-core MoE is never chosen")
    hf = make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    ours_from_checkpoint(hf, tmp_path / "bf16")
    q4 = quantize_checkpoint(tmp_path / "bf16", tmp_path / "q4", 4, 64, progress=False)
    model = load_checkpoint(q4, dtype=torch.bfloat16, progress=False).model
    blocks = [m for m in model.modules() if hasattr(m, "experts")]
    on_cuda = SimpleNamespace(is_cuda=True)
    fast.set_plan(model, KernelPlan("head", "cuda"))
    assert all(fast.mma_moe_weights(b, on_cuda) is None for b in blocks) and fast.decode_copy_bytes(model) == 0
    fast.set_plan(model, KernelPlan("head", "mma"))
    block = blocks[0]
    gate_bytes = block.experts.gate_proj.weight.numel() * 4
    packed = fast.mma_moe_weights(block, on_cuda)
    assert packed is not None and packed.shared_last and fast.state(block).mma is packed
    assert fast.mma_moe_weights(block, on_cuda) is packed  # built once
    assert packed.gate[0].shape[0] == block.num_experts + 1  # the shared expert stacked last
    assert fast.state(block.experts).released and block.experts.gate_proj.weight.numel() == 0 < gate_bytes
    with pytest.raises(RuntimeError, match="released"):
        fast.stacked_specs(block.experts)
    assert fast.decode_copy_bytes(model) == sum(t.numel() * t.element_size() for t in fast.state(block).copies()) > 0
