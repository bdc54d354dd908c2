"""Token sampling as a pure function of (logits, seed, position): reference path.

Why pure: a request's tokens must not depend on which other requests share the batch, on the batch order, or on the
device. So there is no global RNG: the noise for row b, vocabulary entry v is a counter-based hash of
(seed_b, position_b, v), and every step below is row-local.

Pipeline per row (vLLM/HF semantics):
  0. structured output: tokens a row's grammar forbids are set to -inf first (`apply_allowed_mask`; rows without a
     grammar carry an all-ones mask), so the token is the same pure function of the masked logits;
  1. penalties on the raw logits: repetition (prompt + output tokens: positive logits / p, negative * p),
     presence and frequency (output tokens only: l -= presence * [count > 0] + frequency * count);
  2. greedy rows (temperature 0): argmax of the penalised logits, ties to the lower id;
  3. sampled rows: logits / temperature, then top_k (exactly k tokens, ties to the lower id), top_p (the smallest
     prefix of the probability-sorted vocabulary whose mass reaches top_p), min_p (keep p >= min_p * p_max);
  4. Gumbel-max: argmax(logits + G) with G = -log(-log(u)), u from the hash; this samples softmax(logits) exactly.

The hash works on int64 tensors holding 32-bit values; multipliers are < 2^31, so a product of a 32-bit value and a
multiplier stays below 2^63 and never overflows. A Triton version computes the same bits with uint32 arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
# Two-round 32-bit mixer (shift 16, mul, shift 15, mul, shift 15); both multipliers are odd and < 2^31.
_MUL1 = 0x21F0AAAD
_MUL2 = 0x735A2D97
_TOKEN_MUL = 0x61C88647  # odd, < 2^31 (2^32 minus the golden-ratio constant): spreads consecutive token ids
_SEED_SALT = 0x1B873593


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Bijective avalanche mix of int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & MASK32
    return x ^ (x >> 15)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per-row 32-bit key from a 64-bit seed (int64 tensor, two's complement allowed) and a position, [B] int64."""
    lo = seeds & MASK32
    hi = (seeds >> 32) & MASK32
    h = mix32(lo ^ _SEED_SALT)
    h = mix32(h ^ hi)
    return mix32(h ^ (positions & MASK32))


def row_keys_host(seeds: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """row_keys on the host (numpy, no device work): int64 [B], for seeds in [0, 2^64) and positions >= 0."""
    s = np.array([int(x) % (1 << 64) for x in seeds], dtype=np.uint64)
    p = np.array(positions, dtype=np.uint64) & np.uint64(MASK32)

    def mix(x):
        x = x ^ (x >> np.uint64(16))
        x = (x * np.uint64(_MUL1)) & np.uint64(MASK32)
        x = x ^ (x >> np.uint64(15))
        x = (x * np.uint64(_MUL2)) & np.uint64(MASK32)
        return x ^ (x >> np.uint64(15))

    h = mix((s & np.uint64(MASK32)) ^ np.uint64(_SEED_SALT))
    h = mix(h ^ (s >> np.uint64(32)))
    return mix(h ^ p).astype(np.int64)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """u[b, v] in (0, 1), float32, a function of (seeds[b], positions[b], v) only.

    u = (top 24 bits of the hash + 0.5) / 2^24 is exactly representable in fp32, so every device starts from the
    same bits."""
    return noise_of_keys(row_keys(seeds.to(torch.int64), positions.to(torch.int64)), vocab)


def noise_of_keys(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """uniform_noise from the rows' keys (row_keys of their seeds and positions), [B, V] float32."""
    tok = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    tok = (tok * _TOKEN_MUL) & MASK32  # [V]
    h = mix32(mix32(keys[:, None] ^ tok[None, :]))  # [B, V]
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def seed_to_int64(seed: int) -> int:
    """A Python seed in [0, 2^64) as the int64 with the same bits (for tensors)."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be in [0, 2^64), found {seed}")
    return seed - (1 << 64) if seed >= 1 << 63 else seed


@dataclass
class SamplingTensors:
    """Per-row sampling parameters, all [B] on the logits' device (built by the engine's runner).

    temperature 0 means greedy; top_k <= 0 means off; top_p 1 and min_p 0 mean off; penalties 1/0/0 mean off.
    seen [B, V] bool marks prompt+output tokens (repetition penalty); counts [B, V] float32 counts output tokens
    (presence/frequency). Either may be None when no row uses the matching penalty."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    repetition_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    seeds: torch.Tensor  # int64 (64-bit seeds stored with their bits)
    positions: torch.Tensor  # int64: index of the token being sampled in its sequence
    seen: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    # structured output: [B, ceil(V / 32)] int32, bit v % 32 of word v // 32 set = token v allowed (xgrammar's packed
    # layout; a row of -1 allows everything), or [B, V] bool. None when no row of the batch is constrained.
    allowed: torch.Tensor | None = None


def apply_allowed_mask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] with every token that `mask` forbids set to -inf (a new tensor; row b reads only mask[b]).

    mask: [B, V] bool (True = allowed), or the packed form [B, ceil(V / 32)] int32 where token v is allowed when bit
    v % 32 (least significant first) of word v // 32 is set; bits past V are ignored."""
    b, vocab = logits.shape
    if mask.dtype != torch.bool:
        if mask.dtype != torch.int32 or mask.shape != (b, -(-vocab // 32)):
            raise ValueError(f"allowed-token mask must be [B, V] bool or [B, ceil(V/32)] int32 for logits {b}x{vocab}, "
                             f"found {tuple(mask.shape)} {mask.dtype}")
        shifts = torch.arange(32, dtype=torch.int32, device=mask.device)
        mask = ((mask.unsqueeze(-1) >> shifts) & 1).view(b, -1)[:, :vocab].bool()  # [B, V]
    elif mask.shape != logits.shape:
        raise ValueError(f"allowed-token mask {tuple(mask.shape)} does not match logits {tuple(logits.shape)}")
    return logits.masked_fill(~mask.to(logits.device), float("-inf"))


def token_statistics(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], vocab: int, device="cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(seen [B, V] bool over prompt+output, counts [B, V] float32 over output) for the penalties."""
    b = len(prompts)
    seen = torch.zeros(b, vocab, dtype=torch.bool, device=device)
    counts = torch.zeros(b, vocab, dtype=torch.float32, device=device)
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        ids = torch.tensor(list(p) + list(o), dtype=torch.int64, device=device)
        if ids.numel():
            seen[i, ids] = True
        if len(o):
            out = torch.tensor(list(o), dtype=torch.int64, device=device)
            counts[i].scatter_add_(0, out, torch.ones_like(out, dtype=torch.float32))
    return seen, counts


def apply_penalties(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Repetition, presence and frequency penalties on raw fp32 logits [B, V] (returns a new tensor)."""
    logits = logits.clone()
    if t.seen is not None:
        rep = t.repetition_penalty[:, None]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(t.seen, penalised, logits)
    if t.counts is not None:
        logits = logits - t.frequency_penalty[:, None] * t.counts
        logits = logits - t.presence_penalty[:, None] * (t.counts > 0).to(logits.dtype)
    return logits


def stable_ranks(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [B, V], ranks [B, V]): descending order, equal values by ascending token id; ranks[b, order[b, r]] = r."""
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ar = torch.arange(logits.shape[-1], device=logits.device).expand_as(order)
    ranks.scatter_(1, order, ar)
    return order, ranks


@dataclass(frozen=True)
class SamplingFlags:
    """Host facts about a batch's rows, so that `sample` never reads the device to pick its stages (the engine knows
    them from the requests' parameters). Each stage that no row uses is skipped; the ones used give the same bits
    whether their flag came from here or from the tensors."""

    all_greedy: bool  # every row has temperature 0
    top_k: bool  # some row has top_k > 0
    top_p: bool  # some row has top_p < 1
    min_p: bool  # some row has min_p > 0

    @classmethod
    def of(cls, t: "SamplingTensors") -> "SamplingFlags":
        """From the tensors (device reads: a synchronisation on a GPU)."""
        return cls(bool((t.temperature <= 0).all()), bool((t.top_k > 0).any()), bool((t.top_p < 1).any()),
                   bool((t.min_p > 0).any()))

    @property
    def plain(self) -> bool:
        """No row filters its vocabulary: greedy and temperature sampling only (kernels/triton_sampling)."""
        return not (self.top_k or self.top_p or self.min_p)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                  flags: SamplingFlags | None = None) -> torch.Tensor:
    """Mask (to -inf) what top_k, then top_p, then min_p remove from temperature-scaled logits [B, V]."""
    vocab = logits.shape[-1]
    if flags is None:
        use_k, use_p, use_min = bool((top_k > 0).any()), bool((top_p < 1).any()), bool((min_p > 0).any())
    else:
        use_k, use_p, use_min = flags.top_k, flags.top_p, flags.min_p
    if use_k or use_p:  # the full-vocabulary sort is the costly part: skip it when no row needs it
        order, ranks = stable_ranks(logits)
    if use_k:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        logits = logits.masked_fill(ranks >= k[:, None], float("-inf"))
    if use_p:
        probs = logits.softmax(dim=-1)
        sorted_p = probs.gather(1, order)  # same order: masking keeps the ranking
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly ahead of each token
        drop_sorted = (before >= top_p[:, None]) & (top_p[:, None] < 1)
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if use_min:
        probs = logits.softmax(dim=-1)
        p_max = probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < min_p[:, None] * p_max, float("-inf"))
    return logits


def gumbel_argmax(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """argmax(logits + Gumbel noise) per row: an exact draw from softmax(logits); [B] int64."""
    u = uniform_noise(seeds, positions, logits.shape[-1])
    gumbel = -torch.log(-torch.log(u))
    return torch.argmax(logits + gumbel, dim=-1)


def sample_plain_reference(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`sample` for rows without top-k / top-p / min-p and with their penalties applied already, from the rows' keys:
    argmax(logits) where temperature <= 0, else argmax(logits / temperature + Gumbel). The same ops (hence bits)
    as `sample` on such rows; kernels/triton_sampling.sample_plain is its GPU form."""
    logits = logits.float()
    greedy = temperature <= 0
    out = torch.argmax(logits, dim=-1)
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    gumbel = -torch.log(-torch.log(noise_of_keys(keys, logits.shape[-1])))
    return torch.where(greedy, out, torch.argmax(logits / temp[:, None] + gumbel, dim=-1))


def sample(logits: torch.Tensor, t: SamplingTensors, flags: SamplingFlags | None = None) -> torch.Tensor:
    """Next token per row, [B] int64, from fp32 logits [B, V]; row b depends only on row b's inputs. `flags`: the
    rows' stages as host facts (else read from the tensors); the result is the same either way."""
    logits = logits.float()
    if t.allowed is not None:
        logits = apply_allowed_mask(logits, t.allowed)
    logits = apply_penalties(logits, t)
    greedy = t.temperature <= 0
    out = torch.argmax(logits, dim=-1)  # first maximum: ties go to the lower id
    if (flags.all_greedy if flags is not None else bool(greedy.all())):
        return out
    temp = torch.where(greedy, torch.ones_like(t.temperature), t.temperature)
    scaled = filter_logits(logits / temp[:, None], t.top_k, t.top_p, t.min_p, flags)
    sampled = gumbel_argmax(scaled, t.seeds, t.positions)
    return torch.where(greedy, out, sampled)
