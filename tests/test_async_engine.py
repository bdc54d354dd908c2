"""AsyncLLMEngine: one engine thread, many coroutines. Concurrent requests get what each gets alone; abort (and a
consumer that stops listening) frees blocks and slots; a bad request fails alone; a failing step fails everyone
clearly; the waiting limit refuses the excess."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine_helpers import byte_tokenizer, random_prompt, tiny_model
from deltaserve.engine.async_engine import AsyncLLMEngine, EngineDeadError, QueueFullError
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams

CFG = dict(num_blocks=96, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=48)


@pytest.fixture(scope="module")
def model():
    return tiny_model(moe=True, seed=3)


@pytest.fixture
def engine(model):
    llm = LLM.from_model(model, byte_tokenizer(), **CFG)
    ae = AsyncLLMEngine(llm.engine, max_queued_requests=None).start()
    yield ae
    ae.shutdown()


def pools_free(ae: AsyncLLMEngine, timeout: float = 5.0) -> bool:
    s = ae.engine.scheduler
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (not ae.engine.has_unfinished() and s.blocks.num_free == s.blocks.num_blocks
                and s.slots.num_free == s.slots.num_slots and ae.num_unfinished == 0):
            return True
        time.sleep(0.01)
    return False


async def _collect(ae, prompt, sp, rid):
    text, ids, last = "", [], None
    async for out in ae.generate(prompt, sp, request_id=rid):
        text += out.new_text
        ids += out.new_token_ids
        last = out
    assert last.finished and ids == last.token_ids and text == last.text
    return ids


def test_concurrent_requests_equal_each_alone(model, engine):
    prompts = [random_prompt(n, seed=n) for n in (3, 17, 40, 5, 64, 9, 30, 12)]
    params = [SamplingParams(temperature=0 if i % 2 else 0.9, top_p=0.9, seed=10 + i, max_tokens=10, ignore_eos=True)
              for i in range(len(prompts))]

    async def main():
        return await asyncio.gather(*(_collect(engine, p, sp, f"r{i}") for i, (p, sp) in
                                      enumerate(zip(prompts, params))))

    together = asyncio.run(main())  # 8 requests through 4 slots: admissions while others decode
    solo = LLM.from_model(model, byte_tokenizer(), **CFG)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        assert solo.generate([p], sp)[0].token_ids == together[i], f"request {i}"
    assert pools_free(engine)


class Recorder:
    def __init__(self):
        self.added, self.aborted, self.finished = [], [], []

    def on_add(self, request_id, submitted, num_prompt_tokens):
        self.added.append(request_id)

    def on_step(self, outputs, now, stats):
        self.finished += [o.request_id for o in outputs if o.finished]

    def on_abort(self, request_id):
        self.aborted.append(request_id)


def test_abort_and_a_consumer_that_leaves_free_everything(engine):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    engine.observer = seen_by_engine = Recorder()

    async def main():
        stream = await engine.add_request(random_prompt(20), long, "kept")
        seen = 0
        async for _ in engine.generate(random_prompt(30, seed=1), long, request_id="left"):
            seen += 1
            if seen == 3:
                break  # leaving the loop aborts "left"
        async for out in stream:
            engine.abort("kept")  # abort from the consumer itself
            break
        return seen

    assert asyncio.run(main()) == 3
    assert pools_free(engine, timeout=2.0)
    assert sorted(seen_by_engine.aborted) == ["kept", "left"] and seen_by_engine.finished == []


def test_a_bad_request_fails_alone(engine):
    async def main():
        good = asyncio.ensure_future(_collect(engine, random_prompt(10), SamplingParams(temperature=0, max_tokens=8),
                                              "good"))
        with pytest.raises(ValueError, match="max_model_len"):
            await engine.add_request(random_prompt(300), SamplingParams(max_tokens=4), "too-long")
        with pytest.raises(ValueError, match="out of range"):
            await engine.add_request([1, 99999], SamplingParams(max_tokens=4), "bad-id")
        with pytest.raises(ValueError, match="already in use"):
            await asyncio.gather(engine.add_request([1, 2], SamplingParams(max_tokens=50), "dup"),
                                 engine.add_request([1, 2], SamplingParams(max_tokens=50), "dup"))
        engine.abort("dup")
        return await good

    assert len(asyncio.run(main())) == 8
    assert engine.is_alive and pools_free(engine)


def test_waiting_limit_refuses_the_excess(model):
    llm = LLM.from_model(model, byte_tokenizer(), **CFG)
    ae = AsyncLLMEngine(llm.engine, max_queued_requests=2).start()  # 4 running + 2 waiting

    async def main():
        sp = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        streams = [await ae.add_request(random_prompt(5, seed=i), sp, f"q{i}") for i in range(6)]
        with pytest.raises(QueueFullError, match="at most 6"):
            ae.check_capacity()
        streams[0].abort()
        ae.check_capacity()  # room again
        for s in streams[1:]:
            s.abort()

    try:
        asyncio.run(main())
        assert pools_free(ae)
    finally:
        ae.shutdown()


def test_a_failing_step_is_reported_to_every_stream_and_later_adds(model):
    llm = LLM.from_model(model, byte_tokenizer(), **CFG)
    ae = AsyncLLMEngine(llm.engine).start()
    calls = {"n": 0}
    real_step = llm.engine.step

    def step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fault")
        return real_step()

    llm.engine.step = step

    async def main():
        with pytest.raises(EngineDeadError, match="device fault"):
            await _collect(ae, random_prompt(8), SamplingParams(temperature=0, max_tokens=50), "a")
        with pytest.raises(EngineDeadError):
            await ae.add_request(random_prompt(8), SamplingParams(max_tokens=5), "b")

    try:
        asyncio.run(main())
        assert not ae.is_alive and "device fault" in repr(ae.error)
    finally:
        ae.shutdown()


def test_shutdown_ends_open_streams(model):
    llm = LLM.from_model(model, byte_tokenizer(), **CFG)
    ae = AsyncLLMEngine(llm.engine).start()

    async def main():
        stream = await ae.add_request(random_prompt(8), SamplingParams(temperature=0, max_tokens=200,
                                                                       ignore_eos=True), "s")
        await asyncio.get_running_loop().run_in_executor(None, ae.shutdown)
        with pytest.raises(EngineDeadError, match="shut down"):
            async for _ in stream:
                pass

    asyncio.run(main())


def test_speculative_counters_reach_the_server_metrics(model):
    """A drafting engine behind the async engine: replies as undrafted, and /metrics' spec_decode_* counters equal
    the engine's totals."""
    from deltaserve.engine.engine import EngineConfig, LLMEngine
    from deltaserve.server.metrics import ServerMetrics
    from spec_helpers import RecordedDrafts

    prompts = [random_prompt(n, seed=n) for n in (4, 19)]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = [o.token_ids for o in LLM.from_model(model, byte_tokenizer(), **CFG).generate(prompts, sp)]
    drafts = RecordedDrafts({f"s{i}": t for i, t in enumerate(want)}, model.config.vocab_size, right=1)
    cfg = EngineConfig(num_blocks=96, max_model_len=256, max_num_seqs=4, speculative_tokens=2)
    metrics = ServerMetrics("tiny")
    ae = AsyncLLMEngine(LLMEngine(model, byte_tokenizer(), [], cfg, draft_source=drafts), observer=metrics).start()

    async def main():
        return await asyncio.gather(*(_collect(ae, p, sp, f"s{i}") for i, p in enumerate(prompts)))

    try:
        assert asyncio.run(main()) == want
    finally:
        ae.shutdown()
    stats = ae.engine.spec_stats
    text = metrics.exposition().decode()
    for name, value in (("num_drafts", stats.steps), ("num_draft_tokens", stats.drafted),
                        ("num_accepted_tokens", stats.accepted)):
        assert f'deltaserve:spec_decode_{name}_total{{model_name="tiny"}} {float(value)}' in text
    assert 0 < stats.accepted < stats.drafted
