"""The vision tower from every checkpoint format: HF (the reference), the FP8 release layout (tower kept bf16; a
block-FP8 vision linear), mlx-vlm's `vision_tower.*` spelling over an MLX-quantised text model (dense tower; an
affine-packed vision linear); text-only loading unchanged; clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from deltaserve.kernels.quant import fp8_block_dequantize, fp8_block_quantize
from deltaserve.kernels.quant.affine import affine_dequantize, affine_quantize
from deltaserve.weights.formats import CheckpointError
from deltaserve.weights.loader import load_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from deltaserve.weights.vision_format import checkpoint_has_vision
from test_quant_support import fp8_release
from vision_helpers import hf_vision_model, random_image, write_checkpoint

FC1 = "blocks.0.mlp.linear_fc1"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_checkpoint(hf_vision_model(False, seed=3), tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def pixels():
    from deltaserve.model.vision.processor import ImageProcessor, ImageProcessorConfig

    proc = ImageProcessor(ImageProcessorConfig(4, 2, 2, 256, 2304))
    images = [proc(random_image(40, 56, 0)), proc(random_image(24, 64, 1))]
    return torch.cat([p.pixel_values for p in images]), [p.grid for p in images]


def _features(tower, pixels):
    with torch.no_grad():
        return tower(*pixels)


def _params(tower):
    return {n: p for n, p in tower.named_parameters()}


def test_text_only_loading_is_unchanged(hf_dir):
    ckpt = load_checkpoint(hf_dir, dtype=torch.float32, progress=False)
    assert ckpt.vision is None and len(ckpt.set_aside["visual"]) > 0
    with_vision = load_checkpoint(hf_dir, dtype=torch.float32, progress=False, vision=True)
    assert "visual" not in with_vision.set_aside and "vision tower" in with_vision.summary()
    a, b = _params(ckpt.model), _params(with_vision.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fp8_release_keeps_the_tower_in_bf16(hf_dir, tmp_path, pixels):
    fp8 = fp8_release(hf_dir, tmp_path / "fp8")
    ref = load_checkpoint(hf_dir, dtype=torch.float32, progress=False, vision=True).vision
    got = load_checkpoint(fp8, dtype=torch.float32, progress=False, vision=True).vision
    for name, p in _params(ref).items():  # the release's bf16 copy, widened exactly
        assert torch.equal(_params(got)[name], p.bfloat16().float()), name


def test_fp8_block_vision_linear(hf_dir, tmp_path, pixels):
    """A vision linear stored as float8 + weight_scale_inv loads as an FP8 block linear: the features equal a dense
    tower holding the dequantised weight."""
    tensors = load_file(str(hf_dir / "model.safetensors"))
    name = f"model.visual.{FC1}.weight"
    w8, scale = fp8_block_quantize(tensors[name], (16, 16))
    tensors[name], tensors[name + "_scale_inv"] = w8, scale
    out = tmp_path / "fp8v"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]}
    (out / "config.json").write_text(json.dumps(cfg))
    got = load_checkpoint(out, dtype=torch.float32, progress=False, vision=True).vision
    ref = load_checkpoint(hf_dir, dtype=torch.float32, progress=False, vision=True).vision
    assert type(got.get_submodule(FC1)).__name__ == "Biased"
    with torch.no_grad():
        ref.get_submodule(FC1).weight.copy_(fp8_block_dequantize(w8, scale, (16, 16)))
    torch.testing.assert_close(_features(got, pixels), _features(ref, pixels), rtol=1e-5, atol=1e-6)


def _mlx_vlm(hf_dir, out, pack_fc1: bool):
    """An mlx-vlm-style conversion: the text model MLX-quantised (deltaserve quantize), plus `vision_tower.*` with
    the channels-last Conv3d weight, vision_config and image_token_id back in config.json."""
    quantize_checkpoint(hf_dir, out, bits=8, group_size=32, progress=False)
    src = load_file(str(hf_dir / "model.safetensors"))
    vis = {"vision_tower." + k[len("model.visual."):]: v for k, v in src.items() if k.startswith("model.visual.")}
    vis["vision_tower.patch_embed.proj.weight"] = vis["vision_tower.patch_embed.proj.weight"].permute(0, 2, 3, 4, 1)
    if pack_fc1:
        w, s, b = affine_quantize(vis.pop(f"vision_tower.{FC1}.weight"), 8, 32)
        vis.update({f"vision_tower.{FC1}.weight": w, f"vision_tower.{FC1}.scales": s,
                    f"vision_tower.{FC1}.biases": b})
    save_file({k: v.contiguous() for k, v in vis.items()}, str(out / "vision.safetensors"))
    index = out / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"].update({k: "vision.safetensors" for k in vis})
        index.write_text(json.dumps(data))
    cfg = json.loads((out / "config.json").read_text())
    src_cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.update(vision_config=src_cfg["vision_config"], image_token_id=src_cfg["image_token_id"])
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("pack_fc1", [False, True], ids=["dense-tower", "packed-fc1"])
def test_mlx_vlm_vision_tower(hf_dir, tmp_path, pixels, pack_fc1):
    out = _mlx_vlm(hf_dir, tmp_path / "mlx", pack_fc1)
    assert checkpoint_has_vision(out)
    got = load_checkpoint(out, dtype=torch.float32, progress=False, vision=True)
    assert got.format == "mlx"
    ref = load_checkpoint(hf_dir, dtype=torch.float32, progress=False, vision=True).vision
    if pack_fc1:
        m = got.vision.get_submodule(FC1)
        with torch.no_grad():
            ref.get_submodule(FC1).weight.copy_(affine_dequantize(m.weight, m.scales, m.biases, 8, 32))
        torch.testing.assert_close(_features(got.vision, pixels), _features(ref, pixels), rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(_features(got.vision, pixels), _features(ref, pixels))


def test_errors_name_the_problem(hf_dir, tmp_path):
    tensors = load_file(str(hf_dir / "model.safetensors"))
    out = tmp_path / "bad"
    out.mkdir()
    (out / "config.json").write_text((hf_dir / "config.json").read_text())
    missing = {k: v for k, v in tensors.items() if not k.endswith("merger.linear_fc2.bias")}
    save_file(missing, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.visual\.merger\.linear_fc2\.bias"):
        load_checkpoint(out, dtype=torch.float32, progress=False, vision=True)
    wrong = dict(tensors)
    wrong["model.visual.patch_embed.proj.weight"] = torch.zeros(32, 3, 2, 4, 5)
    save_file(wrong, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match="patch_embed"):
        load_checkpoint(out, dtype=torch.float32, progress=False, vision=True)
    text_only = {k: v for k, v in tensors.items() if not k.startswith("model.visual.")}
    save_file(text_only, str(out / "model.safetensors"))
    assert not checkpoint_has_vision(out)
    with pytest.raises(CheckpointError, match="no vision tower tensors"):
        load_checkpoint(out, dtype=torch.float32, progress=False, vision=True)
