"""Where the exporter's tensor values come from: a loaded checkpoint, or random values of the right kind.

A source turns one planned GGUF tensor into the array written to the file (float32/float16 values or the packed
blocks of a quantised type), one tensor at a time, so only one tensor is ever converted in memory.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from . import blocks
from .layout import CONV, NORM, ROUTER, VECTOR, ExportError, GGUFTensor


class CheckpointSource:
    """Values from our model's parameters (published names minus `model.language_model.`), converted per tensor."""

    def __init__(self, params: dict[str, torch.Tensor], origin: str):
        self.params, self.origin = params, origin

    def check(self, plan: list[GGUFTensor]) -> None:
        """Every parameter goes into the file, and every planned tensor has its parameter."""
        used = {t.source for t in plan}
        missing = sorted(used - self.params.keys())
        unused = sorted(self.params.keys() - used)
        if missing or unused:
            raise ExportError(
                f"{self.origin}: the checkpoint does not match the GGUF plan: parameters missing {missing[:6]}, "
                f"parameters with no GGUF tensor {unused[:6]}"
            )

    def data(self, t: GGUFTensor, qtype: T) -> np.ndarray:
        with torch.no_grad():
            value = self.params[t.source].detach().to("cpu", torch.float32)
            if t.convert is not None:
                value = t.convert(value)
        if tuple(value.shape) != t.shape:
            raise ExportError(f"{self.origin}: {t.source} -> {t.name}: expected shape {list(t.shape)}, found "
                              f"{list(value.shape)}")
        try:
            return blocks.encode(value.contiguous().numpy(), qtype)
        except ValueError as e:
            raise ExportError(f"{self.origin}: {t.source} -> {t.name} ({qtype.name}): {e}") from None


class RandomSource:
    """Random values in the model's ranges, deterministic per (seed, tensor name).

    Matrices: random codes with one finite fp16 scale per tensor (weights of std 1/sqrt(fan_in), embedding rows of
    std 1); norms near 1 (the +1 already baked in, as in a real export); ssm_a = -exp(A_log) in [-16, -1];
    ssm_dt.bias 1; conv kernels N(0, 0.5); routers and the shared-expert gate N(0, 1/sqrt(H)).
    """

    def __init__(self, seed: int = 0):
        self.seed = seed

    def check(self, plan: list[GGUFTensor]) -> None:
        pass

    def data(self, t: GGUFTensor, qtype: T) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(t.name.encode())])
        if t.role in (NORM, VECTOR, ROUTER, CONV):
            return self._f32(t, rng)
        return blocks.random_blocks(qtype, t.shape, t.std, rng)

    @staticmethod
    def _f32(t: GGUFTensor, rng: np.random.Generator) -> np.ndarray:
        if t.name.endswith("ssm_norm.weight") or t.name.endswith("ssm_dt.bias"):
            out = np.ones(t.shape, np.float32)
        elif t.role == NORM:
            out = 1.0 + 0.05 * rng.standard_normal(t.shape, np.float32)
        elif t.name.endswith("ssm_a"):
            out = -rng.uniform(1.0, 16.0, t.shape).astype(np.float32)
        elif t.role == CONV:
            out = 0.5 * rng.standard_normal(t.shape, np.float32)
        else:
            out = t.std * rng.standard_normal(t.shape, np.float32)
        return out
