"""Synthetic quantised checkpoints written straight in the MLX layout: the same bytes as quantising the bf16
synthetic checkpoint of the same seed (with deltaserve's quantiser and with mlx_lm.convert), and mlx_lm and
deltaserve agree on them, qwen3_next's fused projections included."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from deltaserve.synthetic import make_checkpoint
from deltaserve.synthetic.quantized import write_quantized_synthetic
from deltaserve.weights import load_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from test_quant_support import assert_logits_close, mlx_logits, mlx_model_fp32, ours_logits, same_tensors


def shards(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("model*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("preset,quant", [("tiny-moe", "q4"), ("tiny-dense", "q8"), ("tiny-next", "q4")])
def test_direct_mlx_write_equals_quantising_the_bf16_checkpoint(tmp_path, preset, quant):
    direct = write_quantized_synthetic(tmp_path / "direct", preset, quant, seed=5, progress=False)
    bf16 = make_checkpoint(tmp_path / "bf16", preset, seed=5, progress=False)
    via = quantize_checkpoint(bf16, tmp_path / "via", int(quant[1]), 64, progress=False)
    assert same_tensors(shards(direct), shards(via)) == []
    cfg = json.loads((direct / "config.json").read_text())
    assert cfg["quantization"] == json.loads((via / "config.json").read_text())["quantization"]
    assert cfg["quantization"]["bits"] == int(quant[1]) and "vision_config" not in cfg


def test_direct_mlx_write_equals_mlx_lm_convert(tmp_path):
    pytest.importorskip("mlx_lm")
    from mlx_lm import convert

    direct = write_quantized_synthetic(tmp_path / "direct", "tiny-moe", "q4", seed=1, progress=False)
    bf16 = make_checkpoint(tmp_path / "bf16", "tiny-moe", seed=1, progress=False)
    convert(str(bf16), str(tmp_path / "mlx"), quantize=True, q_bits=4, q_group_size=64)
    ours = shards(direct)
    body = {k: v for k, v in ours.items() if not k.startswith("mtp.")}  # mlx_lm.convert drops the MTP head; we keep it
    assert len(body) < len(ours) and same_tensors(body, shards(tmp_path / "mlx")) == []


@pytest.mark.parametrize("preset,quant", [("tiny-moe", "q4"), ("tiny-dense", "q8"), ("tiny-next", "q4")])
def test_mlx_lm_and_deltaserve_agree_on_synthetic_quantised(tmp_path, preset, quant):
    pytest.importorskip("mlx_lm")
    from mlx_lm import load

    path = write_quantized_synthetic(tmp_path / "q", preset, quant, seed=2, progress=False)
    load(str(path))  # tokenizer and all
    ours = load_checkpoint(path, dtype=torch.float32, progress=False)
    ids = torch.randint(0, 1000, (45,), generator=torch.Generator().manual_seed(0)).tolist()
    # The acceptance bound. These random presets are less well conditioned than the transformers-initialised tiny
    # models: deltaserve's and mlx_lm's fp32 DeltaNet formulations (eps placement in the q/k norms) drift apart by
    # ~2e-4 here with or without quantisation, so the 1e-4 used on the transformers models would be too tight.
    assert_logits_close(ours_logits(ours.model, ids), mlx_logits(mlx_model_fp32(path), ids), 1e-3)


def test_unknown_quant_is_refused(tmp_path):
    with pytest.raises(ValueError, match="quant must be one of q2, q3, q4, q5, q6, q8; found 'q7'"):
        write_quantized_synthetic(tmp_path, "tiny-moe", "q7")
