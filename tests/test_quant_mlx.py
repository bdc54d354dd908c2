"""MLX affine checkpoints against mlx_lm: mlx_lm.convert output loads in deltaserve with mlx_lm's logits and greedy
tokens; deltaserve's own quantiser writes the same bytes as mlx_lm.convert, and its output loads in both."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from deltaserve.quant import AffineEmbedding, AffineLinear, AffineStacked, DenseEmbedding, DenseLinear, DenseStacked
from deltaserve.weights import load_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from test_quant_support import (
    VOCAB,
    assert_logits_close,
    fp8_release,
    mlx_greedy,
    mlx_logits,
    mlx_model_fp32,
    ours_logits,
    same_tensors,
    write_hf_checkpoint,
)

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

REL = 1e-4  # both sides dequantise to identical fp32 weights; the acceptance bound is 1e-3
CASES = {
    # name: (moe, tie, bits, group)
    "moe-q4-g64": (True, False, 4, 64),
    "moe-q8-g64": (True, False, 8, 64),
    "moe-q3-g32": (True, False, 3, 32),
    "dense-tied-q4-g64": (False, True, 4, 64),
    "dense-q6-g32": (False, False, 6, 32),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {
        (True, False): write_hf_checkpoint(root / "moe", moe=True),
        (False, True): write_hf_checkpoint(root / "dense-tied", moe=False, tie=True),
        (False, False): write_hf_checkpoint(root / "dense", moe=False, seed=3),
    }


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, hf_dirs, tmp_path_factory):
    """(case, HF dir, mlx_lm.convert output, deltaserve quantize_checkpoint output)."""
    from mlx_lm import convert

    moe, tie, bits, group = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf = hf_dirs[(moe, tie)]
    convert(str(hf), str(root / "mlx"), quantize=True, q_bits=bits, q_group_size=group)
    quantize_checkpoint(hf, root / "ours", bits, group, progress=False)
    return request.param, hf, root / "mlx", root / "ours"


def prompt(seed: int, n: int) -> list[int]:
    return torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_mlx_lm_convert_output_gives_mlx_lm_logits(converted):
    _, _, mlx_dir, _ = converted
    ours = load_checkpoint(mlx_dir, dtype=torch.float32, progress=False)
    assert ours.format == "mlx"
    ref = mlx_model_fp32(mlx_dir)
    for seed, n in ((0, 1), (1, 37), (2, 130)):
        ids = prompt(seed, n)
        assert_logits_close(ours_logits(ours.model, ids), mlx_logits(ref, ids), REL)


def test_greedy_continuation_matches_mlx_lm(converted):
    _, _, mlx_dir, _ = converted
    ours = load_checkpoint(mlx_dir, dtype=torch.float32, progress=False)
    ids = prompt(7, 50)
    from model_helpers import greedy

    got, _ = greedy(ours.model, ids, 24, prefill_chunk=16)
    assert got == mlx_greedy(mlx_model_fp32(mlx_dir), ids, 24)


def test_quantize_checkpoint_writes_what_mlx_lm_convert_writes(converted):
    name, _, mlx_dir, ours_dir = converted
    a, b = load_file(str(ours_dir / "model.safetensors")), load_file(str(mlx_dir / "model.safetensors"))
    assert same_tensors(a, b) == []
    qa = json.loads((ours_dir / "config.json").read_text())
    qb = json.loads((mlx_dir / "config.json").read_text())
    assert qa["quantization"] == qb["quantization"] == qa["quantization_config"]
    if CASES[name][0]:  # MoE: 8-bit routers and shared-expert gates, one override each per layer
        assert sum(isinstance(v, dict) for v in qa["quantization"].values()) == 2 * 4


def test_quantize_checkpoint_output_loads_in_mlx_lm_and_deltaserve_alike(converted):
    from mlx_lm import load

    _, _, _, ours_dir = converted
    load(str(ours_dir))  # the full mlx_lm entry point, tokenizer included
    ours = load_checkpoint(ours_dir, dtype=torch.float32, progress=False)
    ids = prompt(11, 64)
    assert_logits_close(ours_logits(ours.model, ids), mlx_logits(mlx_model_fp32(ours_dir), ids), REL)


def test_quantised_weights_stay_packed_in_memory(converted):
    name, _, mlx_dir, _ = converted
    _, _, bits, group = CASES[name]
    model = load_checkpoint(mlx_dir, progress=False).model  # checkpoint dtype: fp32 scales for this fp32 source
    packed = [m for m in model.modules() if isinstance(m, (AffineLinear, AffineStacked, AffineEmbedding))]
    assert packed and all(m.weight.dtype == torch.uint32 for m in packed)
    # the only dense weights left are those mlx_lm cannot quantise (input width not a multiple of the group)
    for m in model.modules():
        if isinstance(m, (DenseLinear, DenseStacked, DenseEmbedding)):
            assert m.weight.shape[-1] % group != 0, m
    lin = model.layers[0].linear_attn.in_proj_qkv
    assert isinstance(lin, AffineLinear) and lin.spec.bits == bits and lin.spec.group_size == group
    assert lin.weight.shape == (lin.out_features, lin.in_features * bits // 32)
    assert lin.scales.shape == lin.biases.shape == (lin.out_features, lin.in_features // group)


def test_4bit_g64_bf16_is_4_5_bits_per_weight(tmp_path, hf_dirs):
    quantize_checkpoint(hf_dirs[(True, False)], tmp_path / "q", 4, 64, progress=False)
    model = load_checkpoint(tmp_path / "q", dtype=torch.bfloat16, progress=False).model
    lin = model.layers[3].self_attn.q_proj
    nbytes = sum(p.numel() * p.element_size() for p in (lin.weight, lin.scales, lin.biases))
    assert 8 * nbytes / (lin.in_features * lin.out_features) == 4.5


def test_fp8_checkpoint_quantises_to_mlx_that_both_engines_agree_on(tmp_path, hf_dirs):
    fp8 = fp8_release(hf_dirs[(True, False)], tmp_path / "fp8", block=32)
    quantize_checkpoint(fp8, tmp_path / "q8", 8, 64, progress=False)
    out = load_checkpoint(tmp_path / "q8", dtype=torch.float32, progress=False)
    src = load_checkpoint(fp8, dtype=torch.float32, progress=False)
    ids = prompt(5, 40)
    got = ours_logits(out.model, ids)
    assert_logits_close(got, mlx_logits(mlx_model_fp32(tmp_path / "q8"), ids), REL)
    assert_logits_close(got, ours_logits(src.model, ids), 2e-2)  # 8-bit requantisation of bf16-dequantised FP8
