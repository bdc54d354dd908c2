"""Deterministic random values for synthetic tensors.

Every value comes from a torch.Generator seeded by sha256(seed, key), where key names the tensor (or the logical
tensor a fused one is cut from). So a tensor's bytes depend only on (seed, key, shape, init), never on the order
in which tensors are generated or on which shard they land in.

Scales keep a deep random model numerically healthy (activations finite, O(1), token- and position-dependent):
linear weights N(0, 1/fan_in); zero-centred RMSNorm weights N(0, 0.1^2) (applied as 1 + w); the GDN gated norm
1 + N(0, 0.1^2) (applied as w); A_log = log(U(1, 16)); dt_bias = 1 + N(0, 0.1^2); embeddings N(0, 1/H); routers
N(0, 4/H) so that router logits are spread (std ~2) and different tokens pick different experts.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from typing import Callable

import torch

NORM_STD = 0.1  # zero-centred norm weights
ROUTER_GAIN = 2.0  # router weight std = ROUTER_GAIN / sqrt(H)
BIAS_STD = 0.02  # vision biases
A_LOG_RANGE = (1.0, 16.0)  # A = exp(A_log) ~ U(1, 16)


def key_seed(seed: int, key: str) -> int:
    """63-bit generator seed for (seed, key); independent of any other key."""
    digest = hashlib.sha256(f"deltaserve-synthetic/{seed}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Rng:
    """Random fp32 tensors keyed by name; `memo` keeps the most recent results of blocks that are cut into
    several stored tensors (the [2I, H] gate+up block of one expert in the per-expert layout)."""

    def __init__(self, seed: int, memo_size: int = 2):
        self.seed = seed
        self._memo: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._memo_size = memo_size

    def generator(self, key: str) -> torch.Generator:
        return torch.Generator().manual_seed(key_seed(self.seed, key))

    def normal(self, key: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        t = torch.randn(shape, generator=self.generator(key), dtype=torch.float32)
        t.mul_(std)
        if mean:
            t.add_(mean)
        return t

    def uniform(self, key: str, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        t = torch.rand(shape, generator=self.generator(key), dtype=torch.float32)
        return t.mul_(high - low).add_(low)

    def memo(self, key: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        value = make()
        self._memo[key] = value
        while len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return value

    # ---- the initialisers used by the layouts ----------------------------------------------------------------
    def linear(self, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Weight [out, in] with fan-in scaling."""
        return self.normal(key, shape, 1.0 / math.sqrt(shape[-1]))

    def expert(self, key: str, e: int, shape: tuple[int, int]) -> torch.Tensor:
        """Expert e [out, in] of the bank `key`, from its own generator: one expert can be made without the bank
        (per-expert layout) and equals the bank's slice e (fused layout). The last few are memoised because the
        per-expert layout cuts gate and up from one [2I, H] block."""
        sub = f"{key}/{e}"
        return self.memo(sub, lambda: self.linear(sub, shape))

    def expert_bank(self, key: str, shape: tuple[int, int, int]) -> torch.Tensor:
        """Stacked expert weights [E, out, in] (fused layout), expert by expert."""
        out = torch.empty(shape, dtype=torch.float32)
        for e in range(shape[0]):
            out[e] = self.linear(f"{key}/{e}", shape[1:])
        return out

    def zero_centred_norm(self, key: str, n: int) -> torch.Tensor:
        return self.normal(key, (n,), NORM_STD)

    def unit_norm(self, key: str, n: int) -> torch.Tensor:
        """Norms applied as w (GDN gated norm, vision LayerNorm weights): around 1."""
        return self.normal(key, (n,), NORM_STD, mean=1.0)

    def bias(self, key: str, n: int) -> torch.Tensor:
        return self.normal(key, (n,), BIAS_STD)

    def embedding(self, key: str, shape: tuple[int, int]) -> torch.Tensor:
        return self.normal(key, shape, 1.0 / math.sqrt(shape[1]))

    def router(self, key: str, shape: tuple[int, int]) -> torch.Tensor:
        return self.normal(key, shape, ROUTER_GAIN / math.sqrt(shape[1]))

    def conv(self, key: str, shape: tuple[int, int, int]) -> torch.Tensor:
        """Depthwise conv1d [C, 1, K]: fan-in K."""
        return self.normal(key, shape, 1.0 / math.sqrt(shape[-1]))

    def a_log(self, key: str, n: int) -> torch.Tensor:
        return self.uniform(key, (n,), *A_LOG_RANGE).log_()

    def dt_bias(self, key: str, n: int) -> torch.Tensor:
        return self.normal(key, (n,), NORM_STD, mean=1.0)
