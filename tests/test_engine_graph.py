"""The runner's bucketed decode graphs (engine/cuda_graph.DecodeGraphs) on CPU: no capture, the same padded step run
eagerly (`graphs_off_device`), bf16 tiny model on the reference path.

graph runner == eager runner token for token (greedy, seeded; 1, 3, 5 concurrent requests: buckets 1, 4, 8 with
padding), a request's logits identical alone in bucket 1 or padded into bucket 8, padding rows and the capture's
warm-up write only the scratch slot/block (never handed to the pools), and the fallbacks run eagerly. One test
repeats the padding checks on the model's fast path (Triton kernels) in a child under Triton's interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine_helpers import drain, random_prompt, tiny_model
from deltaserve.engine import cuda_graph
from deltaserve.engine.cuda_graph import DecodeGraph, DecodeGraphs, bucket_for
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.model import ForwardBatch

BS = 16


@pytest.fixture(scope="module")
def model():
    return tiny_model(moe=True, seed=3).to(torch.bfloat16)


def make_engine(model, graphs: bool, buckets=None, **cfg) -> LLMEngine:
    cfg = dict(dict(num_blocks=64, max_model_len=256, block_size=BS, max_num_batched_tokens=512), **cfg)
    engine = LLMEngine(model, None, [], EngineConfig(cuda_graphs=graphs, **cfg))
    if graphs:
        engine.runner.graphs_off_device = True
        if buckets is not None:
            engine.runner.graphs.buckets = buckets
    return engine


def requests(n: int, kind: str):
    prompts = [random_prompt(4 + 7 * i, seed=i) for i in range(n)]
    # Different lengths: the batch shrinks as requests finish, so several buckets are used.
    if kind == "greedy":
        params = [SamplingParams(temperature=0, max_tokens=6 + 2 * i) for i in range(n)]
    else:
        params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=100 + i, max_tokens=6 + 2 * i)
                  for i in range(n)]
    return prompts, params


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_graph_runner_equals_eager(model, n, kind):
    prompts, params = requests(n, kind)
    eager = drain(make_engine(model, False), prompts, params)
    engine = make_engine(model, True)
    graph = drain(engine, prompts, params)
    assert graph == eager
    assert engine.runner.graph_steps > 0
    assert bucket_for(n) in engine.runner.graphs.batch_buckets  # the padded bucket of the first decode step ran
    assert all(g.graph is None for g in engine.runner.graphs.graphs.values())  # CPU: nothing captured


def test_scratch_is_reserved_and_never_handed_out(model):
    engine = make_engine(model, True, max_num_seqs=4)
    g = engine.runner.graphs
    assert (g.scratch_block, g.scratch_slot) == (engine.num_blocks, 4)
    assert engine.cache.num_blocks == engine.num_blocks + 1 and engine.cache.num_state_slots == 4 + 1
    assert engine.scheduler.blocks.num_blocks == engine.num_blocks and engine.scheduler.slots.num_slots == 4
    seen = []

    def check(e):
        for r in e.requests.values():
            assert g.scratch_block not in r.block_table and r.state_slot != g.scratch_slot
            seen.append(r.state_slot)

    prompts, params = requests(5, "greedy")  # 5 requests on 4 slots: slots are reused
    drain(engine, prompts, params, on_step=check)
    assert seen and engine.runner.graph_steps > 0


def logits_of(model, prompt, buckets) -> list[torch.Tensor]:
    """The graph-path logits of every decode step of one greedy request run alone."""
    engine = make_engine(model, True, buckets=buckets)
    graphs = engine.runner.graphs
    got = []
    run = graphs.run

    def recording(*args, **kwargs):
        out = run(*args, **kwargs)
        got.append(out)
        return out

    graphs.run = recording
    drain(engine, [prompt], [SamplingParams(temperature=0, max_tokens=8)])
    assert graphs.batch_buckets == set(buckets)
    return got


def test_real_row_logits_do_not_depend_on_bucket(model):
    prompt = random_prompt(19, seed=7)
    alone = logits_of(model, prompt, (1,))
    padded = logits_of(model, prompt, (8,))
    assert len(alone) == len(padded) == 7
    for a, p in zip(alone, padded):
        assert a.shape == p.shape == (1, model.config.vocab_size)
        assert torch.equal(a, p)


def filled_cache(model, blocks: int, slots: int):
    cache = model.make_cache(blocks, BS, slots)
    g = torch.Generator().manual_seed(0)
    for pool in (cache.k, cache.v, cache.conv, cache.ssm):
        for t in pool.values():
            t.copy_(torch.randn(t.shape, generator=g))
    return cache


def changed(before, after) -> dict[str, set]:
    """Which (block, offset) KV entries and which state slots differ."""
    kv, st = set(), set()
    for name in ("k", "v"):
        for layer, t in getattr(after, name).items():
            diff = (t != getattr(before, name)[layer]).flatten(2).any(-1)  # [blocks, block_size]
            kv.update(map(tuple, diff.nonzero().tolist()))
    for name in ("conv", "ssm"):
        for layer, t in getattr(after, name).items():
            diff = (t != getattr(before, name)[layer]).flatten(1).any(-1)  # [slots]
            st.update(diff.nonzero().flatten().tolist())
    return {"kv": kv, "state": st}


def clone_cache(cache) -> SimpleNamespace:
    return SimpleNamespace(**{n: {i: t.clone() for i, t in getattr(cache, n).items()} for n in ("k", "v", "conv", "ssm")})


@torch.inference_mode()
def test_padding_rows_write_only_scratch(model):
    """One real row (slot 1, blocks [2, 0], token at cache index 21) padded into bucket 8: only its own state slot
    and KV entry change, plus the scratch slot 3 and scratch block 4 (offset 0)."""
    cache = filled_cache(model, blocks=5, slots=4)
    graphs = DecodeGraphs(model, cache, scratch_slot=3, scratch_block=4, max_blocks=4, buckets=(8,))
    before = clone_cache(cache)
    logits = graphs.run([5], [21], [[2, 0]], [1])
    assert logits.shape == (1, model.config.vocab_size) and torch.isfinite(logits).all()
    assert changed(before, cache) == {"kv": {(0, 21 - BS), (4, 0)}, "state": {1, 3}}


@torch.inference_mode()
def test_capture_warmup_runs_on_scratch_only(model, monkeypatch):
    """The capture's warm-up writes state: when a bucket is first used it must run with every row on the scratch
    slot/block. On CPU the capture is replaced by its eager warm-up step."""
    cache = filled_cache(model, blocks=5, slots=4)
    graphs = DecodeGraphs(model, cache, scratch_slot=3, scratch_block=4, max_blocks=4, buckets=(4,))
    graphs.capturable = True
    writes = {}

    def fake_capture(self, warmup=2, pool=None):
        before = clone_cache(cache)
        self.replay()  # graph is None: the eager step the warm-up would run
        writes.update(changed(before, cache))

    monkeypatch.setattr(DecodeGraph, "capture", fake_capture)
    monkeypatch.setattr(cuda_graph.torch.cuda, "graph_pool_handle", lambda: None)
    graphs.run([5, 6], [21, 3], [[2, 0], [1]], [1, 0])
    assert writes == {"kv": {(4, 0)}, "state": {3}}


def test_fallbacks_run_eagerly(model):
    prompt = random_prompt(10, seed=1)
    # The prompt (one chunk) goes through a prefill graph and samples the first token; the 3 decode steps after it
    # run through the decode graphs.
    engine = make_engine(model, True)
    drain(engine, [prompt], [SamplingParams(temperature=0, max_tokens=4)])
    runner = engine.runner
    assert (runner.eager_steps, runner.prefill_graph_steps, runner.graph_steps) == (0, 1, 3)
    assert set(runner.prefill_graphs.graphs) == {(1, 10)}
    # logits_only: prompt steps only, never a graph.
    engine = make_engine(model, True)
    engine.add_request(prompt, logits_only=True)
    while engine.has_unfinished():
        engine.step()
    assert engine.runner.graph_steps == 0 and engine.runner.eager_steps >= 1
    # More sequences than the largest bucket: eager.
    engine = make_engine(model, True, buckets=(1, 2))
    prompts, params = requests(3, "greedy")
    drain(engine, prompts, params)
    # max_tokens 6, 8, 10: one prefill step (three chunks of unequal lengths: a prefill graph each), 5 decode steps
    # at B = 3 (eager), 2 at B = 2 and 2 at B = 1 (graphs).
    assert (engine.runner.eager_steps, engine.runner.prefill_graph_steps, engine.runner.graph_steps) == (5, 3, 4)
    assert engine.runner.graphs.batch_buckets == {1, 2}
    # cuda_graphs on CPU without the test flag: everything eager, nothing built.
    engine = LLMEngine(model, None, [], EngineConfig(num_blocks=64, max_model_len=256, cuda_graphs=True))
    drain(engine, [prompt], [SamplingParams(temperature=0, max_tokens=4)])
    assert engine.runner.graph_steps == 0 and not engine.runner.graphs.graphs


def test_graphs_default_follows_the_device(model):
    """EngineConfig().cuda_graphs is None: graphs on a CUDA device, none on CPU (no scratch slot or block reserved),
    and the caller's config object is not modified."""
    cfg = EngineConfig(num_blocks=64, max_model_len=256)
    engine = LLMEngine(model, None, [], cfg)
    assert cfg.cuda_graphs is None and engine.config.cuda_graphs is False and engine.runner.graphs is None
    assert engine.cache.num_blocks == 64


def test_decode_with_logits_only_neighbour_keeps_its_graph(model):
    """A step that decodes one request and prefills a logits_only request's prompt chunk runs in two parts: the
    decode row through its graph (the kernels it always takes), the chunk eagerly (logits at every position)."""
    engine = make_engine(model, True, max_num_batched_tokens=16, block_size=4)
    gen = engine.add_request(random_prompt(6, seed=2), SamplingParams(temperature=0, max_tokens=12))
    engine.step()  # the prefill
    engine.add_request(random_prompt(40, seed=3), logits_only=True)
    graph_before, eager_before = engine.runner.graph_steps, engine.runner.eager_steps
    engine.step()  # decode of `gen` + a chunk of the logits_only prompt
    assert (engine.runner.graph_steps, engine.runner.eager_steps) == (graph_before + 1, eager_before + 1)
    while engine.has_unfinished():
        engine.step()
    assert gen not in engine.requests


def _fast_path_child() -> None:
    """Child under TRITON_INTERPRET=1 + DELTASERVE_FAST_INTERPRET=1: the padded step on the Triton kernels."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.model import fast

    model = tiny_model(moe=True, seed=3).to(torch.bfloat16)
    assert fast.enabled(torch.empty(1, dtype=torch.bfloat16))
    rows = ([5, 7], [21, 3], [[2, 0], [1]], [1, 0])  # two real rows: (token, cache index, blocks, state slot)
    out = {}
    with torch.inference_mode():
        for bucket in (2, 8):
            cache = filled_cache(model, blocks=5, slots=4)
            before = clone_cache(cache)
            out[bucket] = DecodeGraphs(model, cache, 3, 4, max_blocks=4, buckets=(bucket,)).run(*rows)
            want = {"kv": {(0, 21 - BS), (1, 3)}, "state": {0, 1}}
            if bucket > 2:
                want = {"kv": want["kv"] | {(4, 0)}, "state": want["state"] | {3}}
            assert changed(before, cache) == want, (bucket, changed(before, cache))
        cache = filled_cache(model, blocks=5, slots=4)
        out["eager"] = model(ForwardBatch.build([[5], [7]], *rows[1:], BS), cache)  # the eager runner's batch
    assert torch.isfinite(out[2]).all()
    assert torch.equal(out[2], out[8]) and torch.equal(out[2], out["eager"])
    print("FAST-PATH-OK")


def test_padded_step_on_fast_path_interpreted():
    """Fast path: a real row's logits are bit-identical unpadded (bucket 2), padded (bucket 8) and in the eager
    runner's batch; the padding rows write only the scratch slot/block."""
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "FAST-PATH-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _fast_path_child()


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_prefill_graph_runner_equals_eager(model, kind):
    """Prefill chunks go through PrefillGraphs (here their eager replay from the static buffers): prompts of 2-3
    chunks of 32 tokens plus a remainder, at depths 0, 32, 64; the same tokens as the eager engine, alone and
    together (chunks of unequal lengths: a graph each)."""
    prompts = [random_prompt(32 * 2 + 5, seed=7), random_prompt(32 * 3, seed=8)]
    if kind == "greedy":
        params = [SamplingParams(temperature=0, max_tokens=5) for _ in prompts]
    else:
        params = [SamplingParams(temperature=1.0, top_p=0.9, seed=40 + i, max_tokens=5) for i in range(2)]
    for batch in ([0], [1], [0, 1]):
        ps, pp = [prompts[i] for i in batch], [params[i] for i in batch]
        eager = drain(make_engine(model, False, max_num_batched_tokens=32), ps, pp)
        engine = make_engine(model, True, max_num_batched_tokens=32)
        assert drain(engine, ps, pp) == eager
        graphs = engine.runner.prefill_graphs.graphs
        assert engine.runner.prefill_graph_steps > 0 and graphs and all(b == 1 or b * n == 32 for b, n in graphs)


def test_prefill_graph_runner_serves_equal_chunks_of_several_sequences(model):
    """Three prompts of 16 tokens arriving together with max_num_batched_tokens = 48: their one prefill step is
    three chunks of 16 (the (3, 16) graph: here its eager replay), then a step of two of them (unequal lengths:
    eager); the same tokens as the eager engine, greedy and seeded."""
    prompts = [random_prompt(16, seed=20 + i) for i in range(3)]
    for params in ([SamplingParams(temperature=0, max_tokens=4) for _ in prompts],
                   [SamplingParams(temperature=1.0, top_k=5, seed=3 + i, max_tokens=4) for i in range(3)]):
        eager = drain(make_engine(model, False, max_num_batched_tokens=48), prompts, params)
        engine = make_engine(model, True, max_num_batched_tokens=48)
        assert drain(engine, prompts, params) == eager
        assert (3, 16) in engine.runner.prefill_graphs.graphs and engine.runner.prefill_graph_steps >= 1


def test_prefill_graph_load_derives_positions_and_slots(model):
    from deltaserve.engine.cuda_graph import PrefillGraph

    cache = model.make_cache(8, BS, 2, torch.bfloat16)
    g = PrefillGraph(model, cache, 20, max_blocks=4)
    g.load(list(range(20)), 28, [5, 2, 7], 1)  # tokens 28..47: blocks 1 (12..15 of block 2) and 2 (block 7)
    assert g.positions.tolist() == list(range(28, 48))
    assert g.slot_mapping.tolist() == [2 * BS + p % BS for p in range(28, 32)] + [7 * BS + p % BS for p in range(32, 48)]
    assert g.block_tables.tolist() == [[5, 2, 7, -1]] and g.context_lens.tolist() == [28]
    assert g.state_slots.tolist() == [1] and g.fb.context_lens_cpu == [28]
    with pytest.raises(ValueError, match="loaded with 3"):
        g.load([1, 2, 3], 0, [0], 0)
    with pytest.raises(ValueError, match="exceeds its static 4"):
        g.load(list(range(20)), 0, [0, 1, 2, 3, 4], 0)
    with pytest.raises(ValueError, match="3 blocks does not cover its depth 29 \\+ 20 tokens"):
        g.load(list(range(20)), 29, [5, 2, 7], 0)  # token 48 would need a fourth block
    g.load(list(range(20, 40)), 0, [3, 1], 0)  # a second load replaces every field of the first
    assert g.input_ids.tolist() == list(range(20, 40)) and g.positions.tolist() == list(range(20))
    assert g.slot_mapping.tolist() == [3 * BS + p for p in range(16)] + [1 * BS + p - 16 for p in range(16, 20)]
    assert g.block_tables.tolist() == [[3, 1, -1, -1]] and g.context_lens.tolist() == [0]
    two = PrefillGraph(model, cache, 6, max_blocks=3, batch=2)  # sequences at depths 14 and 0
    two.load_batch([list(range(6)), list(range(10, 16))], [14, 0], [[3, 4], [6]], [1, 0])
    assert two.positions.tolist() == list(range(14, 20)) + list(range(6))
    assert two.slot_mapping.tolist() == [3 * BS + p for p in (14, 15)] + [4 * BS + p - 16 for p in range(16, 20)] + \
        [6 * BS + p for p in range(6)]
    assert two.input_ids.tolist() == list(range(6)) + list(range(10, 16))
    assert two.fb.cu_seqlens.tolist() == [0, 6, 12] and two.fb.logits_indices.tolist() == [5, 11]
    assert two.state_slots.tolist() == [1, 0] and two.fb.context_lens_cpu == [14, 0]
    with pytest.raises(ValueError, match="sequence 1 loaded with 5"):
        two.load_batch([list(range(6)), list(range(5))], [0, 0], [[0], [1]], [0, 1])
    with pytest.raises(ValueError, match="for 2 sequences loaded with 1"):
        two.load_batch([list(range(6))], [0], [[0]], [0])


def test_warm_and_capture_order(monkeypatch):
    """The capture sequence both graph kinds share (cuda_graph.warm_and_capture), on CPU with the CUDA stream and
    graph calls recorded instead of run: the caller's state restored before every warm-up run, before the capture
    and after it; the warm-up on the side stream, the capture in the graph with the given pool."""
    events = []

    class FakeStream:
        def wait_stream(self, other):
            events.append("wait")

    class Ctx:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(f"enter {self.name}")

        def __exit__(self, *exc):
            events.append(f"exit {self.name}")

    cuda = cuda_graph.torch.cuda
    monkeypatch.setattr(cuda, "Stream", FakeStream)
    monkeypatch.setattr(cuda, "current_stream", FakeStream)
    monkeypatch.setattr(cuda, "stream", lambda s: Ctx("side stream"))
    monkeypatch.setattr(cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(cuda, "graph", lambda g, pool=None: Ctx(f"capture {g} pool={pool}"))
    runs = iter(range(10))

    def forward():
        events.append("forward")
        return next(runs)

    graph, out = cuda_graph.warm_and_capture(forward, lambda: events.append("restore"), 2, pool="p")
    assert (graph, out) == ("graph", 2)
    assert events == ["wait", "enter side stream", "restore", "forward", "restore", "forward", "exit side stream",
                      "wait", "restore", "enter capture graph pool=p", "forward", "exit capture graph pool=p",
                      "restore"]


def test_activation_dtype_of_a_quantised_model(tmp_path):
    """capturable() takes the activation dtype from the first floating-point parameter: an MLX q4 checkpoint's
    first parameter is its packed embedding (uint32), which made the engine run quantised models without graphs."""
    from model_helpers import make_hf_model, ours_from_checkpoint

    from deltaserve.weights.loader import load_checkpoint
    from deltaserve.weights.quantizer import quantize_checkpoint

    ours_from_checkpoint(make_hf_model(True, seed=0, vocab_size=32), tmp_path / "bf16")
    q4 = quantize_checkpoint(tmp_path / "bf16", tmp_path / "q4", 4, 32, progress=False)
    model = load_checkpoint(q4, dtype=torch.bfloat16, progress=False).model
    assert not next(model.parameters()).is_floating_point()  # the packed embedding comes first
    p = cuda_graph.activation_param(model)
    assert p is not None and p.dtype == torch.bfloat16
    assert not cuda_graph.capturable(model)  # on the CPU: the reference path, never captured


def test_bench_prefill_of_several_prompts_runs_their_prefill_graph(model, monkeypatch):
    """`deltaserve bench`'s pp of B prompts goes through PrefillGraph(batch=B) (here its eager replay on CPU), loaded
    with every prompt's tokens, depth, table and slot; the eager form (--no-graph) does not."""
    from deltaserve.bench import main as bench

    loads = []
    real = cuda_graph.PrefillGraph.load_batch

    def recording(self, tokens, depths, tables, slots):
        loads.append((self.batch, [len(t) for t in tokens], list(depths), list(slots)))
        return real(self, tokens, depths, tables, slots)

    monkeypatch.setattr(cuda_graph.PrefillGraph, "load_batch", recording)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)  # the bench's timer, on CPU
    streams = bench.Streams(model, model.config, 3, 40)
    assert len(bench.bench_prefill(streams, 8, 16, 2, graph=True)) == 2
    assert loads and all(entry == (3, [8, 8, 8], [16, 16, 16], [0, 1, 2]) for entry in loads)
    loads.clear()
    bench.bench_prefill(streams, 8, 16, 1, graph=False)
    assert not loads
