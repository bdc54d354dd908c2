"""`deltaserve bench --engine --speculative-tokens K,.. --acceptance A,..`: decode speed through the engine with
speculative decoding at a SIMULATED acceptance rate, next to drafting off, in one run.

Acceptance cannot be measured on random weights (the MTP head's drafts would almost never be right), so each
configuration runs twice through the engine (engine_bench.decode_run's requests, depth laid down synthetically):
  1. drafting off: the reply's tokens are recorded (and timed: the baseline);
  2. drafting on with k drafts a step: the MTP head runs as it would (its compute, KV and read-back are all paid),
     then each of its drafts is replaced by the recorded token at that position with probability a, and by a wrong
     token otherwise (`SimulatedAcceptance`); the verify, sampling, acceptance and commit are the real ones.
The drafted replies must equal the recorded ones (the exactness contract; the record says whether they did), and
the records say "simulated acceptance".
"""

from __future__ import annotations

import random
import time

import torch

from ..engine.engine import EngineConfig, LLMEngine
from . import engine_bench as eb


class SimulatedAcceptance:
    """A draft source around another (the MTP head): the inner source runs as usual (its cost is kept), then draft
    i of a request becomes the recorded reply's token at its position with probability `rate`, else a wrong one."""

    def __init__(self, inner, recorded: dict[str, list[int]], rate: float, vocab: int, seed: int = 0):
        self.inner, self.recorded, self.rate, self.vocab = inner, recorded, rate, vocab
        self.needs_hidden = inner.needs_hidden
        self.drafts_in_graph = getattr(inner, "drafts_in_graph", False)  # the head runs inside the step graphs
        self.rng = random.Random(seed)

    def propose(self, rows) -> dict[str, list[int]]:
        self.inner.propose(rows)  # the head's compute, paid; its drafts are replaced
        return self.override(rows, {})

    def override(self, rows, drafts) -> dict[str, list[int]]:
        """The drafts of a step graph's head (computed and paid inside the graph), replaced."""
        return recorded_drafts(rows, self.recorded, self.vocab, lambda i: self.rng.random() < self.rate)


def recorded_drafts(rows, recorded: dict[str, list[int]], vocab: int, right) -> dict[str, list[int]]:
    """For each drafting row (a request at its frontier with k > 0): after the token at output index o, the
    recorded reply's tokens o+1 .. o+k, draft i kept as recorded where right(i), else changed (so it is rejected).
    `recorded` maps a request id to its undrafted output tokens."""
    out = {}
    for row in rows:
        if not row.frontier or row.k == 0:
            continue
        req = row.request
        o = row.start + row.next_tokens.numel() - req.num_prompt_tokens  # output index of the newest token
        future = recorded[req.request_id][o + 1: o + 1 + row.k]
        drafts = []
        for i in range(row.k):
            true = future[i] if i < len(future) else 0
            drafts.append(true if right(i) else (true + 1) % vocab)
        out[req.request_id] = drafts
    return out


def plan_for(batch: int, k: int, decode_gemv: str = "auto", moe_kernels: str = "mma"):
    """The kernel plan of an engine for `batch` streams drafting k a step (model/plan.resolve_plan): a drafting
    deployment sizes its GEMVs by its verify rows, so drafting on and off may run different plans; replies are
    compared with drafting off under the drafting engine's plan (a plan may change last bits, drafting never)."""
    from ..model.plan import resolve_plan

    return resolve_plan(decode_gemv, moe_kernels, batch, k)


def max_len(depth: int, n: int) -> int:
    """The context both engines of a comparison are made for (room for the drafts past the last token)."""
    return depth + n + 16


def make_spec_engine(model, tokenizer, batch: int, max_len: int, k: int, cuda_graphs: bool | None = None,
                     decode_gemv: str = "auto", moe_kernels: str = "mma") -> LLMEngine:
    blocks = batch * -(-max_len // eb.BLOCK_SIZE)
    cfg = EngineConfig(block_size=eb.BLOCK_SIZE, num_blocks=blocks, max_num_seqs=batch, max_model_len=max_len,
                       enable_prefix_caching=False, speculative_tokens=k, cuda_graphs=cuda_graphs,
                       decode_gemv=decode_gemv, moe_kernels=moe_kernels)
    engine = LLMEngine(model, tokenizer, [], cfg)
    engine.warm_up()  # its step and decode graphs, before the timing
    return engine


def spec_run(model, tokenizer, batch: int, depth: int, n: int, sampling: str, vocab: int, k: int, rate: float,
             recorded: dict[str, list[int]], decode_gemv: str = "auto", moe_kernels: str = "mma") -> dict:
    """engine_bench.decode_run's workload with k drafts a step at simulated acceptance `rate`; adds whether the
    replies equal `recorded` (drafting off under the same kernel plan: plan_for) and the engine's mean acceptance
    length and plan."""
    engine = make_spec_engine(model, tokenizer, batch, max_len(depth, n), k, decode_gemv=decode_gemv,
                              moe_kernels=moe_kernels)
    engine.spec.source = SimulatedAcceptance(engine.spec.source, recorded, rate, vocab, seed=depth + batch)
    t0 = time.perf_counter()
    result = eb.decode_run(engine, batch, depth, n, sampling, vocab)
    result["seconds"] = time.perf_counter() - t0
    result["exact"] = result["outputs"] == recorded
    result["mean_acceptance_length"] = engine.spec_stats.mean_acceptance_length
    result["graph_steps"], result["eager_steps"] = engine.spec.graph_steps, engine.spec.eager_steps
    result["followed_steps"] = engine.spec.followed_steps
    result["plan"] = engine.plan
    del engine
    torch.cuda.empty_cache()
    return result
