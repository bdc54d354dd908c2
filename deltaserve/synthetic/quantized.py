"""Synthetic quantised checkpoints written directly in the MLX layout (no intermediate HF files).

The preset's tensors are generated one by one from the same deterministic specs `make_checkpoint` uses (so a
quantised synthetic checkpoint is the quantisation of the bf16 one with the same seed) and fed straight to the MLX
writer of `weights.quantizer`: names, stacked switch_mlp experts, conv [C, K, 1], +1 norms, 8-bit routers.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..model.config import ModelConfig
from ..weights.formats import TensorInfo
from ..weights.quantizer import MLX_KEEPS_MTP, write_mlx_checkpoint
from .init import Rng
from .layout import TensorSpec, checkpoint_tensors
from .presets import Preset, get_preset
from .writer import make_checkpoint

_QUANT = re.compile(r"^q([234568])$")


class _SyntheticSource:
    """TensorSource over a preset's tensor specs: values made on demand, bf16 (A_log fp32) as published."""

    def __init__(self, specs: list[TensorSpec], seed: int, label: str):
        self.label = label
        self._specs = {s.name: s for s in specs}
        self._rng = Rng(seed)
        self.infos = [TensorInfo(s.name, label, s.shape, "F32" if s.keep_fp32 else "BF16") for s in specs]

    def read(self, info: TensorInfo) -> torch.Tensor:
        spec = self._specs[info.name]
        return spec.make(self._rng).to(torch.float32 if spec.keep_fp32 else torch.bfloat16).contiguous()


def write_quantized_synthetic(
    out_dir: str | Path, preset: str | Preset, quant: str = "q4", seed: int = 0, group_size: int = 64,
    progress: bool = True,
) -> Path:
    """Write `preset` (random weights from `seed`) to `out_dir` as an MLX affine checkpoint.

    quant: "q4" | "q8" (also "q2", "q3", "q5", "q6"); group_size 32 | 64 | 128. Writes config.json (with the
    `quantization` entry), tokenizer files and model*.safetensors, the MTP head included (as `deltaserve quantize`
keeps it). Loads in mlx_lm and deltaserve. Returns out_dir.
    """
    m = _QUANT.match(quant)
    if m is None:
        raise ValueError(f"quant must be one of q2, q3, q4, q5, q6, q8; found {quant!r}")
    preset = get_preset(preset)
    out = make_checkpoint(out_dir, preset, seed=seed, dtype="bf16", config_only=True, progress=False)
    cfg = ModelConfig.from_dir(out)
    mtp = cfg.mtp_num_hidden_layers if preset.mtp_layers is None else preset.mtp_layers  # as make_checkpoint
    mtp = mtp if cfg.model_type in MLX_KEEPS_MTP else 0
    specs = checkpoint_tensors(cfg, None, preset.expert_layout, mtp)  # no vision (mlx_lm drops it); the MTP head kept
    source = _SyntheticSource(specs, seed, f"<synthetic {preset.name} seed {seed}>")
    write_mlx_checkpoint(cfg, source, out, int(m.group(1)), group_size, progress)
    return out
