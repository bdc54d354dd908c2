"""The hybrid prefix cache (engine/prefix_cache.py) on the CPU reference path: a request resumed from cached KV
blocks and a DeltaNet snapshot gets the logits and tokens it gets computed from scratch, bit for bit.

- resume == fresh at every snapshot point of a multi-turn chat and of long prompts (interval snapshots), tiny MoE
  and dense models, greedy and seeded, in batches mixing hits and misses;
- the cache's bookkeeping: blocks shared by reference count, evicted least recently used only when unreferenced,
  snapshots within their budget (LRU), a prefix whose blocks are gone no longer hits;
- 64 requests sharing a prefix with random aborts, some arriving while the prefix is still prefilled: every block,
  slot and reference given back.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine_helpers import random_prompt, tiny_model
from deltaserve.engine.block_pool import BlockPool
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams

BS = 16


@pytest.fixture(scope="module")
def moe():
    return tiny_model(moe=True, seed=3)


@pytest.fixture(scope="module")
def dense():
    return tiny_model(moe=False, seed=4)


def engine(model, caching=True, **cfg) -> LLMEngine:
    base = dict(num_blocks=160, max_model_len=1024, block_size=BS, max_num_batched_tokens=128, max_num_seqs=8,
                enable_prefix_caching=caching, prefix_snapshot_interval=128)
    return LLMEngine(model, None, [], EngineConfig(**dict(base, **cfg)))


def recording(e: LLMEngine) -> dict:
    """Logits of every sampled token, by (request id, position), recorded from the engine's sampler."""
    got = {}
    sample = e.runner.sampler.sample

    def rec(logits, reqs, positions, out=None):
        for b, (r, p) in enumerate(zip(reqs, positions)):
            got[(r.request_id, p)] = logits[b].clone()
        return sample(logits, reqs, positions, out=out)

    e.runner.sampler.sample = rec
    return got


def run(e: LLMEngine, prompts, params, ids=None) -> dict[str, object]:
    """Requests run together; their final outputs by id."""
    ids = ids or [f"r{i}" for i in range(len(prompts))]
    for rid, p, sp in zip(ids, prompts, params):
        e.add_request(p, sp, request_id=rid)
    done = {}
    while e.has_unfinished():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out
    return done


def fresh(model, prompt, params):
    """Tokens and per-position logits of the request computed from scratch (no cache)."""
    e = engine(model, caching=False)
    logits = recording(e)
    out = run(e, [prompt], [params], ["x"])["x"]
    return out.token_ids, {p: lg for (_, p), lg in logits.items()}


def assert_same_as_fresh(model, e, logits, out, prompt, params, batched=False):
    """The request's tokens and every sampled position's logits equal the same request computed from scratch,
    alone. Bit for bit when the request also ran alone; with neighbours (batched), tokens bit for bit and logits to
    fp32 rounding: on the CPU reference path a row's elementwise transcendental ops round differently by where the
    row falls in the tensor (vectorised body or scalar tail: torch.sigmoid of a [40, 1] tensor and of the first 40
    rows of a [70, 1] one differ, torch 2.13), so batch invariance there is token-level; the GPU kernels are
    batch-invariant bit for bit (tests/gpu/test_prefix_cache_gpu.py)."""
    tokens, want = fresh(model, prompt, params)
    assert out.token_ids == tokens, out.request_id
    got = {p: lg for (rid, p), lg in logits.items() if rid == out.request_id}
    assert got.keys() == want.keys()
    for p in want:
        if batched:
            torch.testing.assert_close(got[p], want[p], rtol=1e-4, atol=1e-4)  # logits of magnitude ~5-10
        else:
            assert torch.equal(got[p], want[p]), (out.request_id, p)


@pytest.mark.parametrize("which", ["moe", "dense"])
@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_multi_turn_chat_resumes_bit_for_bit(which, kind, request):
    model = request.getfixturevalue(which)
    sp = SamplingParams(temperature=0 if kind == "greedy" else 0.9, seed=5, max_tokens=20, ignore_eos=True)
    e = engine(model)
    logits = recording(e)
    history, previous = random_prompt(150, seed=1), 0
    for turn in range(3):
        out = run(e, [history], [sp], [f"t{turn}"])[f"t{turn}"]
        # the previous turn snapshotted its last aligned prompt position: this turn resumes there
        assert out.metrics.num_cached_tokens == previous // 64 * 64, turn
        assert_same_as_fresh(model, e, logits, out, history, sp)
        previous = len(history)
        history = history + out.token_ids + random_prompt(40 + 30 * turn, seed=10 + turn)
    assert e.prefix_cache.hits > 0


def test_long_prompts_resume_at_interval_snapshots(moe):
    e = engine(moe)
    logits = recording(e)
    base = random_prompt(420, seed=2)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    run(e, [base], [sp], ["a"])  # seams at 128, 256, 384 (interval) and 384 (last aligned)
    for cut, expect in ((300, 256), (260, 256), (200, 128), (130, 128), (100, 0)):
        prompt = base[:cut] + random_prompt(37, seed=cut)
        out = run(e, [prompt], [sp], [f"c{cut}"])[f"c{cut}"]
        assert out.metrics.num_cached_tokens == expect, cut
        assert_same_as_fresh(moe, e, logits, out, prompt, sp)


def test_batches_mixing_hits_and_misses(moe):
    e = engine(moe)
    logits = recording(e)
    shared = random_prompt(200, seed=3)
    run(e, [shared], [SamplingParams(max_tokens=2)], ["warm"])
    prompts = [shared + random_prompt(n, seed=n) for n in (5, 70)] + [random_prompt(150, seed=7), shared[:128] + [1]]
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=10, ignore_eos=True) for i in range(4)]
    outs = run(e, prompts, params)
    assert [outs[f"r{i}"].metrics.num_cached_tokens for i in range(4)] == [192, 192, 0, 128]
    for i in range(4):
        assert_same_as_fresh(moe, e, logits, outs[f"r{i}"], prompts[i], params[i], batched=True)
    for i in (0, 1, 3):  # the same prompts again, alone, on what the batch cached (its rounding: token-level)
        out = run(e, [prompts[i]], [params[i]], [f"alone{i}"])[f"alone{i}"]
        assert out.metrics.num_cached_tokens >= 128
        assert_same_as_fresh(moe, e, logits, out, prompts[i], params[i], batched=True)


def test_fp8_and_bf16_caches_do_not_share_blocks(moe):
    """The KV dtype is part of the hash chain's salt."""
    a, b = engine(moe), engine(moe, kv_cache_dtype="fp8")
    assert a.prefix_cache.salt != b.prefix_cache.salt


def test_blocks_are_shared_by_reference_and_evicted_lru_when_unreferenced():
    pool = BlockPool(4, 16)
    a = pool.allocate(2)
    assert pool.register(a[0], b"h0") and pool.register(a[1], b"h1")
    assert not pool.register(a[1], b"h1")  # registered once
    pool.share(a[0])
    assert pool.ref(a[0]) == 2
    pool.free(a)  # a[0] still referenced once, a[1] becomes evictable (cached)
    assert pool.ref(a[0]) == 1 and pool.num_free == 3 and pool.lookup(b"h1") == a[1]
    evicted = []
    pool.on_evict = evicted.append
    pool.allocate(2)  # the two free blocks first: the cached one survives
    assert pool.lookup(b"h1") == a[1] and not evicted
    pool.allocate(1)  # then the least recently used cached block
    assert pool.lookup(b"h1") is None and evicted == [b"h1"]
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate(1)
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.free([a[1], a[1], a[1]])


def test_evicted_prefix_no_longer_hits_and_snapshot_budget_is_lru(moe):
    spec = engine(moe, num_blocks=40)._spec()
    e2 = engine(moe, num_blocks=40, prefix_snapshot_interval=None, prefix_state_budget=2 * spec.bytes_per_state_slot)
    assert e2.num_snapshots == 2
    logits = recording(e2)
    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    p1, p2, p3 = (random_prompt(130, seed=s) for s in (21, 22, 23))
    run(e2, [p1], [sp], ["p1"])
    run(e2, [p2], [sp], ["p2"])
    run(e2, [p3], [sp], ["p3"])  # a third snapshot: p1's (least recently used) goes
    assert e2.prefix_cache.num_snapshots_used == 2
    out = run(e2, [p1 + [5]], [sp], ["p1b"])["p1b"]
    assert out.metrics.num_cached_tokens == 0
    out = run(e2, [p3 + [5]], [sp], ["p3b"])["p3b"]
    assert out.metrics.num_cached_tokens == 128
    assert_same_as_fresh(moe, e2, logits, out, p3 + [5], sp)
    # 40 blocks of 16: long requests take back cached blocks; an evicted prefix misses, and nothing breaks
    for s in range(4):
        run(e2, [random_prompt(300, seed=40 + s)], [sp], [f"big{s}"])
    out = run(e2, [p3 + [6]], [sp], ["p3c"])["p3c"]
    assert out.metrics.num_cached_tokens == 0
    assert_same_as_fresh(moe, e2, logits, out, p3 + [6], sp)


def test_many_requests_sharing_a_prefix_with_aborts_give_everything_back(moe):
    e = engine(moe, max_num_seqs=8, num_blocks=200)
    logits = recording(e)
    shared = random_prompt(160, seed=8)
    rng = random.Random(0)
    asked, done, aborted = {}, {}, set()
    for i in range(64):
        rid = f"q{i}"
        asked[rid] = (shared + random_prompt(rng.randint(1, 40), seed=100 + i),
                      SamplingParams(temperature=0.7, seed=i, max_tokens=rng.randint(1, 8), ignore_eos=True))
        e.add_request(*asked[rid], request_id=rid)
        for out in e.step():  # one step between arrivals: some arrive while the prefix is still prefilled
            if out.finished:
                done[out.request_id] = out
        if rng.random() < 0.2:
            victim = rng.choice(list(asked))
            if victim not in done:
                e.abort(victim)
                aborted.add(victim)
    while e.has_unfinished():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out
    assert set(done) | aborted == set(asked) and not set(done) & aborted
    assert sum(o.metrics.num_cached_tokens for o in done.values()) > 0
    pool = e.scheduler.blocks
    assert pool.num_free == pool.num_blocks and all(pool.ref(b) == 0 for b in range(pool.num_blocks))
    assert e.scheduler.slots.num_free == e.scheduler.slots.num_slots and not e.requests
    for rid in [r for r in done if done[r].metrics.num_cached_tokens][:3]:  # hits against fresh computation
        assert_same_as_fresh(moe, e, logits, done[rid], *asked[rid], batched=True)


def test_prefix_caching_off_never_shares(moe):
    e = engine(moe, caching=False)
    assert e.prefix_cache is None and e.num_snapshots == 0
    shared = random_prompt(150, seed=9)
    sp = SamplingParams(temperature=0, max_tokens=2)
    run(e, [shared], [sp], ["a"])
    assert run(e, [shared + [1]], [sp], ["b"])["b"].metrics.num_cached_tokens == 0


def test_chat_turns_resume_through_the_api():
    """LLM.chat: the second turn of a conversation resumes from the first turn's prompt (its message ends are
    snapshot hints too), and its reply equals the one computed with the cache off."""
    from engine_helpers import CHAT_TEMPLATE, byte_tokenizer

    from deltaserve.engine.llm import LLM
    from deltaserve.engine.tokenizer import TokenizerInfo

    model = tiny_model(moe=True, seed=5)
    tok = TokenizerInfo(byte_tokenizer(), CHAT_TEMPLATE, {"eos_token": "<|im_end|>"}, [258])
    sp = SamplingParams(temperature=0, max_tokens=12)
    turn1 = [{"role": "system", "content": "You answer briefly. " * 6}, {"role": "user", "content": "Name a sea."}]

    def conversation(llm):
        first = llm.chat(turn1, sp)[0]
        turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And a river?"}]
        return first, llm.chat(turn2, sp)[0]

    cfg = dict(num_blocks=64, max_model_len=512, block_size=16, cuda_graphs=False)
    cached = conversation(LLM.from_model(model, tok, **cfg))
    plain = conversation(LLM.from_model(model, tok, enable_prefix_caching=False, **cfg))
    assert cached[1].metrics.num_cached_tokens >= 64 and plain[1].metrics.num_cached_tokens == 0
    assert [o.token_ids for o in cached] == [o.token_ids for o in plain]
