"""`deltaserve bench --engine`'s pieces on CPU with a tiny model: synthetic depth admits the requests as computed,
the decode run produces every token through the engine and reports its rates; the mixed run counts only the
streams' tokens while prompts arrive."""

from __future__ import annotations

from engine_helpers import tiny_model
from deltaserve.bench import engine_bench as eb


def test_decode_run_through_the_engine():
    model = tiny_model(moe=True, seed=1)
    engine = eb.make_engine(model, None, batch=3, max_len=200)
    out = eb.decode_run(engine, 3, depth=70, n=6, sampling="default", vocab=model.config.vocab_size)
    assert out["tokens"] == 3 * 5  # the first token of each comes from the one-token prefill, before the clock
    assert out["tok_s"] > 0 and out["host_ms"] > 0 and out["steps"] >= 5
    assert engine.scheduler.blocks.num_free == engine.scheduler.blocks.num_blocks  # everything given back


def test_lay_down_depth_counts_the_prompt_as_computed():
    model = tiny_model(moe=False, seed=2)
    engine = eb.make_engine(model, None, batch=2, max_len=300)
    for _ in range(2):
        engine.add_request(list(range(129)), eb.SamplingParams(max_tokens=2))
    eb.lay_down_depth(engine, 128)
    running = engine.scheduler.running
    assert len(running) == 2 and all(r.num_computed_tokens == 128 and len(r.block_table) == 2 for r in running)
    assert all(float(p.abs().sum()) > 0 for p in engine.cache.ssm.values())
    sched = engine.scheduler.schedule()  # the last prompt token of each: a one-token chunk that samples
    assert [(s.start, s.num_new_tokens, s.sample) for s in sched.seqs] == [(128, 1, True)] * 2


def test_mixed_run_counts_the_streams():
    model = tiny_model(moe=True, seed=1)
    out = eb.mixed_run(model, None, batch=2, depth=64, seconds=1.0, rate=20.0, lengths=(20, 40),
                       vocab=model.config.vocab_size)
    assert out["tok_s"] > 0 and out["arrivals"] >= 1


def test_prefix_run_resumes_and_checks_its_tokens():
    model = tiny_model(moe=True, seed=1)
    out = eb.prefix_run(model, None, cached_tokens=128, new_tokens=20, vocab=model.config.vocab_size)
    assert out["same_tokens"] and out["cold_ms"] > 0 and out["cached_ms"] > 0 and out["snapshot_mib"] > 0
