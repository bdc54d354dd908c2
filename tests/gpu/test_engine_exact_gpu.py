"""Exactness of the engine's step on the GPU fast path (bf16, graphs): what a request computes must not depend on
its neighbours, and the prompt's chunk boundaries must be a function of the request alone.

- a prompt prefilled whole, and in chunks cut at 64-aligned positions, and at 16-aligned ones: which give the same
  logits and states bit for bit (the prefix cache resumes at block seams: this says which seams are exact);
- through the engine with graphs: requests arriving while others decode (steps with decode rows and prompt chunks)
  get the same tokens as each alone, greedy and seeded; the decode graph's table width does not change a row's bits.
"""

from __future__ import annotations

import pytest
import torch

from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.model import ForwardBatch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(bf16_moe_model):
    return bf16_moe_model


def _prefill(model, prompt, cuts, bs=16):
    cache = model.make_cache(64, bs, 2, torch.bfloat16)
    table = list(range(-(-len(prompt) // bs)))
    bounds = [0, *cuts, len(prompt)]
    with torch.no_grad():
        for a, b in zip(bounds, bounds[1:]):
            logits = model(ForwardBatch.build([prompt[a:b]], [a], [table], [1], bs, device="cuda"), cache)
    return logits, cache


@pytest.mark.parametrize("cuts", [[64], [128], [64, 192], [16], [48, 80], [192, 240]])
def test_chunk_boundaries(model, cuts):
    """Prints which cut sets give the whole prompt's bits (a report for the prefix cache's seams), and asserts the
    64-aligned ones do."""
    prompt = torch.randint(0, 32, (256,), generator=torch.Generator().manual_seed(1)).tolist()
    whole, wc = _prefill(model, prompt, [])
    part, pc = _prefill(model, prompt, cuts)
    same = torch.equal(whole, part) and all(torch.equal(getattr(wc, n)[l], getattr(pc, n)[l])
                                            for n in ("ssm", "conv", "k", "v") for l in getattr(wc, n))
    print(f"CUTS {cuts}: {'same bits' if same else 'differ, max |dlogit| %.3g' % (whole - part).abs().max()}")
    if all(c % 64 == 0 for c in cuts):
        assert same


def _engine(model, **cfg):
    return LLMEngine(model, None, [], EngineConfig(num_blocks=256, max_num_seqs=16, max_model_len=512, block_size=16,
                                                    max_num_batched_tokens=128, cuda_graphs=True, **cfg))


def _solo(model, prompt, params):
    engine = _engine(model)
    rid = engine.add_request(prompt, params)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished and out.request_id == rid:
                return out.token_ids


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_arrivals_during_decode_equal_alone(model, kind):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 32, (int(n),), generator=gen).tolist() for n in (40, 7, 130, 64, 200, 3)]
    params = [SamplingParams(temperature=0 if kind == "greedy" else 0.9, seed=10 + i, max_tokens=12 + i,
                             ignore_eos=True) for i in range(len(prompts))]
    engine = _engine(model)
    ids, done = [], {}
    for i, (p, sp) in enumerate(zip(prompts, params)):
        ids.append(engine.add_request(p, sp))
        for _ in range(3):  # the next one arrives while these decode
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.token_ids
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert engine.runner.graph_steps > 0 and engine.runner.prefill_graph_steps > 0
    for i, (p, sp) in enumerate(zip(prompts, params)):
        assert done[ids[i]] == _solo(model, p, sp), f"request {i}"


def test_decode_graph_width_does_not_change_bits(model):
    """The same decode rows through graphs of two table widths: the same logits."""
    from deltaserve.engine.cuda_graph import DecodeGraphs

    cache = model.make_cache(80, 16, 4, torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    for pool in (*cache.k.values(), *cache.v.values()):
        pool.normal_(generator=g)
    graphs = DecodeGraphs(model, cache, 3, 79, max_blocks=64)
    rows = ([5, 7], [300, 20], [list(range(19)), [40, 41]], [0, 1])
    states = [(p, p.clone()) for p in (*cache.ssm.values(), *cache.conv.values())]
    graphs.width = lambda tokens: 32  # noqa: E731
    narrow = graphs.run(*rows).clone()
    for p, saved in states:  # the step advanced the DeltaNet states: the second run starts where the first did
        p.copy_(saved)
    graphs.width = lambda tokens: 64  # noqa: E731
    wide = graphs.run(*rows).clone()
    assert set(graphs.graphs) == {(2, 32), (2, 64)} and torch.equal(narrow, wide)
