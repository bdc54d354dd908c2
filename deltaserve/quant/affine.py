"""MLX affine checkpoints: the `quantization` entry, packed modules and the `AffineWeights` factory.

Packed parameters keep MLX's in-memory layout (see kernels.quant.affine): for a linear [out, in] with (bits, g)
  weight uint32 [out, in*bits/32], scales [out, in/g], biases [out, in/g]   (model dtype, bf16 in releases)
stacked experts add a leading E axis; the embedding is a [V, H] linear. At 4-bit g64 that is 4 + 2*16/64 = 4.5
bits per weight. Matmuls dequantise on the fly, a block of rows at a time.

The `quantization` entry of config.json (mirrored in `quantization_config`):
  {"group_size": 64, "bits": 4, "mode": "affine",
   "language_model.model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}, ...}
Global keys are the default; a key equal to an MLX module path overrides it (a dict, or false = unquantised).
A module without an override is quantised iff its `.scales` tensor exists (as mlx_lm decides); without the
tensor list (config-only), iff its input width is a multiple of the default group size (as mlx_lm quantises).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection

import torch
from torch import nn

from ..kernels.quant import affine_gather_rows, affine_linear, check_affine_spec, packed_width
from . import mlx_names
from .modules import DenseEmbedding, DenseLinear, DenseStacked, StackedExperts, StackedLinear, frozen

GLOBAL_KEYS = ("group_size", "bits", "mode")


class QuantConfigError(ValueError):
    """A quantisation entry or quantised tensor deltaserve cannot use; names the file/field/tensor."""


@dataclass(frozen=True)
class AffineSpec:
    bits: int
    group_size: int

    def bits_per_weight(self, scale_bits: int = 16) -> float:
        """Resident bits per weight: the code plus one scale and one bias per group."""
        return self.bits + 2 * scale_bits / self.group_size

    def as_entry(self) -> dict:
        return {"group_size": self.group_size, "bits": self.bits}


@dataclass
class QuantScheme:
    """A parsed `quantization` entry: the default spec plus overrides keyed by OUR module path (None = dense)."""

    default: AffineSpec
    overrides: dict[str, AffineSpec | None] = field(default_factory=dict)
    mlx_keys: dict[str, str] = field(default_factory=dict)  # our path -> the key as written (for messages)
    # Overrides for modules outside the language model (mlx-vlm's `vision_tower.*`, `mtp.*`): their tensors are set
    # aside, so the overrides are not used; the format checks that each still names a tensor of the checkpoint.
    foreign: list[str] = field(default_factory=list)


def _spec(value: dict, where: str) -> AffineSpec:
    mode = value.get("mode", "affine")
    if mode != "affine":
        raise QuantConfigError(f"{where}: quantisation mode {mode!r} is not supported (deltaserve reads 'affine')")
    for key in ("bits", "group_size"):
        if not isinstance(value.get(key), int) or isinstance(value.get(key), bool):
            raise QuantConfigError(f"{where}: field '{key}' must be an integer, found {value.get(key)!r}")
    try:
        check_affine_spec(value["bits"], value["group_size"], where)
    except ValueError as e:
        raise QuantConfigError(str(e)) from None
    return AffineSpec(value["bits"], value["group_size"])


def parse_quantization(entry: dict, model_type: str, source: str = "config.json") -> QuantScheme:
    """Parse the MLX `quantization` entry; errors name the file and the key."""
    if not isinstance(entry, dict):
        raise QuantConfigError(f"{source}: 'quantization' must be an object, found {type(entry).__name__}")
    scheme = QuantScheme(_spec(entry, f"{source}: quantization"))
    for key, value in entry.items():
        if key in GLOBAL_KEYS:
            continue
        where = f"{source}: quantization[{key!r}]"
        ours = mlx_names.to_ours(key, model_type)
        if value is False:
            spec = None
        elif value is True:
            spec = scheme.default
        elif isinstance(value, dict):
            spec = _spec(value, where)
        else:
            raise QuantConfigError(f"{where}: expected an object or false, found {value!r}")
        if ours is None:
            scheme.foreign.append(key)
        else:
            scheme.overrides[ours], scheme.mlx_keys[ours] = spec, key
    return scheme


# ---- packed modules ------------------------------------------------------------------------------------------


class AffineLinear(nn.Module):
    """Packed linear [out, in]: weight uint32 [out, in*bits/32], scales/biases [out, in/g]."""

    def __init__(self, in_features: int, out_features: int, spec: AffineSpec):
        super().__init__()
        self.in_features, self.out_features, self.spec = in_features, out_features, spec
        self.weight = frozen(out_features, packed_width(in_features, spec.bits), dtype=torch.uint32)
        self.scales = frozen(out_features, in_features // spec.group_size)
        self.biases = frozen(out_features, in_features // spec.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return affine_linear(x, self.weight, self.scales, self.biases, self.spec.bits, self.spec.group_size)


class AffineStacked(StackedLinear):
    """E packed linears: weight uint32 [E, out, in*bits/32], scales/biases [E, out, in/g] (QuantizedSwitchLinear)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, spec: AffineSpec):
        super().__init__()
        self.spec = spec
        self.weight = frozen(num_experts, out_features, packed_width(in_features, spec.bits), dtype=torch.uint32)
        self.scales = frozen(num_experts, out_features, in_features // spec.group_size)
        self.biases = frozen(num_experts, out_features, in_features // spec.group_size)

    def forward_one(self, x: torch.Tensor, e: int) -> torch.Tensor:
        s = self.spec
        return affine_linear(x, self.weight[e], self.scales[e], self.biases[e], s.bits, s.group_size)


class AffineEmbedding(nn.Module):
    """Packed [V, H] table; lookups dequantise only the rows asked for; as_linear is the tied output head."""

    def __init__(self, vocab: int, hidden: int, spec: AffineSpec):
        super().__init__()
        self.spec = spec
        self.weight = frozen(vocab, packed_width(hidden, spec.bits), dtype=torch.uint32)
        self.scales = frozen(vocab, hidden // spec.group_size)
        self.biases = frozen(vocab, hidden // spec.group_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = self.spec
        return affine_gather_rows(self.weight, self.scales, self.biases, ids, s.bits, s.group_size)

    def as_linear(self, x: torch.Tensor) -> torch.Tensor:
        s = self.spec
        return affine_linear(x, self.weight, self.scales, self.biases, s.bits, s.group_size)


# ---- the factory -----------------------------------------------------------------------------------------------


class AffineWeights:
    """WeightFactory for MLX affine checkpoints.

    quant_entry: the raw `quantization` dict (or a parsed QuantScheme); None for an unquantised MLX checkpoint.
    quantized:   which of OUR module paths hold `.scales` in the checkpoint (a collection or a predicate); None
                 means "decide like mlx_lm's quantiser": in_features divisible by the default group size.
    Every module asked for is recorded in `specs` (path -> AffineSpec or None), which `describe` and the format's
    checks read.
    """

    def __init__(
        self,
        quant_entry: dict | QuantScheme | None,
        quantized: Collection[str] | Callable[[str], bool] | None = None,
        model_type: str = "qwen3_5_moe",
        source: str = "config.json",
    ):
        if quant_entry is None or isinstance(quant_entry, QuantScheme):
            self.scheme = quant_entry
        else:
            self.scheme = parse_quantization(quant_entry, model_type, source)
        if quantized is not None and not callable(quantized):
            names = frozenset(quantized)
            quantized = names.__contains__
        self._quantized = quantized
        self.source, self.model_type = source, model_type
        self.specs: dict[str, AffineSpec | None] = {}
        self.shapes: dict[str, int] = {}  # path -> in_features of every module asked for

    def spec_for(self, name: str, in_features: int) -> AffineSpec | None:
        self.shapes[name] = in_features
        if self.scheme is None:
            spec = None
        elif name in self.scheme.overrides:
            spec = self.scheme.overrides[name]
        elif self._quantized is not None:
            spec = self.scheme.default if self._quantized(name) else None
        else:
            spec = self.scheme.default if in_features % self.scheme.default.group_size == 0 else None
        if spec is not None and in_features % spec.group_size:
            raise QuantConfigError(
                f"{self.source}: module {mlx_names.to_mlx(name, self.model_type)!r} has {in_features} input features, "
                f"not a multiple of its group size {spec.group_size}"
            )
        self.specs[name] = spec
        return spec

    def linear(self, name: str, in_features: int, out_features: int) -> nn.Module:
        spec = self.spec_for(name, in_features)
        return DenseLinear(in_features, out_features) if spec is None else AffineLinear(in_features, out_features, spec)

    def _stacked(self, name: str, e: int, in_features: int, out_features: int) -> StackedLinear:
        spec = self.spec_for(name, in_features)
        if spec is None:
            return DenseStacked(e, in_features, out_features)
        return AffineStacked(e, in_features, out_features, spec)

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int) -> nn.Module:
        return StackedExperts.build(self._stacked, name, num_experts, hidden, intermediate)

    def embedding(self, name: str, vocab: int, hidden: int) -> nn.Module:
        spec = self.spec_for(name, hidden)
        return DenseEmbedding(vocab, hidden) if spec is None else AffineEmbedding(vocab, hidden, spec)

    def unused_overrides(self) -> list[str]:
        """Override keys (as written) that name no module the model asked for."""
        if self.scheme is None:
            return []
        return [self.scheme.mlx_keys[p] for p in self.scheme.overrides if p not in self.specs]
