"""Engine metamorphic tests on a tiny random-weight model (fp32, CPU reference path).

batched == alone (greedy and seeded), chunked prefill (1, 16, 64) == whole prefill, decode == teacher-forced
prefill, unseeded requests reproducible from the engine seed.
"""

from __future__ import annotations

import pytest
import torch

from engine_helpers import drain, random_prompt, tiny_model
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams

LENGTHS = [3, 17, 40, 5, 64]


@pytest.fixture(scope="module")
def model():
    return tiny_model(moe=True, seed=3)


def run(model, prompts, params, **cfg) -> list[list[int]]:
    cfg = dict(dict(num_blocks=128, max_model_len=256), **cfg)
    return drain(LLMEngine(model, None, [], EngineConfig(**cfg)), prompts, params)


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_batched_equals_alone(model, kind):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    if kind == "greedy":
        params = [SamplingParams(temperature=0, max_tokens=12) for _ in prompts]
    else:
        params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=100 + i, max_tokens=12)
                  for i in range(len(prompts))]
    together = run(model, prompts, params, max_num_batched_tokens=48)  # forces chunking + mixed steps
    for i, (p, sp) in enumerate(zip(prompts, params)):
        assert run(model, [p], [sp]) == [together[i]], f"prompt {i} (len {len(p)})"
    assert len({tuple(t) for t in together}) == len(prompts)


def test_seeded_sampling_is_reproducible_and_seed_dependent(model):
    p = random_prompt(20, seed=1)
    a = run(model, [p, p], [SamplingParams(temperature=1.0, seed=5, max_tokens=16)] * 2)
    b = run(model, [p], [SamplingParams(temperature=1.0, seed=6, max_tokens=16)])
    assert a[0] == a[1] and a[0] != b[0]


def test_unseeded_requests_draw_distinct_seeds_from_the_engine_rng(model):
    p = random_prompt(10, seed=2)
    sp = SamplingParams(temperature=1.0, max_tokens=16)
    first = run(model, [p, p, p], [sp] * 3, seed=1)
    again = run(model, [p, p, p], [sp] * 3, seed=1)
    other = run(model, [p, p, p], [sp] * 3, seed=2)
    assert first == again
    assert len({tuple(t) for t in first}) == 3 and first != other


def all_logits(model, prompt, **cfg) -> torch.Tensor:
    llm = LLM.from_model(model, **dict(dict(num_blocks=128, max_model_len=256), **cfg))
    return llm.logits(prompt)


@pytest.mark.parametrize("block_size,chunk", [(1, 1), (16, 16), (16, 64), (32, 100)])
def test_chunked_prefill_equals_whole_prefill(model, block_size, chunk):
    """Chunks end on multiples of 64 (lcm with the block size) and the unaligned tail is a chunk of its own, so a
    prompt is computed in the same pieces whatever the budget: bit-identical logits (a budget under 64 still takes
    one aligned chunk a step)."""
    prompt = random_prompt(150, seed=9)
    whole = all_logits(model, prompt)
    chunked = all_logits(model, prompt, block_size=block_size, max_num_batched_tokens=chunk,
                         num_blocks=300 // block_size + 8)
    assert whole.shape == (150, 300) and whole.dtype == torch.float32
    assert torch.equal(chunked, whole)


def test_decode_equals_teacher_forced_prefill(model):
    """Tokens decoded one at a time are the argmax of a single prefill over prompt + output."""
    prompt = random_prompt(33, seed=4)
    out = run(model, [prompt], [SamplingParams(temperature=0, max_tokens=20)])[0]
    logits = all_logits(model, prompt + out[:-1])
    assert logits[len(prompt) - 1 :].argmax(-1).tolist() == out


def test_dense_model_batched_equals_alone():
    dense = tiny_model(moe=False, seed=5)
    prompts = [random_prompt(n, seed=n + 50) for n in (7, 30)]
    params = [SamplingParams(temperature=0, max_tokens=8)] * 2
    assert run(dense, prompts, params) == [run(dense, [p], [params[0]])[0] for p in prompts]


def test_auto_num_blocks_from_a_memory_budget(model):
    engine = LLMEngine(model, None, [], EngineConfig(max_model_len=256, max_num_seqs=2, cache_memory_bytes=1 << 30))
    assert engine.num_blocks == 2 * 16  # capped at what 2 full-length requests can use
    with pytest.raises(ValueError, match="cache budget"):
        LLMEngine(model, None, [], EngineConfig(max_model_len=256, cache_memory_bytes=1 << 10))


def test_bad_requests_get_clear_errors(model):
    engine = LLMEngine(model, None, [], EngineConfig(num_blocks=16, max_model_len=64))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([])
    with pytest.raises(ValueError, match="out of range"):
        engine.add_request([1, 300])
    with pytest.raises(ValueError, match="max_model_len 64"):
        engine.add_request(list(range(64)))
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request([1, 2], SamplingParams(stop=["x"]))


def test_prefill_then_token_by_token_decode_equals_whole_prefill(model):
    """Drive the runner with hand-made scheduler outputs: 40 tokens at once, then one token per step."""
    from deltaserve.engine.block_pool import BlockPool
    from deltaserve.engine.request import Request
    from deltaserve.engine.runner import ModelRunner
    from deltaserve.engine.scheduler import ScheduledSeq, SchedulerOutput

    tokens = random_prompt(70, seed=12)
    whole = all_logits(model, tokens)
    cache = model.make_cache(8, 16, 2)
    runner, pool = ModelRunner(model, cache), BlockPool(8, 16)
    req = Request("r", tokens, SamplingParams(), logits_only=True, state_slot=1)
    pieces, start = [], 0
    for n in [40] + [1] * 30:
        pool.may_append(req.block_table, start + n)
        out = runner.execute(SchedulerOutput([ScheduledSeq(req, start, n, sample=False)]))
        pieces.append(out.logits["r"])
        start += n
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=1e-4, atol=1e-4)
