"""`deltaserve info` (describe_checkpoint / checkpoint_sizes): sizes from config alone match what loading
allocates, and the published Qwen3.6-35B-A3B at 4-bit comes out at the published ~19 GB."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from deltaserve.synthetic import make_checkpoint
from deltaserve.weights import load_checkpoint
from deltaserve.weights.inspect import checkpoint_sizes, describe_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from test_quant_support import fp8_release, write_hf_checkpoint


def mlx_entry(layers: int, bits: int = 4, group: int = 64) -> dict:
    """The quantization entry mlx_lm.convert writes for a Qwen3.5 MoE: 8-bit routers and shared gates per layer."""
    entry = {"group_size": group, "bits": bits, "mode": "affine"}
    for i in range(layers):
        for gate in ("mlp.gate", "mlp.shared_expert_gate"):
            entry[f"language_model.model.layers.{i}.{gate}"] = {"group_size": 64, "bits": 8}
    return entry


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("c") / "35b", "qwen3.6-35b-a3b", config_only=True, progress=False)


def with_entry(src, dst, **entries):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(entries)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_qwen36_35b_a3b_4bit_is_about_19_gb(published, tmp_path):
    q4 = with_entry(published, tmp_path / "q4", quantization=mlx_entry(40), quantization_config=mlx_entry(40))
    s = checkpoint_sizes(q4)
    assert s.config_only and s.kind == "mlx"
    assert 34.0e9 < s.parameters < 35.5e9  # text model (vision tower and MTP head not resident)
    assert 18.5e9 < s.resident_bytes < 20.5e9, s.resident_bytes  # published mlx-community 4-bit: ~19 GB
    assert s.rows["routed experts"][1] * 8 / s.rows["routed experts"][0] == pytest.approx(4.5)
    assert s.rows["router + shared gate"][1] * 8 / s.rows["router + shared gate"][0] == pytest.approx(8.5)
    text = describe_checkpoint(q4)
    assert "MLX affine 4-bit, group 64 (80 per-layer overrides)" in text and "config only" in text
    assert "30 Gated DeltaNet + 10 gated attention" in text and "routed experts" in text


def test_qwen36_35b_a3b_bf16_and_fp8(published, tmp_path):
    bf16 = checkpoint_sizes(published)
    assert bf16.kind == "hf" and bf16.resident_bytes == pytest.approx(2 * bf16.parameters, rel=1e-4)
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate", "in_proj_a",
                                     "in_proj_b"]}  # fmt: skip
    fp8 = checkpoint_sizes(with_entry(published, tmp_path / "fp8", quantization_config=qc))
    assert fp8.kind == "fp8" and fp8.parameters == bf16.parameters
    assert fp8.rows["routed experts"][1] == pytest.approx(fp8.rows["routed experts"][0], rel=1e-3)  # 1 byte/weight
    assert fp8.rows["router + shared gate"][1] == 2 * fp8.rows["router + shared gate"][0]  # not converted: bf16
    assert 35e9 < fp8.resident_bytes < 37e9


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory):
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf") / "moe", moe=True)


@pytest.mark.parametrize("kind", ["hf", "mlx-q4", "mlx-q8-g32", "fp8"])
def test_sizes_equal_the_bytes_loading_allocates(tmp_path, hf_moe, kind):
    if kind == "hf":
        path = hf_moe
    elif kind == "fp8":
        path = fp8_release(hf_moe, tmp_path / "fp8", block=32)
    else:
        bits, group = (4, 64) if kind == "mlx-q4" else (8, 32)
        path = quantize_checkpoint(hf_moe, tmp_path / kind, bits, group, progress=False)
    s = checkpoint_sizes(path)
    model = load_checkpoint(path, progress=False).model
    assert s.kind == kind.split("-")[0] and not s.config_only
    assert s.resident_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert "on disk:" in describe_checkpoint(path)


def test_config_only_mlx_sizes_predict_the_converted_checkpoint(tmp_path, hf_moe):
    """Without weights, the quantised set follows mlx_lm's rule; it must agree with what the quantiser wrote."""
    q = quantize_checkpoint(hf_moe, tmp_path / "q", 4, 64, progress=False)
    cfg_only = tmp_path / "cfg"
    cfg_only.mkdir()
    shutil.copy(q / "config.json", cfg_only / "config.json")
    a, b = checkpoint_sizes(q), checkpoint_sizes(cfg_only)
    assert b.config_only and a.rows == b.rows
    model = load_checkpoint(q, dtype=torch.float32, progress=False).model  # fp32 scales: bigger, same params
    assert sum(p.numel() for p in model.parameters() if p.dtype == torch.uint32) > 0
