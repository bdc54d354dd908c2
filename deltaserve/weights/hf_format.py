"""The Hugging Face unquantised format (bf16/fp16/fp32): qwen3_5, qwen3_5_moe (fused or per-expert experts) and
the flat qwen3_next layout. Name mapping lives in `names.py`; this class adapts it to the CheckpointFormat protocol.
"""

from __future__ import annotations

from typing import Collection

import torch
from torch import nn

from ..model.config import ModelConfig
from ..model.layers import DenseWeights, WeightFactory
from .formats import FLOAT_DTYPES, Mapped, Placement, SetAside, TensorInfo
from .names import Aside, map_hf_name, hf_source_name, strip_language_prefix

# Parameters of the gate computation g = -exp(A_log) * softplus(a + dt_bias): kept fp32 when the model runs in a
# 16-bit dtype (the published checkpoints store A_log in fp32 already; exp() amplifies any rounding).
FP32_PARAMS = ("linear_attn.A_log", "linear_attn.dt_bias")


class HFFormat:
    name = "hf"
    norm_offset = 1.0  # zero-centred norms, applied as (1 + w)

    @classmethod
    def detect(cls, config: ModelConfig, names: Collection[str]) -> bool:
        if config.quantization is not None or (config.quantization_config or {}).get("quant_method"):
            return False
        return any(strip_language_prefix(n) not in (None, "lm_head.weight") for n in names)

    def __init__(self, config: ModelConfig, names: Collection[str] = (), mtp: bool = False):
        self.config, self.mtp = config, mtp

    def weight_factory(self) -> WeightFactory:
        return DenseWeights()

    def map_tensor(self, t: TensorInfo) -> Mapped | SetAside | None:
        m = map_hf_name(t.name, self.config, self.mtp)
        if m is None:
            return None
        if isinstance(m, Aside):
            return SetAside(m.group)
        placements = tuple(Placement(x.param, x.index, x.transform, x.note) for x in m)
        return Mapped(placements, FLOAT_DTYPES)

    def param_dtype(self, param: str, meta: torch.Tensor, default: torch.dtype) -> torch.dtype:
        if param.endswith(FP32_PARAMS) and default.itemsize < 4:
            return torch.float32
        return default

    def source_name(self, param: str) -> str:
        return hf_source_name(param, self.config)

    def finalize(self, model: nn.Module) -> None:
        pass


FORMAT = HFFormat
