"""Qwen FP8 block checkpoints in the release layout (per-expert tensors, float8_e4m3fn + weight_scale_inv,
unconverted layers in bf16): logits within FP8 tolerance of the source, exactly those of the dequantised weights,
FP8 bytes kept in memory, and errors that name the tensor and file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from deltaserve.kernels.quant import fp8_block_dequantize
from deltaserve.quant import DenseLinear, Fp8Linear, Fp8Stacked
from deltaserve.weights import CheckpointError, load_checkpoint
from test_quant_support import VOCAB, assert_logits_close, fp8_release, ours_logits, write_hf_checkpoint

LM = "model.language_model."


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory):
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf") / "moe", moe=True)


@pytest.fixture(scope="module")
def hf_dense(tmp_path_factory):
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf") / "dense", moe=False, tie=True, seed=2)


def ids(seed: int = 0, n: int = 48) -> list[int]:
    return torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("block", [128, 32])
@pytest.mark.parametrize("which", ["moe", "dense"])
def test_fp8_logits_within_fp8_tolerance_of_the_source(request, tmp_path, which, block):
    hf = request.getfixturevalue(f"hf_{which}")
    fp8 = fp8_release(hf, tmp_path / "fp8", block=block)
    q = load_checkpoint(fp8, dtype=torch.float32, progress=False)
    src = load_checkpoint(hf, dtype=torch.float32, progress=False)
    assert q.format == "fp8"
    # e4m3 keeps 3 mantissa bits (2^-4 relative per weight) and the unconverted layers were rounded to bf16
    assert_logits_close(ours_logits(q.model, ids()), ours_logits(src.model, ids()), 3e-2)


def test_fp8_equals_its_dequantised_weights_with_bf16_scales(tmp_path, hf_moe):
    """The packed FP8 path computes exactly with W8 * scale_inv: compare to a dense checkpoint of those weights."""
    fp8 = fp8_release(hf_moe, tmp_path / "fp8", block=32, scale_dtype=torch.bfloat16)
    tensors = load_file(str(fp8 / "model.safetensors"))
    assert tensors[f"{LM}layers.0.mlp.experts.5.up_proj.weight_scale_inv"].dtype == torch.bfloat16
    dense = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        dense[name] = t.float() if scale is None else fp8_block_dequantize(t, scale, (32, 32), torch.float32)
    (tmp_path / "dense").mkdir()
    save_file(dense, str(tmp_path / "dense" / "model.safetensors"))
    cfg = json.loads((fp8 / "config.json").read_text())
    cfg.pop("quantization_config")
    (tmp_path / "dense" / "config.json").write_text(json.dumps(cfg))
    q = load_checkpoint(fp8, dtype=torch.float32, progress=False)
    d = load_checkpoint(tmp_path / "dense", dtype=torch.float32, progress=False)
    assert d.format == "hf"
    assert_logits_close(ours_logits(q.model, ids(3)), ours_logits(d.model, ids(3)), 1e-5)


def test_fp8_stays_fp8_in_memory(tmp_path, hf_moe):
    q = load_checkpoint(fp8_release(hf_moe, tmp_path / "fp8"), progress=False).model  # bf16 model
    experts = q.layers[0].mlp.experts
    assert isinstance(experts.gate_proj, Fp8Stacked) and experts.gate_proj.weight.dtype == torch.uint8
    assert experts.gate_proj.weight.shape == (8, 32, 64) and experts.gate_proj.weight_scale_inv.shape == (8, 1, 1)
    assert experts.gate_proj.weight_scale_inv.dtype == torch.float32
    attn = q.layers[0].linear_attn
    assert isinstance(attn.in_proj_qkv, Fp8Linear) and attn.in_proj_qkv.weight.dtype == torch.uint8
    assert isinstance(attn.in_proj_a, DenseLinear) and attn.in_proj_a.weight.dtype == torch.bfloat16
    assert isinstance(q.layers[0].mlp.gate, DenseLinear)


# ---- errors ----------------------------------------------------------------------------------------------------


def rewrite(fp8_dir, edit) -> None:
    path = fp8_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_missing_scale_of_one_expert_is_named(tmp_path, hf_moe):
    fp8 = fp8_release(hf_moe, tmp_path / "fp8")
    name = f"{LM}layers.2.mlp.experts.6.down_proj.weight"
    rewrite(fp8, lambda t: t.pop(name + "_scale_inv"))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(fp8, progress=False)
    assert "model.safetensors" in str(e.value) and f"'{name}' is float8_e4m3fn" in str(e.value)
    assert f"'{name}_scale_inv' are not in the checkpoint" in str(e.value)


def test_missing_scale_of_a_linear_is_named(tmp_path, hf_moe):
    fp8 = fp8_release(hf_moe, tmp_path / "fp8")
    name = f"{LM}layers.3.self_attn.o_proj.weight"
    rewrite(fp8, lambda t: t.pop(name + "_scale_inv"))
    with pytest.raises(CheckpointError, match=f"tensor '{name}' is float8_e4m3fn but its block scales"):
        load_checkpoint(fp8, progress=False)


def test_scale_of_the_wrong_shape_is_named(tmp_path, hf_moe):
    fp8 = fp8_release(hf_moe, tmp_path / "fp8", block=32)
    name = f"{LM}layers.0.linear_attn.in_proj_qkv.weight_scale_inv"  # [128, 64] -> [4, 2] blocks of 32

    def edit(t):
        t[name] = torch.ones(4, 3)

    rewrite(fp8, edit)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}': shape \[4, 3\], expected \[4, 2\]"):
        load_checkpoint(fp8, progress=False)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("fmt", "e5m2", r"quantization_config.fmt is 'e5m2'"),
        ("weight_block_size", [128], r"quantization_config.weight_block_size must be two positive integers"),
        ("modules_to_not_convert", "lm_head", r"modules_to_not_convert must be a list"),
    ],
)
def test_bad_fp8_config_is_named(tmp_path, hf_moe, field, value, message):
    fp8 = fp8_release(hf_moe, tmp_path / "fp8")
    cfg = json.loads((fp8 / "config.json").read_text())
    cfg["quantization_config"][field] = value
    (fp8 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(fp8, progress=False)
