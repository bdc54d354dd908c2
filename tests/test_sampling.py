"""The sampler is a pure function of (logits, seed, position): purity, exact masks, penalties, distribution."""

from __future__ import annotations

import math

import pytest
import torch

from deltaserve.kernels.sampling import (
    SamplingTensors,
    apply_allowed_mask,
    apply_penalties,
    filter_logits,
    mix32,
    sample,
    seed_to_int64,
    token_statistics,
    uniform_noise,
)

M = 0xFFFFFFFF


def params(b, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, rep=1.0, pres=0.0, freq=0.0, seeds=None, positions=None):
    full = lambda v, dt=torch.float32: torch.full((b,), v, dtype=dt)  # noqa: E731
    return SamplingTensors(
        temperature=full(temperature),
        top_k=full(top_k, torch.int64),
        top_p=full(top_p),
        min_p=full(min_p),
        repetition_penalty=full(rep),
        presence_penalty=full(pres),
        frequency_penalty=full(freq),
        seeds=torch.tensor(seeds if seeds is not None else [7] * b, dtype=torch.int64),
        positions=torch.tensor(positions if positions is not None else list(range(b)), dtype=torch.int64),
    )


# ---- the hash: an independent plain-integer implementation of the spec in the module docstring ----------------
def py_mix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & M
    x ^= x >> 15
    x = (x * 0x735A2D97) & M
    return x ^ (x >> 15)


def py_uniform(seed: int, position: int, token: int) -> float:
    h = py_mix((seed & M) ^ 0x1B873593)
    h = py_mix(h ^ (seed >> 32))
    h = py_mix(h ^ position)
    h = py_mix(py_mix(h ^ ((token * 0x61C88647) & M)))
    return ((h >> 8) + 0.5) / (1 << 24)


def test_hash_matches_plain_integer_spec_including_64_bit_seeds():
    seeds = [0, 1, 12345, (1 << 63) + 5, (1 << 64) - 1]
    for seed in seeds:
        u = uniform_noise(torch.tensor([seed_to_int64(seed)]), torch.tensor([17]), 50)[0]
        expect = torch.tensor([py_uniform(seed, 17, t) for t in range(50)], dtype=torch.float32)
        assert torch.equal(u, expect), seed


def test_mix32_is_a_bijection_on_a_sample_and_stays_32_bit():
    x = torch.arange(0, 1 << 16, dtype=torch.int64) * 65537
    y = mix32(x & M)
    assert int(y.min()) >= 0 and int(y.max()) <= M
    assert y.unique().numel() == x.numel()


def test_noise_is_uniform_and_decorrelated():
    u = uniform_noise(torch.tensor([3, 3]), torch.tensor([0, 1]), 200_000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(u.var()) - 1 / 12) < 0.002
    # neighbouring tokens and neighbouring positions are uncorrelated
    assert abs(float(torch.corrcoef(torch.stack([u[0, :-1], u[0, 1:]]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(u)[0, 1])) < 0.01


# ---- purity --------------------------------------------------------------------------------------------------
def test_same_seed_and_position_give_the_same_token_whatever_the_batch():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 500, generator=g) * 2
    seeds, pos = [11, 11, 99, 5, 11, 42], [3, 4, 3, 0, 3, 8]
    batch = sample(rows, params(6, temperature=0.9, top_k=50, top_p=0.9, seeds=seeds, positions=pos))
    for i in range(6):
        alone = sample(rows[i : i + 1], params(1, temperature=0.9, top_k=50, top_p=0.9, seeds=[seeds[i]], positions=[pos[i]]))
        assert int(alone[0]) == int(batch[i])
    perm = [4, 2, 0, 5, 1, 3]
    shuffled = sample(
        rows[perm], params(6, 0.9, 50, 0.9, seeds=[seeds[i] for i in perm], positions=[pos[i] for i in perm])
    )
    assert shuffled.tolist() == [int(batch[i]) for i in perm]


def test_different_seed_or_position_changes_the_draws():
    logits = torch.zeros(1, 1000)  # uniform: the draw is decided by the noise alone
    draws = {int(sample(logits, params(1, seeds=[s], positions=[p]))[0]) for s in range(5) for p in range(5)}
    assert len(draws) > 20


def test_greedy_is_argmax_with_ties_to_the_lower_id():
    logits = torch.tensor([[0.0, 2.0, 5.0, 5.0, 1.0], [3.0, 3.0, 3.0, 3.0, 3.0]])
    assert sample(logits, params(2, temperature=0.0)).tolist() == [2, 0]


# ---- distribution --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_empirical_frequencies_match_softmax(temperature):
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, -3.0, 1.5, 0.2])
    n = 20_000
    rows = logits.expand(n, -1)
    out = sample(rows, params(n, temperature=temperature, seeds=[123] * n, positions=list(range(n))))
    freq = torch.bincount(out, minlength=8).double() / n
    p = torch.softmax(logits.double() / temperature, -1)
    sigma = torch.sqrt(p * (1 - p) / n)
    assert torch.all((freq - p).abs() <= 4.5 * sigma + 1e-4), (freq, p)


def test_sampling_respects_masks_and_renormalises():
    logits = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.0, -1.0])
    n = 20_000
    out = sample(logits.expand(n, -1), params(n, top_k=3, seeds=[9] * n, positions=list(range(n))))
    freq = torch.bincount(out, minlength=6).double() / n
    assert freq[3:].sum() == 0
    p = torch.softmax(logits[:3].double(), -1)
    assert torch.all((freq[:3] - p).abs() < 4.5 * torch.sqrt(p * (1 - p) / n))


# ---- masks ---------------------------------------------------------------------------------------------------
def kept(masked: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(torch.isfinite(r)).flatten().tolist() for r in masked]


def test_top_k_keeps_exactly_k_with_ties_to_lower_ids():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    f = filter_logits(logits, torch.tensor([2, 4, 0]), torch.ones(3), torch.zeros(3))
    assert kept(f) == [[1, 2], [1, 2, 3, 4], [0, 1, 2, 3, 4]]


def reference_top_p(probs: list[float], top_p: float) -> list[int]:
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    keep, mass = [], 0.0
    for i in order:
        keep.append(i)
        mass += probs[i]
        if mass >= top_p:
            break
    return sorted(keep)


@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.75, 0.95, 0.99])
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_p):
    probs = [0.05, 0.5, 0.02, 0.2, 0.13, 0.1]
    logits = torch.tensor([probs]).log()
    f = filter_logits(logits, torch.tensor([0]), torch.tensor([top_p]), torch.zeros(1))
    assert kept(f)[0] == reference_top_p(probs, top_p)


def test_min_p_keeps_tokens_above_the_scaled_max():
    probs = [0.05, 0.5, 0.02, 0.2, 0.13, 0.1]
    logits = torch.tensor([probs, probs]).log()
    f = filter_logits(logits, torch.tensor([0, 0]), torch.ones(2), torch.tensor([0.25, 0.15]))
    assert kept(f) == [[1, 3, 4], [1, 3, 4, 5]]


def test_top_k_then_top_p_renormalises_in_between():
    probs = [0.4, 0.3, 0.2, 0.1]
    logits = torch.tensor([probs]).log()
    # after top_k=2 the probabilities are 4/7, 3/7: top_p 0.5 keeps one token, 0.6 keeps both
    f1 = filter_logits(logits, torch.tensor([2]), torch.tensor([0.5]), torch.zeros(1))
    f2 = filter_logits(logits, torch.tensor([2]), torch.tensor([0.6]), torch.zeros(1))
    assert kept(f1) == [[0]] and kept(f2) == [[0, 1]]


# ---- penalties -----------------------------------------------------------------------------------------------
def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    seen, counts = token_statistics([[0, 1]], [[4]], 5)
    t = params(1, rep=2.0)
    t.seen = seen
    out = apply_penalties(logits, t)
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0, 0.5]]


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros(1, 5)
    seen, counts = token_statistics([[0, 0, 1]], [[2, 2, 2, 3]], 5)
    assert counts.tolist() == [[0, 0, 3, 1, 0]]
    t = params(1, pres=0.5, freq=0.25)
    t.counts = counts
    out = apply_penalties(logits, t)
    assert out.tolist() == [[0.0, 0.0, -(0.5 + 0.75), -(0.5 + 0.25), 0.0]]


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[5.0, 4.0, 1.0]])
    t = params(1, temperature=0.0, rep=2.0)
    t.seen, _ = token_statistics([[0]], [[]], 3)
    assert int(sample(logits, t)[0]) == 1


def test_seed_range_is_checked():
    assert seed_to_int64((1 << 64) - 1) == -1
    with pytest.raises(ValueError, match="seed"):
        seed_to_int64(1 << 64)
    assert math.isclose(py_uniform(0, 0, 0), float(uniform_noise(torch.tensor([0]), torch.tensor([0]), 1)[0]))


def pack_bits(allowed: torch.Tensor) -> torch.Tensor:
    """[B, V] bool -> [B, ceil(V/32)] int32, bit v % 32 of word v // 32 (plain Python, the layout's definition)."""
    b, v = allowed.shape
    words = [[0] * -(-v // 32) for _ in range(b)]
    for i, j in allowed.nonzero().tolist():
        words[i][j // 32] |= 1 << (j % 32)
    return torch.tensor([[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words], dtype=torch.int32)


def test_allowed_mask_packed_and_bool_forms_match_the_definition():
    g = torch.Generator().manual_seed(0)
    b, v = 5, 77  # not a multiple of 32: the last word's high bits lie past V
    allowed = torch.rand(b, v, generator=g) < 0.3
    allowed[2] = True  # an unconstrained row
    packed = pack_bits(allowed)
    packed[:, -1] |= torch.tensor(-(1 << 31), dtype=torch.int32)  # a set bit past V must be ignored
    logits = torch.randn(b, v, generator=g)
    expected = torch.where(allowed, logits, torch.full_like(logits, float("-inf")))
    assert torch.equal(apply_allowed_mask(logits, packed), expected)
    assert torch.equal(apply_allowed_mask(logits, allowed), expected)
    assert torch.equal(apply_allowed_mask(logits, torch.full_like(packed, -1)), logits)
    with pytest.raises(ValueError, match=r"\[B, ceil\(V/32\)\] int32 for logits 5x77, found \(5, 2\)"):
        apply_allowed_mask(logits, packed[:, :2])
    with pytest.raises(ValueError, match="does not match logits"):
        apply_allowed_mask(logits, allowed[:, :10])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_sampling_is_row_local_and_never_picks_a_forbidden_token(temperature):
    g = torch.Generator().manual_seed(1)
    b, v = 6, 100
    logits = torch.randn(b, v, generator=g) * 3
    allowed = torch.rand(b, v, generator=g) < 0.2
    allowed[:, 7] = True
    allowed[4] = True  # a free row beside constrained ones
    t = params(b, temperature=temperature, top_p=0.9, rep=1.2, seeds=list(range(b)), positions=[3] * b)
    t.seen = torch.rand(b, v, generator=g) < 0.1
    t.allowed = pack_bits(allowed)
    batched = sample(logits, t)
    assert bool(allowed[torch.arange(b), batched].all())
    for i in range(b):
        one = params(1, temperature=temperature, top_p=0.9, rep=1.2, seeds=[i], positions=[3])
        one.seen, one.allowed = t.seen[i:i + 1], t.allowed[i:i + 1]
        assert sample(logits[i:i + 1], one).item() == batched[i].item()
    free = params(1, temperature=temperature, top_p=0.9, rep=1.2, seeds=[4], positions=[3])
    free.seen = t.seen[4:5]
    assert sample(logits[4:5], free).item() == batched[4].item()  # all-ones mask == no mask
