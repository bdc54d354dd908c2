"""MLX checkpoints (mlx-lm / mlx-vlm conversions, e.g. mlx-community/Qwen3.6-35B-A3B-4bit), quantised or not.

What differs from the HF layout (spec 4.1), and what this format does about it:
- names: `language_model.model.*` / `language_model.lm_head` (flat `model.*` / `lm_head` for qwen3_next), routed
  experts as stacked `mlp.switch_mlp.{gate,up,down}_proj` [E, out, in]  -> quant.mlx_names maps them to ours;
- quantised modules hold `weight` (uint32, packed), `scales`, `biases`  -> AffineWeights modules, loaded packed
  (never dequantised: the file bytes become the parameters);
- conv1d stored channels-last [C, K, 1]  -> transposed to our [C, 1, K] (a small tensor);
- zero-centred norms stored with +1 baked in  -> the model is built with norm_offset 0 (linear_attn.norm, which
  was never zero-centred, is unchanged in both layouts);
- qwen3_next keeps the group-interleaved fused `in_proj_qkvz` / `in_proj_ba`; packing is per row, so the packed
  rows (and their scales/biases rows) are regrouped exactly like the dense ones (names._group_rows).
The MTP head, `mtp.*` with the body's conventions (switch_mlp experts, +1 norms; what `deltaserve quantize`
writes), is mapped when the model is built with it, else set aside like the head of other layouts (`.mtp.` inside
a name). `vision_tower.*` (mlx-vlm) is set aside; `language_model.lm_head` is set aside when tied.
"""

from __future__ import annotations

import re
from typing import Collection

import torch
from torch import nn

from ..model.config import ModelConfig
from ..quant import AffineWeights, QuantConfigError, mlx_names
from ..quant.affine import parse_quantization
from .formats import FLOAT_DTYPES, CheckpointError, Mapped, Placement, SetAside, TensorInfo
from .hf_format import FP32_PARAMS
from .names import _split_fused_gdn

PACKED_DTYPES = frozenset({"U32"})
QUANT_SUFFIXES = (".weight", ".scales", ".biases")
_FUSED_GDN = re.compile(r"^(layers\.\d+\.linear_attn)\.in_proj_(qkvz|ba)$")
_FUSED_PARTS = {"qkvz": ("in_proj_qkv", "in_proj_z"), "ba": ("in_proj_b", "in_proj_a")}


def _split_module(path: str) -> list[str]:
    """Our module(s) a file module feeds: qwen3_next's fused in_proj_qkvz / in_proj_ba feed two of ours."""
    m = _FUSED_GDN.match(path)
    if m:
        return [f"{m.group(1)}.{part}" for part in _FUSED_PARTS[m.group(2)]]
    return [path]


class MLXFormat:
    name = "mlx"
    norm_offset = 0.0  # +1 already baked into the zero-centred norms

    @classmethod
    def detect(cls, config: ModelConfig, names: Collection[str]) -> bool:
        if config.quantization is not None:
            return True
        return any(n.startswith("language_model.model.") or ".switch_mlp." in n or n.endswith(".scales") for n in names)

    def __init__(self, config: ModelConfig, names: Collection[str] = (), mtp: bool = False):
        self.config, self.model_type, self.mtp = config, config.model_type, mtp
        names = set(names)
        try:
            scheme = parse_quantization(config.quantization, self.model_type) if config.quantization else None
        except QuantConfigError as e:
            raise CheckpointError(str(e)) from None
        quantized = set()
        for n in names:
            if n.endswith(".scales"):
                ours = mlx_names.to_ours(n[: -len(".scales")], self.model_type)
                if ours is not None:
                    quantized.update(_split_module(ours))
        if quantized and scheme is None:
            example = next(n for n in sorted(names) if n.endswith(".scales"))
            raise CheckpointError(
                f"tensor '{example}': quantised tensors but config.json has no 'quantization' entry "
                "(bits and group size unknown)"
            )
        if scheme is not None:
            self._check_overrides(scheme, names)
            for path in list(scheme.overrides):  # a fused file module's override applies to both of our halves
                for part in _split_module(path):
                    scheme.overrides.setdefault(part, scheme.overrides[path])
                    scheme.mlx_keys.setdefault(part, scheme.mlx_keys[path])
        self.factory = AffineWeights(scheme, quantized, self.model_type)

    def _check_overrides(self, scheme, names: set[str]) -> None:
        for key in scheme.foreign:  # e.g. vision_tower.* of an mlx-vlm conversion: set aside, but must exist
            if f"{key}.weight" not in names:
                raise CheckpointError(
                    f"config.json: quantization[{key!r}] is a per-layer override naming no tensor "
                    f"(no '{key}.weight' in the checkpoint, and it is not a language-model module)"
                )
        for path, spec in scheme.overrides.items():
            key = scheme.mlx_keys[path]
            if f"{key}.weight" not in names:
                raise CheckpointError(
                    f"config.json: quantization[{key!r}] is a per-layer override naming no tensor "
                    f"(no '{key}.weight' in the checkpoint)"
                )
            has_scales = f"{key}.scales" in names
            if (spec is None) == has_scales:
                state = "unquantised" if spec is None else f"{spec.bits}-bit"
                raise CheckpointError(
                    f"config.json: quantization[{key!r}] says {state} but the checkpoint "
                    f"{'has' if has_scales else 'has no'} '{key}.scales'"
                )

    def weight_factory(self) -> AffineWeights:
        return self.factory

    # ---- tensors ---------------------------------------------------------------------------------------------
    def map_tensor(self, t: TensorInfo) -> Mapped | SetAside | None:
        if t.name.startswith(("vision_tower.", "model.visual.")):
            return SetAside("visual")
        if (t.name.startswith("mtp.") and not self.mtp) or ".mtp." in t.name:
            return SetAside("mtp")
        ours = mlx_names.to_ours(t.name, self.model_type)
        if ours is None:
            return None
        if ours.startswith("lm_head.") and self.config.tie_word_embeddings:
            return SetAside("tied_lm_head")
        module, _, leaf = ours.rpartition(".")
        if module in self.factory.specs or _FUSED_GDN.match(module):
            return self._map_module_tensor(t, module, leaf)
        if ours.endswith("conv1d.weight"):
            return Mapped((Placement(ours, transform=_conv_channels_first, note="MLX conv1d [C, K, 1] -> [C, 1, K]"),))
        return Mapped((Placement(ours),), FLOAT_DTYPES)

    def _map_module_tensor(self, t: TensorInfo, module: str, leaf: str) -> Mapped | None:
        """weight/scales/biases of a linear, stacked-expert or embedding module (possibly qwen3_next-fused)."""
        if leaf not in ("weight", "scales", "biases"):
            return None
        m = _FUSED_GDN.match(module)
        parts = _split_module(module)
        spec = self.factory.specs.get(parts[0])
        if spec is None and leaf != "weight":
            return None  # scales/biases of a module the config says is unquantised: refused as unknown
        if spec is not None:
            self._check_packed_shape(t, parts, leaf, spec)
        dtypes = PACKED_DTYPES if (spec is not None and leaf == "weight") else FLOAT_DTYPES
        if m is None:
            return Mapped((Placement(f"{module}.{leaf}"),), dtypes)
        targets = _split_fused_gdn(m.group(1), m.group(2), self.config)  # row regrouping, works on packed rows
        return Mapped(
            tuple(Placement(x.param.rsplit(".", 1)[0] + "." + leaf, (), x.transform, x.note) for x in targets), dtypes
        )

    def _check_packed_shape(self, t: TensorInfo, parts: list[str], leaf: str, spec) -> None:
        in_features = self.factory.shapes[parts[0]]
        want = in_features * spec.bits // 32 if leaf == "weight" else in_features // spec.group_size
        if not t.shape or t.shape[-1] != want:
            hint = ""
            if leaf == "weight" and t.shape and (t.shape[-1] * 32) % in_features == 0:
                hint = f"; its width implies {t.shape[-1] * 32 // in_features}-bit codes"
            raise CheckpointError(
                f"{t.file}: tensor '{t.name}' has shape {list(t.shape)}, but config.json's quantization "
                f"({spec.bits}-bit, group {spec.group_size}) for {in_features} input features expects last dim "
                f"{want} ({leaf} shape mismatch{hint})"
            )

    def param_dtype(self, param: str, meta: torch.Tensor, default: torch.dtype) -> torch.dtype:
        if not meta.dtype.is_floating_point:
            return meta.dtype  # packed codes stay uint32
        if param.endswith(FP32_PARAMS) and default.itemsize < 4:
            return torch.float32
        return default

    def source_name(self, param: str) -> str:
        return mlx_names.to_mlx(param, self.model_type)

    def finalize(self, model: nn.Module) -> None:
        pass


def _conv_channels_first(w: torch.Tensor) -> torch.Tensor:
    return w.transpose(1, 2)


FORMAT = MLXFormat
