"""Outside oracle: our logits and greedy continuations == transformers' Qwen3.5 / Qwen3.5-MoE (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from model_helpers import greedy, make_hf_model, ours_from_checkpoint

CASES = {
    # name: (moe, tie, text overrides)
    "moe-gva2": (True, False, {}),
    "moe-gva1-gqa4-partial05": (
        True, False,
        dict(num_key_value_heads=1, linear_num_value_heads=2,
             rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.5,
                                  mrope_section=[3, 3, 2], mrope_interleaved=True)),
    ),
    "dense-tied-gva1": (False, True, dict(linear_num_value_heads=2)),
    "dense-gva2-gqa3": (False, False, dict(num_attention_heads=6, num_key_value_heads=2)),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """transformers' model and ours loaded from a checkpoint of it in the published fused-expert layout."""
    moe, tie, over = CASES[request.param]
    hf = make_hf_model(moe, seed=list(CASES).index(request.param), tie=tie, **over)
    return hf, ours_from_checkpoint(hf, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("length", [1, 63, 64, 65, 203])
def test_logits_match_transformers(pair, length):
    hf, ours = pair
    ids = torch.randint(2, hf.config.text_config.vocab_size, (length,), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        want = hf(input_ids=ids[None]).logits[0]
    _, got = greedy(ours, ids.tolist(), 0)
    err = (got - want).abs().max().item()
    assert err <= 1e-4 * want.abs().max().item(), f"max |diff| {err:.3g} vs max|logit| {want.abs().max():.3g}"


def test_greedy_continuation_matches_transformers(pair):
    hf, ours = pair
    prompt = torch.randint(2, hf.config.text_config.vocab_size, (70,), generator=torch.Generator().manual_seed(7))
    seq = prompt.tolist()
    with torch.no_grad():  # transformers without a cache: the whole sequence every step
        for _ in range(32):
            seq.append(int(hf(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    want = seq[70:]
    got, _ = greedy(ours, prompt.tolist(), 32)
    assert got == want
