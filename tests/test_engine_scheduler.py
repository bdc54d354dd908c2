"""Block pool, state slots and scheduler: pure bookkeeping, no model."""

from __future__ import annotations

import pytest

from deltaserve.engine.block_pool import BlockPool, StateSlotPool
from deltaserve.engine.request import FinishReason, Request, RequestStatus
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.engine.scheduler import Scheduler, SchedulerConfig


def make_request(rid: str, prompt_len: int, max_tokens: int = 4, logits_only=False) -> Request:
    return Request(rid, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                   logits_only=logits_only)


def scheduler(num_blocks=32, block_size=4, max_seqs=4, budget=16, max_len=256) -> Scheduler:
    return Scheduler(SchedulerConfig(max_seqs, budget, max_len), BlockPool(num_blocks, block_size), StateSlotPool(max_seqs))


def simulate(s: Scheduler, steps: int = 1000) -> list[list[tuple[str, int, int]]]:
    """Run the scheduler with a fake sampler (token 7) until all finish; the per-step (id, start, n) lists."""
    trace = []
    for _ in range(steps):
        if not s.has_unfinished():
            break
        out = s.schedule()
        assert not out.is_empty
        trace.append([(x.request.request_id, x.start, x.num_new_tokens) for x in out.seqs])
        s.update(out)
        for x in out.seqs:
            r = x.request
            if x.sample:
                r.output_token_ids.append(7)
                if len(r.output_token_ids) >= r.max_tokens:
                    s.finish(r, FinishReason.LENGTH)
            elif r.logits_only and not r.in_prefill:
                s.finish(r, FinishReason.LENGTH)
    return trace


# ---- pools ---------------------------------------------------------------------------------------------------
def test_block_pool_allocate_append_free():
    pool = BlockPool(4, block_size=16)
    assert pool.blocks_for(0) == 0 and pool.blocks_for(1) == 1 and pool.blocks_for(16) == 1 and pool.blocks_for(17) == 2
    table: list[int] = []
    pool.may_append(table, 17)
    assert len(table) == 2 and pool.num_free == 2
    pool.may_append(table, 32)  # still two blocks
    assert len(table) == 2
    pool.may_append(table, 33)
    assert len(table) == 3 and len(set(table)) == 3
    assert not pool.can_allocate(2) and pool.can_allocate(1)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate(2)
    pool.free(table)
    assert pool.num_free == 4
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.free([table[0]])


def test_state_slots_are_unique_and_reusable():
    slots = StateSlotPool(2)
    a, b = slots.allocate(), slots.allocate()
    assert a != b and not slots.can_allocate()
    with pytest.raises(RuntimeError):
        slots.allocate()
    slots.free(a)
    assert slots.allocate() == a
    with pytest.raises(RuntimeError):
        slots.free(5)


# ---- scheduling ----------------------------------------------------------------------------------------------
def test_prefill_chunks_end_on_aligned_positions_and_the_tail_is_a_chunk_of_its_own():
    # block 4: chunks end on multiples of lcm(4, 64) = 64, so a prompt is cut the same way whatever the budget
    s = scheduler(block_size=4, budget=100, num_blocks=64)
    s.add(make_request("a", 150, max_tokens=2))
    prefill = [step[0] for step in simulate(s) if step[0][1] < 150]
    assert prefill == [("a", 0, 64), ("a", 64, 64), ("a", 128, 22)]  # budget 100 reaches 64, then 128; the tail
    s = scheduler(block_size=4, budget=200, num_blocks=64)
    s.add(make_request("a", 150, max_tokens=2))
    assert [step[0] for step in simulate(s) if step[0][1] < 150] == [("a", 0, 128), ("a", 128, 22)]
    s = scheduler(block_size=4, budget=8, num_blocks=64)  # a budget under the alignment: one aligned chunk a step
    s.add(make_request("a", 70, max_tokens=2))
    assert [step[0] for step in simulate(s) if step[0][1] < 70] == [("a", 0, 64), ("a", 64, 6)]


def test_continuous_batching_decodes_first_then_admits_within_budget():
    s = scheduler(block_size=4, budget=80, max_seqs=3, num_blocks=128)
    for rid, n in [("a", 5), ("b", 70), ("c", 130), ("d", 3)]:
        s.add(make_request(rid, n, max_tokens=3))
    trace = simulate(s)
    assert trace[0] == [("a", 0, 5), ("b", 0, 64)]  # b's tail waits; 11 tokens of budget reach no aligned end for c
    assert trace[1] == [("a", 5, 1), ("b", 64, 6), ("c", 0, 64)]  # decode a, b's tail, start c
    for step in trace:
        assert len(step) <= 3 and sum(n for _, _, n in step) <= 80
    # every request computed exactly its prompt + max_tokens - 1 tokens, in order, without gaps
    for rid, n in [("a", 5), ("b", 70), ("c", 130), ("d", 3)]:
        spans = [(st, k) for step in trace for r, st, k in step if r == rid]
        pos = 0
        for st, k in spans:
            assert st == pos
            pos += k
        assert pos == n + 3 - 1


def test_admission_refused_until_memory_for_the_whole_request_is_free():
    # 6 blocks of 4: "a" needs ceil((10 + 8 - 1) / 4) = 5 blocks for its life, so "b" (2 blocks) must wait
    s = scheduler(num_blocks=6, block_size=4, budget=64)
    a, b = make_request("a", 10, max_tokens=8), make_request("b", 5, max_tokens=2)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert [x.request.request_id for x in out.seqs] == ["a"]
    assert len(a.block_table) == 3 and s.reserved_blocks() == 2
    assert b.status == RequestStatus.WAITING
    trace = simulate(s)
    first_b = next(i for i, step in enumerate(trace) if any(r == "b" for r, _, _ in step))
    assert all(r == "a" for step in trace[:first_b] for r, _, _ in step)
    assert s.blocks.num_free == 6 and s.slots.num_free == 4


def test_request_larger_than_the_cache_is_refused_at_add():
    s = scheduler(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="needs 5 KV blocks"):
        s.add(make_request("big", 17, max_tokens=4))


def test_logits_only_requests_never_sample_and_finish_after_prefill():
    s = scheduler(block_size=4, budget=8, num_blocks=64)
    r = make_request("l", 150, logits_only=True)
    s.add(r)
    trace = simulate(s)
    assert trace == [[("l", 0, 64)], [("l", 64, 64)], [("l", 128, 22)]]
    assert r.output_token_ids == [] and r.finish_reason == FinishReason.LENGTH


def test_finish_frees_blocks_and_slot_of_waiting_or_running_requests():
    s = scheduler(num_blocks=8, block_size=4, max_seqs=1)
    a, b = make_request("a", 6), make_request("b", 6)
    s.add(a)
    s.add(b)
    s.update(s.schedule())
    assert a.status == RequestStatus.RUNNING and b.status == RequestStatus.WAITING  # one slot only
    s.finish(b, FinishReason.ABORT)
    s.finish(a, FinishReason.ABORT)
    assert s.blocks.num_free == 8 and s.slots.num_free == 1 and not s.has_unfinished()


def test_config_rejects_a_budget_below_one_block():
    with pytest.raises(ValueError, match="block_size"):
        scheduler(block_size=16, budget=8)
