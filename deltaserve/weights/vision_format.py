"""The vision tower's tensors in every checkpoint format we read, mapped onto `model.vision.VisionTower`.

Spellings (spec 2.4, 4.1, 4.3):
- HF bf16/fp32 and the official FP8 releases: `model.visual.<ours>`; the patch embedding a Conv3d weight
  [D, C, T, P, P]. An FP8 checkpoint keeps the tower in bf16 (333 tensors, no block scales, in the releases); a
  linear that does carry `weight_scale_inv` is loaded as an FP8 block linear.
- MLX (mlx-vlm conversions): `vision_tower.<ours>`, the patch embedding channels-last [D, T, P, P, C]; mlx-vlm never
  quantises the tower (skip_multimodal_module), but a linear with `.scales`/`.biases` is loaded as an affine packed
  linear with the config's bits/group size (a per-module override keyed by its MLX path wins).
Every vision tensor is used exactly once (the same plan checks as the text model: weights.plan.build_plan).
"""

from __future__ import annotations

from typing import Collection

import torch
from torch import nn

from ..model.config import ModelConfig, VisionConfig
from ..model.vision.encoder import VisionLinear
from ..quant import AffineLinear, Fp8Linear, QuantConfigError
from ..quant.affine import _spec as _affine_entry_spec
from ..quant.affine import parse_quantization
from ..quant.fp8 import parse_fp8_config
from .formats import FLOAT_DTYPES, CheckpointError, Mapped, Placement, TensorInfo

PREFIXES = ("model.visual.", "vision_tower.")
PATCH = "patch_embed.proj.weight"


def vision_tensor_prefix(names: Collection[str]) -> str | None:
    """The prefix this checkpoint's vision tensors carry, or None when it has no vision tower."""
    for prefix in PREFIXES:
        if any(n.startswith(prefix) for n in names):
            return prefix
    return None


class VisionFormat:
    def __init__(self, config: ModelConfig, vision: VisionConfig, names: Collection[str], source: str):
        self.vision, self.names = vision, set(names)
        self.prefix = vision_tensor_prefix(self.names)
        if self.prefix is None:
            raise CheckpointError(f"{source}: no vision tower tensors (model.visual.* / vision_tower.*): a text-only "
                                  "conversion; load it without vision")
        self.name = "mlx" if self.prefix == "vision_tower." else "hf"
        self.affine = self.fp8 = None
        try:
            if config.quantization is not None:
                self.affine = parse_quantization(config.quantization, config.model_type)
            elif (config.quantization_config or {}).get("quant_method") == "fp8":
                self.fp8 = parse_fp8_config(config.quantization_config)
        except QuantConfigError as e:
            raise CheckpointError(str(e)) from None
        self.quant_entry = config.quantization or {}
        self.packed: dict[str, str] = {}  # our module -> "affine" | "fp8"

    # ---- the modules ------------------------------------------------------------------------------------------
    def linear_factory(self, name: str, in_features: int, out_features: int) -> nn.Module:
        key = self.prefix + name
        if f"{key}.scales" in self.names:
            spec = self._affine_spec(key)
            self.packed[name] = "affine"
            return AffineLinear(in_features, out_features, spec)
        if f"{key}.weight_scale_inv" in self.names:
            if self.fp8 is None:
                raise CheckpointError(f"tensor '{key}.weight_scale_inv': FP8 block scales but config.json has no "
                                      "fp8 quantization_config")
            self.packed[name] = "fp8"
            return Fp8Linear(in_features, out_features, self.fp8.block)
        return VisionLinear(in_features, out_features)

    def _affine_spec(self, key: str):
        """The bits / group size of packed vision module `key`: its override in `quantization`, else the default."""
        if self.affine is None:
            raise CheckpointError(f"tensor '{key}.scales': quantised vision tensors but config.json has no "
                                  "'quantization' entry (bits and group size unknown)")
        override = self.quant_entry.get(key)
        if isinstance(override, dict):
            return _affine_entry_spec(override, f"config.json: quantization[{key!r}]")
        if override is False:
            raise CheckpointError(f"config.json: quantization[{key!r}] says unquantised but the checkpoint has "
                                  f"'{key}.scales'")
        return self.affine.default

    # ---- the tensors ------------------------------------------------------------------------------------------
    def map_tensor(self, t: TensorInfo) -> Mapped | None:
        if not t.name.startswith(self.prefix):
            return None
        ours = t.name[len(self.prefix):]
        if ours == PATCH:
            return self._patch_embed(t)
        module, _, leaf = ours.rpartition(".")
        kind = self.packed.get(module)
        if kind == "affine" and leaf == "weight":
            return Mapped((Placement(ours),), frozenset({"U32"}))
        if kind == "fp8" and leaf == "weight":
            return Mapped((Placement(ours, transform=_fp8_bits, note="float8 weight held as uint8 bits"),),
                          frozenset({"F8_E4M3"}))
        return Mapped((Placement(ours),), FLOAT_DTYPES)

    def _patch_embed(self, t: TensorInfo) -> Mapped:
        v = self.vision
        D, C, T, P = v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size
        if t.shape == (D, C, T, P, P):
            return Mapped((Placement(PATCH, transform=lambda w: w.reshape(w.shape[0], -1),
                                     note="Conv3d [D, C, T, P, P] flattened to [D, C*T*P*P]"),))
        if t.shape == (D, T, P, P, C):
            return Mapped((Placement(PATCH, transform=lambda w: w.permute(0, 4, 1, 2, 3).reshape(w.shape[0], -1),
                                     note="MLX channels-last Conv3d [D, T, P, P, C] to [D, C*T*P*P]"),))
        return Mapped((Placement(PATCH, transform=_bad_patch(t.shape, (D, C, T, P, P)),
                                 note=f"the Conv3d weight [D, C, T, P, P] = {[D, C, T, P, P]} (or MLX [D, T, P, P, C])"),))

    def param_dtype(self, param: str, meta: torch.Tensor, default: torch.dtype) -> torch.dtype:
        if not meta.dtype.is_floating_point:
            return meta.dtype  # packed codes
        if param.endswith("weight_scale_inv"):
            return torch.float32
        return default

    def source_name(self, param: str) -> str:
        return self.prefix + param

    def finalize(self, model: nn.Module) -> None:
        pass


def _bad_patch(found, want):
    def transform(w):
        raise ValueError(f"patch embedding of shape {list(found)}, expected {list(want)}")

    return transform


def _fp8_bits(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.uint8)


def checkpoint_has_vision(path) -> bool:
    """Does the checkpoint directory hold vision tower tensors (headers only)?"""
    from .safetensors_io import SafetensorsCheckpoint

    return vision_tensor_prefix(SafetensorsCheckpoint(path).names) is not None
