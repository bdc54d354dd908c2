"""`deltaserve bench --engine`: decode speed through the engine (what `LLM.generate` and the server run), next to
the decode graph's back-to-back replay of the same model in the same run.

  deltaserve bench --engine --preset qwen3.6-35b-a3b --quant q4 -n 128 -d 512,32768 -b 1,8,64

For each B and depth d: an engine deployed for B streams (max_num_seqs = B, so it picks the deployment's decode
GEMV as `bench` does) gets B requests of d + 1 prompt tokens; the first d are laid down synthetically (random KV and
DeltaNet state, as `bench` does), the last runs as a one-token prefill that samples the first output; then the
requests decode n tokens each through `LLMEngine.step` (the loop of LLM.generate: scheduling, the device step,
sampling, read-back, detokenisation with the preset's tokenizer, stop checks). tok/s counts the tokens read back
from the first decode step to the last; host ms/step is the time a step spends on the host (its wall time less the
time it waited for the device). Sampling: greedy (temperature 0) and default (SamplingParams(): temperature 1).

--mixed: B streams decode while prompts of --mixed-prompt MIN,MAX tokens arrive at --mixed-rate per second (each
generating 8 tokens); the streams' decode tok/s against the same streams alone.

--prefix P1,P2,...: time to first token of a request of P cached + 64 new tokens against the same kind of request
cold, both through the engine (the prefix cache), with the cached request's tokens checked against the same request
computed without the cache; and one DeltaNet snapshot's bytes and copy time.
"""

from __future__ import annotations

import random
import time

import torch

from ..engine.engine import EngineConfig, LLMEngine
from ..engine.request import RequestStatus
from ..engine.sampling_params import SamplingParams

BLOCK_SIZE = 64
SAMPLING = {"greedy": dict(temperature=0.0), "default": {}}


def make_engine(model, tokenizer, batch: int, max_len: int, extra_seqs: int = 0, caching: bool = True,
                decode_gemv: str = "auto", moe_kernels: str = "mma") -> LLMEngine:
    """An engine for `batch` streams (+ extra_seqs), its kernel plan from decode_gemv / moe_kernels (EngineConfig's:
    "auto" resolves it for the engine's own size, as a user's engine would)."""
    blocks = (batch + extra_seqs) * -(-max_len // BLOCK_SIZE)
    cfg = EngineConfig(block_size=BLOCK_SIZE, num_blocks=blocks, max_num_seqs=batch + extra_seqs,
                       max_model_len=max_len, cuda_graphs=True, enable_prefix_caching=caching,
                       decode_gemv=decode_gemv, moe_kernels=moe_kernels)
    return LLMEngine(model, tokenizer, [], cfg)


def lay_down_depth(engine: LLMEngine, depth: int) -> None:
    """Admit every waiting request with its first `depth` prompt tokens counted as computed, their KV and DeltaNet
    state random (as `bench`'s Streams): the timed phase reads the same bytes as after a real prefill."""
    sched = engine.scheduler
    while sched.waiting:
        req = sched.waiting.popleft()
        req.status = RequestStatus.RUNNING
        req.state_slot = sched.slots.allocate()
        req.slot_epoch = next(sched._epochs)
        sched.running.append(req)
        sched.blocks.may_append(req.block_table, depth)
        req.num_computed_tokens = depth
    # Random values per request, layer after layer, whatever the pools' sizes (an engine with graphs has a scratch
    # block and slot more, one drafting with the MTP head a KV layer more): the same requests find the same values,
    # so replies can be compared across engines (bench/spec_bench.py). The MTP head's KV comes last.
    gen = torch.Generator(device=engine.device).manual_seed(1)
    cache = engine.cache
    main = [layer for layer in cache.k if layer < engine.model.config.num_hidden_layers]
    extra = [layer for layer in cache.k if layer not in main]

    def fill(pool, index, scale=1.0):
        shape = (index.numel(), *pool.shape[1:])
        pool[index] = (torch.randn(shape, generator=gen, device=pool.device) * scale).to(pool.dtype)

    for req in sched.running:
        blocks = torch.tensor(req.block_table, dtype=torch.int64, device=engine.device)
        slot = torch.tensor([req.state_slot], dtype=torch.int64, device=engine.device)
        for layer in main:
            fill(cache.k[layer], blocks)
            fill(cache.v[layer], blocks)
        for layer in cache.conv:
            fill(cache.conv[layer], slot)
            fill(cache.ssm[layer], slot, 0.1)
    for req in sched.running:  # after every request's own values
        blocks = torch.tensor(req.block_table, dtype=torch.int64, device=engine.device)
        for layer in extra:
            fill(cache.k[layer], blocks)
            fill(cache.v[layer], blocks)


class StepTimer:
    """Wraps the engine's step: wall time per step and the time it waited for the device (StepHandle.result)."""

    def __init__(self, engine: LLMEngine):
        self.engine, self.waited, self.walls = engine, 0.0, []
        runner = engine.runner
        launch = runner.launch

        def timed_launch(out, before_sampling=None):
            handle = launch(out, before_sampling)
            result = handle.result

            def timed_result():
                t0 = time.perf_counter()
                if handle.event is not None:
                    handle.event.synchronize()
                self.waited += time.perf_counter() - t0
                return result()

            handle.result = timed_result
            return handle

        runner.launch = timed_launch

    def step(self):
        t0 = time.perf_counter()
        outs = self.engine.step()
        self.walls.append(time.perf_counter() - t0)
        return outs


def decode_run(engine: LLMEngine, batch: int, depth: int, n: int, sampling: str, vocab: int) -> dict:
    gen = torch.Generator().manual_seed(depth + batch)
    params = SamplingParams(max_tokens=n, ignore_eos=True, seed=7, **SAMPLING[sampling])
    ids = [engine.add_request(torch.randint(0, vocab, (depth + 1,), generator=gen).tolist(), params)
           for _ in range(batch)]
    lay_down_depth(engine, depth)
    timer = StepTimer(engine)
    produced, t_first = 0, None
    outputs = {i: [] for i in ids}
    while engine.has_unfinished():
        outs = timer.step()
        for o in outs:
            outputs[o.request_id] += o.new_token_ids
        if t_first is None:
            if any(o.new_token_ids for o in outs):  # the prefill step's first tokens are read back
                t_first, timer.waited, timer.walls = time.perf_counter(), 0.0, []
            continue
        produced += sum(len(o.new_token_ids) for o in outs)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t_first
    steps = len(timer.walls)
    host = (sum(timer.walls) - timer.waited) / max(steps, 1)
    assert not engine.requests and all(i not in engine.requests for i in ids)
    return {"tok_s": produced / seconds, "host_ms": host * 1e3, "steps": steps, "tokens": produced,
            "outputs": outputs}


def mixed_run(model, tokenizer, batch: int, depth: int, seconds: float, rate: float, lengths: tuple[int, int],
              vocab: int) -> dict:
    """The B streams' decode tok/s over `seconds`, with prompts arriving at `rate` per second (0: none)."""
    max_len = min(max(depth + 4096, lengths[1] + 16), model.config.max_position_embeddings)
    engine = make_engine(model, tokenizer, batch, max_len, extra_seqs=8)
    warm = engine.warm_up() if rate else 0.0
    gen = torch.Generator().manual_seed(5)
    long = SamplingParams(max_tokens=1 << 30, ignore_eos=True, seed=3)
    streams = {engine.add_request(torch.randint(0, vocab, (depth + 1,), generator=gen).tolist(),
                                  long.clone(max_tokens=min(4000, engine.max_model_len - depth - 2)))
               for _ in range(batch)}
    lay_down_depth(engine, depth)
    for _ in range(3):  # past the prefill step and the first decode graph captures
        engine.step()
    rng = random.Random(0)
    arrivals = 0
    next_arrival = time.perf_counter() + (1 / rate if rate else float("inf"))
    produced, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        now = time.perf_counter()
        if now >= next_arrival and len(engine.scheduler.waiting) < 4:
            engine.add_request(torch.randint(0, vocab, (rng.randint(*lengths),), generator=gen).tolist(),
                               SamplingParams(max_tokens=8, ignore_eos=True, seed=arrivals))
            arrivals += 1
            next_arrival = now + rng.expovariate(rate)
        produced += sum(len(o.new_token_ids) for o in engine.step() if o.request_id in streams)
    elapsed = time.perf_counter() - t0
    for rid in list(engine.requests):
        engine.abort(rid)
    return {"tok_s": produced / elapsed, "arrivals": arrivals, "warm_s": warm,
            "prefill_graphs": len(engine.runner.prefill_graphs.graphs) if engine.runner.prefill_graphs else 0}


def ttft(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> tuple[float, object]:
    """Seconds from add_request to the request's first token read back through the engine loop; its final output."""
    t0 = time.perf_counter()
    rid = engine.add_request(prompt, params)
    first, final = None, None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.new_token_ids and first is None:
                first = time.perf_counter() - t0
            if out.request_id == rid and out.finished:
                final = out
    return first, final


def prefix_run(model, tokenizer, cached_tokens: int, new_tokens: int, vocab: int) -> dict:
    """Time to first token of a request whose first `cached_tokens` are a cached prefix (a previous request's whole
    prompt: its last aligned seam) against the same kind of request cold; the cached request's tokens against the
    same request computed without the cache; the cost of one DeltaNet snapshot."""
    max_len = cached_tokens + new_tokens + 64
    engine = make_engine(model, tokenizer, 1, max_len)
    gen = torch.Generator().manual_seed(cached_tokens)
    rand = lambda n: torch.randint(0, vocab, (n,), generator=gen).tolist()  # noqa: E731
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ttft(engine, rand(cached_tokens + new_tokens), params)  # warm-up: graphs of these chunk lengths captured
    cold, _ = ttft(engine, rand(cached_tokens + new_tokens), params)  # a prefix never seen
    prefix = rand(cached_tokens)
    ttft(engine, prefix, params)  # the prefix alone: snapshot at its end
    prompt = prefix + rand(new_tokens)
    hot, out = ttft(engine, prompt, params)
    assert out.metrics.num_cached_tokens == cached_tokens, out.metrics.num_cached_tokens
    _, want = ttft(make_engine(model, tokenizer, 1, max_len, caching=False), prompt, params)
    per = engine._spec().bytes_per_state_slot
    seconds = _snapshot_seconds(engine)
    return {"cold_ms": cold * 1e3, "cached_ms": hot * 1e3, "same_tokens": out.token_ids == want.token_ids,
            "snapshot_mib": per / 2**20, "snapshot_ms": seconds * 1e3}


def _snapshot_seconds(engine: LLMEngine, reps: int = 20) -> float:
    """Device time of one state slot -> snapshot copy."""
    cache = engine.cache
    if engine.device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            cache.save_state(0, 0)
        return (time.perf_counter() - t0) / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cache.save_state(0, 0)
    start.record()
    for _ in range(reps):
        cache.save_state(0, 0)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps
