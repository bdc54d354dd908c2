"""The prefix cache on the GPU fast path (bf16, CUDA graphs, bf16 and fp8 KV): a request resumed from cached
blocks and a DeltaNet snapshot gets the tokens and the logits of every sampled position that it gets computed from
scratch alone, bit for bit, also in a batch mixing hits and misses (the GPU kernels are batch-invariant)."""

from __future__ import annotations

import pytest
import torch

from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(bf16_moe_model):
    return bf16_moe_model


def engine(model, caching, kv):
    return LLMEngine(model, None, [], EngineConfig(num_blocks=256, max_num_seqs=8, max_model_len=1024, block_size=64,
                                                    max_num_batched_tokens=256, cuda_graphs=True, kv_cache_dtype=kv,
                                                    enable_prefix_caching=caching, prefix_snapshot_interval=128))


def run(e, prompts, params):
    got, done = {}, {}
    sample = e.runner.sampler.sample

    def rec(logits, reqs, positions, out=None):  # top-k rows: sampled here, after the graph's own sampling
        for b, (r, p) in enumerate(zip(reqs, positions)):
            got[(r.request_id, p)] = logits[b].clone()
        return sample(logits, reqs, positions, out=out)

    e.runner.sampler.sample = rec
    ids = [e.add_request(p, sp) for p, sp in zip(prompts, params)]
    while e.has_unfinished():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out
    return [(done[i], {p: lg for (r, p), lg in got.items() if r == i}) for i in ids]


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_resume_equals_fresh_bit_for_bit(model, kv):
    g = torch.Generator().manual_seed(4)
    shared = torch.randint(0, 32, (300,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 32, (n,), generator=g).tolist() for n in (3, 90)] + \
        [torch.randint(0, 32, (200,), generator=g).tolist(), shared[:130]]
    params = [SamplingParams(temperature=0.8, top_k=20, seed=i, max_tokens=10, ignore_eos=True) for i in range(4)]
    e = engine(model, True, kv)
    run(e, [shared], [SamplingParams(max_tokens=2)])  # snapshots at 128, 256 (interval) and 256 (last aligned)
    cached = run(e, prompts, params)
    assert [o.metrics.num_cached_tokens for o, _ in cached] == [256, 256, 0, 128]
    assert e.runner.graph_steps > 0
    for (out, logits), p, sp in zip(cached, prompts, params):
        (want, want_logits), = run(engine(model, False, kv), [p], [sp])
        assert out.token_ids == want.token_ids
        assert logits.keys() == want_logits.keys()
        assert all(torch.equal(logits[k], want_logits[k]) for k in logits)
