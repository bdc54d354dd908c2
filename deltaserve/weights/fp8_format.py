"""Qwen FP8 block checkpoints (Qwen/Qwen3.5-*-FP8, Qwen/Qwen3.6-*-FP8; spec 4.3).

HF names and layout (zero-centred norms, conv [C, 1, K]) with, for each converted linear `X`:
  X.weight            float8_e4m3fn [out, in]   -> our X.weight as uint8 bit patterns (a free view, see quant.fp8)
  X.weight_scale_inv  [ceil(out/128), ceil(in/128)]  -> our X.weight_scale_inv (fp32)
Routed experts are stored per expert (`mlp.experts.{e}.{gate,up,down}_proj.*`) and stacked into our
`mlp.experts.{gate,up,down}_proj.*` [E, ...] slice by slice. Unconverted layers (in_proj_a/b, routers,
shared_expert_gate, embeddings, lm_head in the releases) are plain bf16 and load as dense modules.
A module is converted iff its `weight_scale_inv` is in the checkpoint; a float8 weight without one is an error.
The MTP head (`mtp.*`, kept by the releases with per-expert FP8 experts) follows the same rules under its own
top-level names when the model is built with it.
"""

from __future__ import annotations

import re
from typing import Collection

import torch
from torch import nn

from ..model.config import ModelConfig
from ..quant import Fp8BlockWeights, QuantConfigError
from ..quant.fp8 import parse_fp8_config
from .formats import FLOAT_DTYPES, CheckpointError, Mapped, Placement, SetAside, TensorInfo
from .hf_format import FP32_PARAMS
from .names import Aside, hf_source_name, map_hf_name, strip_language_prefix

FP8_DTYPES = frozenset({"F8_E4M3"})
_EXPERT = re.compile(
    r"^((?:mtp\.)?layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale_inv)$")
_FUSED_EXPERTS = re.compile(r"^((?:mtp\.)?layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def _module_of(ours: str) -> str:
    """Our module path for a file tensor (already prefix-stripped): per-expert names collapse to the stacked one."""
    m = _EXPERT.match(ours)
    if m:
        return f"{m.group(1)}.{m.group(3)}"
    return ours.rsplit(".", 1)[0]


class Fp8Format:
    name = "fp8"
    norm_offset = 1.0  # HF zero-centred norms

    @classmethod
    def detect(cls, config: ModelConfig, names: Collection[str]) -> bool:
        qc = config.quantization_config or {}
        return config.quantization is None and qc.get("quant_method") == "fp8"

    def __init__(self, config: ModelConfig, names: Collection[str] = (), mtp: bool = False):
        self.config, self.mtp = config, mtp
        self.names = set(names)
        try:
            spec = parse_fp8_config(config.quantization_config)
        except QuantConfigError as e:
            raise CheckpointError(str(e)) from None
        converted = set()
        for n in self.names:
            if n.endswith(".weight_scale_inv"):
                ours = strip_language_prefix(n, mtp)
                if ours is not None:
                    converted.add(_module_of(ours))
        for module in sorted(converted):
            if module == "embed_tokens" or module.endswith(("in_proj_qkvz", "in_proj_ba", "gate_up_proj")):
                # An FP8 lookup table, or 128-row scale blocks spanning the group-interleaved / fused rows we
                # regroup: not in any release, refused by name rather than half-supported.
                raise CheckpointError(
                    f"tensor '{module}.weight_scale_inv': FP8 blocks for '{module}' are not supported (the Qwen "
                    "FP8 releases keep embeddings in bf16 and store experts per expert)"
                )
        self.factory = Fp8BlockWeights(spec, converted)

    def weight_factory(self) -> Fp8BlockWeights:
        return self.factory

    def map_tensor(self, t: TensorInfo) -> Mapped | SetAside | None:
        ours = strip_language_prefix(t.name, self.mtp)
        if ours is not None:
            if ours == "lm_head.weight" and self.config.tie_word_embeddings:
                return SetAside("tied_lm_head")
            m = _EXPERT.match(ours)
            if m:
                return self._expert(t, m)
            m = _FUSED_EXPERTS.match(ours)
            if m:
                return self._fused_experts(t, m)
            module = _module_of(ours)
            if module in self.factory.specs and ours.endswith((".weight", ".weight_scale_inv")):
                return self._linear(t, module, ours)
        return self._hf(t)

    def _hf(self, t: TensorInfo) -> Mapped | SetAside | None:
        if t.dtype in FP8_DTYPES:
            self._missing_scale(t)
        m = map_hf_name(t.name, self.config, self.mtp)
        if m is None:
            return None
        if isinstance(m, Aside):
            return SetAside(m.group)
        return Mapped(tuple(Placement(x.param, x.index, x.transform, x.note) for x in m), FLOAT_DTYPES)

    def _missing_scale(self, t: TensorInfo) -> None:
        if t.dtype in FP8_DTYPES and t.name.endswith(".weight") and f"{t.name}_scale_inv" not in self.names:
            raise CheckpointError(
                f"{t.file}: tensor '{t.name}' is float8_e4m3fn but its block scales '{t.name}_scale_inv' are not in "
                "the checkpoint"
            )

    def _linear(self, t: TensorInfo, module: str, ours: str) -> Mapped:
        block = self.factory.specs[module]
        if block is None:
            self._missing_scale(t)
            return Mapped((Placement(ours),), FLOAT_DTYPES)
        if ours.endswith(".weight_scale_inv"):
            return Mapped((Placement(ours),), FLOAT_DTYPES)
        self._missing_scale(t)
        return Mapped((Placement(ours, transform=_fp8_bits, note="float8 weight held as uint8 bits"),), FP8_DTYPES)

    def _expert(self, t: TensorInfo, m: re.Match) -> Mapped:
        stacked, e, proj, leaf = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        param = f"{stacked}.{proj}.{leaf}"
        note = f"expert {e} of the stacked {proj}"
        if self.factory.specs.get(f"{stacked}.{proj}") is None or leaf == "weight_scale_inv":
            if t.dtype in FP8_DTYPES:
                self._missing_scale(t)
            return Mapped((Placement(param, (e,), note=note),), FLOAT_DTYPES)
        self._missing_scale(t)
        return Mapped((Placement(param, (e,), _fp8_bits, note + " (float8 as uint8 bits)"),), FP8_DTYPES)

    def _fused_experts(self, t: TensorInfo, m: re.Match) -> Mapped:
        """Unconverted experts stored fused ([E, 2I, H] gate rows first; [E, H, I]) -> our stacked dense ones."""
        stacked, kind = m.group(1), m.group(2)
        if kind == "down_proj":
            return Mapped((Placement(f"{stacked}.down_proj.weight"),), FLOAT_DTYPES)
        inter = self.config.moe_intermediate_size
        return Mapped(
            (
                Placement(f"{stacked}.gate_proj.weight", transform=lambda w: w[:, :inter], note="gate rows of gate_up"),
                Placement(f"{stacked}.up_proj.weight", transform=lambda w: w[:, inter:], note="up rows of gate_up"),
            ),
            FLOAT_DTYPES,
        )

    def param_dtype(self, param: str, meta: torch.Tensor, default: torch.dtype) -> torch.dtype:
        if not meta.dtype.is_floating_point:
            return meta.dtype  # uint8 FP8 bits
        if param.endswith("weight_scale_inv"):
            return torch.float32  # bf16/fp32 in files; fp32 holds either exactly
        if param.endswith(FP32_PARAMS) and default.itemsize < 4:
            return torch.float32
        return default

    def source_name(self, param: str) -> str:
        m = re.match(r"^((mtp\.)?layers\.\d+\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale_inv)$",
                     param)
        if m:
            prefix = "" if m.group(2) else "model.language_model."
            return f"{prefix}{m.group(1)}.{{e}}.{m.group(3)}.{m.group(4)}"
        return hf_source_name(param, self.config)

    def finalize(self, model: nn.Module) -> None:
        pass


def _fp8_bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.uint8)


FORMAT = Fp8Format
