"""Qwen FP8 block checkpoints (Qwen/Qwen3.5-*-FP8, Qwen/Qwen3.6-*-FP8): config entry, modules, factory.

quantization_config: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [128, 128], "modules_to_not_convert": [...]}
A converted linear holds (kernels.quant.fp8 for the decode rule):
  weight            uint8 [out, in]   (the float8_e4m3fn bit patterns, see kernels.quant.fp8 for why uint8)
  weight_scale_inv  fp32  [ceil(out/b0), ceil(in/b1)]   (bf16 in some files; widened exactly on load)
Routed experts, stored per expert in the release, are stacked in memory: weight [E, out, in], weight_scale_inv
[E, ceil(out/b0), ceil(in/b1)], gate/up/down apart (as the files hold them). Unconverted layers stay dense.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import Callable, Collection

import torch
from torch import nn

from ..kernels.quant import fp8_block_linear
from .affine import QuantConfigError
from .modules import DenseEmbedding, DenseLinear, DenseStacked, StackedExperts, StackedLinear, frozen


@dataclass(frozen=True)
class Fp8Spec:
    block: tuple[int, int] = (128, 128)
    not_converted: tuple[str, ...] = ()

    def bits_per_weight(self, scale_bits: int = 32) -> float:
        return 8 + scale_bits / (self.block[0] * self.block[1])


def parse_fp8_config(qc: dict, source: str = "config.json") -> Fp8Spec:
    """Validate an HF fp8 `quantization_config`; errors name the file and field."""
    where = f"{source}: quantization_config"
    if not isinstance(qc, dict):
        raise QuantConfigError(f"{where} must be an object, found {type(qc).__name__}")
    if qc.get("quant_method") != "fp8":
        raise QuantConfigError(f"{where}.quant_method is {qc.get('quant_method')!r}, expected 'fp8'")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantConfigError(f"{where}.fmt is {fmt!r}; deltaserve reads float8 e4m3 weights only")
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise QuantConfigError(f"{where}.weight_block_size must be two positive integers (e.g. [128, 128]), "
                               f"found {block!r}")
    skip = qc.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise QuantConfigError(f"{where}.modules_to_not_convert must be a list of module names, found {skip!r}")
    return Fp8Spec(tuple(block), tuple(skip))


def hf_module_path(name: str) -> str:
    """Our module path -> the published HF module path (what modules_to_not_convert lists); the MTP head and the
    lm_head are top level."""
    return name if name.startswith(("lm_head", "mtp.")) else f"model.language_model.{name}"


def listed(path: str, entries: Collection[str]) -> bool:
    """True when an entry names `path` or a module containing it, matching whole dotted components
    ("mlp.gate" names "...mlp.gate" but not "...mlp.gate_proj")."""
    dotted = f".{path}."
    return any(f".{e.strip('.')}." in dotted for e in entries)


class Fp8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, block: tuple[int, int]):
        super().__init__()
        self.block = block
        self.weight = frozen(out_features, in_features, dtype=torch.uint8)
        self.weight_scale_inv = frozen(ceil(out_features / block[0]), ceil(in_features / block[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_block_linear(x, self.weight, self.weight_scale_inv, self.block)


class Fp8Stacked(StackedLinear):
    def __init__(self, num_experts: int, in_features: int, out_features: int, block: tuple[int, int]):
        super().__init__()
        self.block = block
        self.weight = frozen(num_experts, out_features, in_features, dtype=torch.uint8)
        self.weight_scale_inv = frozen(num_experts, ceil(out_features / block[0]), ceil(in_features / block[1]))

    def forward_one(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return fp8_block_linear(x, self.weight[e], self.weight_scale_inv[e], self.block)


class Fp8BlockWeights:
    """WeightFactory for FP8 block checkpoints.

    converted: which of OUR module paths carry `weight_scale_inv` in the checkpoint (collection or predicate);
    None = everything not named by modules_to_not_convert. `specs` records path -> block (None = dense).
    """

    def __init__(
        self,
        quantization_config: dict | Fp8Spec,
        converted: Collection[str] | Callable[[str], bool] | None = None,
        source: str = "config.json",
    ):
        self.spec = quantization_config if isinstance(quantization_config, Fp8Spec) else parse_fp8_config(
            quantization_config, source)
        if converted is None:
            converted = lambda name: not listed(hf_module_path(name), self.spec.not_converted)  # noqa: E731
        elif not callable(converted):
            converted = frozenset(converted).__contains__
        self._converted = converted
        self.specs: dict[str, tuple[int, int] | None] = {}

    def _block(self, name: str) -> tuple[int, int] | None:
        block = self.spec.block if self._converted(name) else None
        self.specs[name] = block
        return block

    def linear(self, name: str, in_features: int, out_features: int) -> nn.Module:
        block = self._block(name)
        return DenseLinear(in_features, out_features) if block is None else Fp8Linear(in_features, out_features, block)

    def _stacked(self, name: str, e: int, in_features: int, out_features: int) -> StackedLinear:
        block = self._block(name)
        return DenseStacked(e, in_features, out_features) if block is None else Fp8Stacked(e, in_features,
                                                                                          out_features, block)

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int) -> nn.Module:
        return StackedExperts.build(self._stacked, name, num_experts, hidden, intermediate)

    def embedding(self, name: str, vocab: int, hidden: int) -> nn.Module:
        # The releases keep the embedding in bf16 (a lookup gains nothing from FP8); a checkpoint that converts it
        # is refused by the format with the tensor's name rather than half-supported here.
        self.specs[name] = None
        return DenseEmbedding(vocab, hidden)
