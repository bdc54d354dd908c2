"""Loading a 4-bit MLX checkpoint never materialises dense weights: the peak RSS of the load grows by at most 1.5x
the packed checkpoint size (a dense bf16 copy of the same model would be ~3.6x)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from deltaserve.model import ModelConfig, Qwen3_5ForCausalLM
from deltaserve.quant import AffineWeights, mlx_names

import rss_probe

QUANT = {"group_size": 64, "bits": 4, "mode": "affine"}
TEXT = dict(
    vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
    num_experts=32, num_experts_per_tok=2, moe_intermediate_size=512, shared_expert_intermediate_size=512,
)  # fmt: skip

def write_random_mlx_q4(path: Path) -> int:
    """A random 4-bit MLX checkpoint (random codes, scales and biases; MLX names and layouts); returns its bytes."""
    config = {"model_type": "qwen3_5_moe", "text_config": TEXT, "tie_word_embeddings": False, "quantization": QUANT}
    cfg = ModelConfig.from_dict(config)
    with torch.device("meta"):
        meta = Qwen3_5ForCausalLM(cfg, AffineWeights(QUANT, None, cfg.model_type), norm_offset=0.0)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, p in meta.named_parameters():
        if p.dtype == torch.uint32:
            t = torch.randint(-(2**31), 2**31, p.shape, generator=g, dtype=torch.int64).to(torch.int32).view(torch.uint32)
        elif name.endswith("conv1d.weight"):
            t = torch.randn(p.shape[0], p.shape[2], 1, generator=g).bfloat16()  # MLX [C, K, 1]
        elif name.endswith(("A_log", "dt_bias")):
            t = torch.randn(p.shape, generator=g)  # fp32, as the formats hold them
        else:
            t = (torch.randn(p.shape, generator=g) * 0.01).bfloat16()
        tensors[mlx_names.to_mlx(name, cfg.model_type)] = t
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_peak_rss_of_a_4bit_load_stays_near_the_packed_size(tmp_path):
    size = write_random_mlx_q4(tmp_path)
    assert 100e6 < size < 200e6
    r = rss_probe.measure("load", tmp_path)
    assert r["param_bytes"] == size  # every byte of the file is a parameter byte, nothing expanded
    dense_bf16 = r["packed_words"] * 8 * 2  # the same weights dequantised to bf16
    assert dense_bf16 > 3 * size
    growth = r["peak"] - r["before"]
    assert growth <= 1.5 * size, f"peak RSS grew {growth / 2**20:.0f} MiB for {size / 2**20:.0f} MiB packed"


def write_random_bf16(path: Path) -> int:
    """A random bf16 HF checkpoint (fused experts, two shards) of the TEXT model with 16 experts; returns its bytes."""
    config = {"model_type": "qwen3_5_moe", "text_config": dict(TEXT, num_experts=16, dtype="bfloat16"),
              "tie_word_embeddings": False}  # fmt: skip
    with torch.device("meta"):
        meta = Qwen3_5ForCausalLM(ModelConfig.from_dict(config))
    g = torch.Generator().manual_seed(0)
    names = [n for n, _ in meta.named_parameters()]
    path.mkdir(parents=True, exist_ok=True)
    size = 0
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        tensors = {}
        for n in part:
            t = (torch.randn(meta.get_parameter(n).shape, generator=g) * 0.02).bfloat16()
            tensors[n if n == "lm_head.weight" else "model.language_model." + n] = t
            size += t.numel() * 2
        save_file(tensors, str(path / f"model-0000{i + 1}-of-00002.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return size


def test_quantizer_streams_without_a_dense_copy(tmp_path):
    """quantize_checkpoint holds one module at a time and streams its output to disk: its peak RSS grows by well under
    the size of the bf16 input (measured ~0.33x here, where the largest module, the embedding, is 11% of the model;
    a dense copy would be 1x, holding the 4-bit output ~0.3x more)."""
    size = write_random_bf16(tmp_path / "bf16")
    assert 250e6 < size < 350e6
    r = rss_probe.measure("quantize", tmp_path / "bf16", tmp_path / "q4")
    growth = r["peak"] - r["before"]
    assert growth <= 0.45 * size, f"peak RSS grew {growth / 2**20:.0f} MiB quantising {size / 2**20:.0f} MiB of bf16"
