"""Bad MLX checkpoints and bad quantiser arguments: each error names the file, the tensor or field, what was
expected and what was found."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from deltaserve.weights import CheckpointError, load_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from test_quant_support import write_hf_checkpoint

P = "language_model.model.layers.0"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A 4-bit and an 8-bit MLX checkpoint of one tiny MoE model (written by deltaserve's quantiser)."""
    root = tmp_path_factory.mktemp("mlx")
    hf = write_hf_checkpoint(root / "hf", moe=True)
    return {bits: quantize_checkpoint(hf, root / f"q{bits}", bits, 64, progress=False) for bits in (4, 8)}


@pytest.fixture
def ckpt(tmp_path, good):
    """A private copy of the 4-bit checkpoint to damage."""
    return shutil.copytree(good[4], tmp_path / "q4")


def edit_config(path, edit) -> None:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def edit_tensors(path, edit) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "model.safetensors.index.json").unlink()


def load_error(path) -> str:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, progress=False)
    return str(e.value)


def test_good_checkpoints_load(good):
    for path in good.values():
        assert load_checkpoint(path, progress=False).format == "mlx"


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("bits", 7, "config.json: quantization: unsupported affine bits 7; supported: 2, 3, 4, 5, 6, 8"),
        ("group_size", 16, "config.json: quantization: unsupported group size 16; supported: 32, 64, 128"),
        ("mode", "mxfp4", "config.json: quantization: quantisation mode 'mxfp4' is not supported"),
        ("bits", "4", "config.json: quantization: field 'bits' must be an integer, found '4'"),
    ],
)
def test_unsupported_global_spec(ckpt, field, value, message):
    edit_config(ckpt, lambda c: c["quantization"].__setitem__(field, value))
    assert message in load_error(ckpt)


def test_unsupported_override_spec(ckpt):
    edit_config(ckpt, lambda c: c["quantization"].__setitem__(f"{P}.mlp.gate", {"group_size": 64, "bits": 9}))
    assert f"config.json: quantization['{P}.mlp.gate']: unsupported affine bits 9" in load_error(ckpt)


def test_scales_shape_mismatch_names_tensor_and_file(ckpt):
    name = f"{P}.linear_attn.in_proj_qkv.scales"
    edit_tensors(ckpt, lambda t: t.__setitem__(name, torch.ones(128, 2)))
    msg = load_error(ckpt)
    assert "model.safetensors" in msg and f"tensor '{name}' has shape [128, 2]" in msg
    assert "(4-bit, group 64) for 64 input features expects last dim 1 (scales shape mismatch)" in msg


def test_biases_rows_mismatch_names_tensor(ckpt):
    name = f"{P}.linear_attn.out_proj.biases"
    edit_tensors(ckpt, lambda t: t.__setitem__(name, torch.ones(63, 1)))
    assert f"tensor '{name}': shape [63, 1], expected [64, 1]" in load_error(ckpt)


def test_weight_width_of_other_bits_is_explained(tmp_path, good):
    path = shutil.copytree(good[8], tmp_path / "q8")  # 8-bit codes, config claiming 4-bit
    edit_config(path, lambda c: c["quantization"].__setitem__("bits", 4))
    msg = load_error(path)
    assert "has shape [" in msg and "its width implies 8-bit codes" in msg


def test_override_naming_no_tensor(ckpt):
    key = "language_model.model.layers.9.mlp.gate"  # the model has 4 layers
    edit_config(ckpt, lambda c: c["quantization"].__setitem__(key, {"group_size": 64, "bits": 8}))
    assert f"quantization['{key}'] is a per-layer override naming no tensor (no '{key}.weight'" in load_error(ckpt)


def test_override_naming_no_language_model_module(ckpt):
    key = "vision_tower.blocks.0.attn.qkv"
    edit_config(ckpt, lambda c: c["quantization"].__setitem__(key, {"group_size": 64, "bits": 4}))
    assert f"quantization['{key}'] is a per-layer override naming no tensor (no '{key}.weight'" in load_error(ckpt)


def test_override_of_a_set_aside_vision_module_is_accepted(ckpt):
    """mlx-vlm conversions keep `vision_tower.*`; an override for one of its modules is valid but unused."""
    key = "vision_tower.blocks.0.attn.qkv"
    edit_config(ckpt, lambda c: c["quantization"].__setitem__(key, False))
    edit_tensors(ckpt, lambda t: t.__setitem__(f"{key}.weight", torch.zeros(96, 32, dtype=torch.bfloat16)))
    loaded = load_checkpoint(ckpt, progress=False)
    assert loaded.set_aside["visual"] == [f"{key}.weight"]


def test_override_disagreeing_with_the_tensors(ckpt):
    key = f"{P}.mlp.switch_mlp.down_proj"  # I = 32 < group 64: stored unquantised
    edit_config(ckpt, lambda c: c["quantization"].__setitem__(key, {"group_size": 32, "bits": 4}))
    assert f"quantization['{key}'] says 4-bit but the checkpoint has no '{key}.scales'" in load_error(ckpt)


def test_quantised_tensors_without_a_quantization_entry(ckpt):
    def drop(c):
        c.pop("quantization")
        c.pop("quantization_config")

    edit_config(ckpt, drop)
    assert "quantised tensors but config.json has no 'quantization' entry" in load_error(ckpt)


def test_missing_biases_are_named(ckpt):
    name = f"{P}.linear_attn.in_proj_z.biases"
    edit_tensors(ckpt, lambda t: t.pop(name))
    msg = load_error(ckpt)
    assert f"missing tensor {name}: expected shape [64, 1]" in msg


# ---- quantiser arguments --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits,group,message", [(7, 64, "unsupported affine bits 7"), (4, 48, "unsupported group size 48")])
def test_quantize_rejects_unsupported_spec(tmp_path, good, bits, group, message):
    with pytest.raises(ValueError, match=message):
        quantize_checkpoint(good[4], tmp_path / "out", bits, group, progress=False)
    assert not (tmp_path / "out").exists()


def test_quantize_refuses_to_overwrite(tmp_path, good):
    with pytest.raises(ValueError, match="already holds safetensors files"):
        quantize_checkpoint(good[4], good[8], 4, 64, progress=False)
    with pytest.raises(ValueError, match="must differ from the input"):
        quantize_checkpoint(good[4], good[4], 4, 64, progress=False)
