"""Prometheus metrics under `deltaserve:` names, after vLLM's `vllm:` ones, served at GET /metrics.

Timings are taken on the engine thread (EngineObserver): a request's clock starts when its handler submits it, its
first token is seen at the end of the step that sampled it, and every later token's gap is one inter-token latency.
Each server has its own registry (several can live in one process: the tests).
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine.async_engine import EngineStats
from ..engine.outputs import RequestOutput

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
            40.0, 80.0, 160.0)
_ITL = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
        0.4, 0.5, 0.75, 1.0, 2.5)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        lab = ["model_name"]
        r = self.registry

        def gauge(name, doc):
            return Gauge(f"deltaserve:{name}", doc, lab, registry=r).labels(model_name)

        def counter(name, doc, extra=()):
            c = Counter(f"deltaserve:{name}", doc, lab + list(extra), registry=r)
            return c if extra else c.labels(model_name)

        def hist(name, doc, buckets):
            return Histogram(f"deltaserve:{name}", doc, lab, buckets=buckets, registry=r).labels(model_name)

        self.model_name = model_name
        self.running = gauge("num_requests_running", "Requests in the running batch (holding a state slot).")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be admitted.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).")
        self.slot_usage = gauge("state_slot_usage_perc", "Fraction of DeltaNet state slots in use (1 = full).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.success = counter("request_success", "Requests finished, by finish reason.", ["finished_reason"])
        self.aborted = counter("num_aborted_requests", "Requests aborted (client gone, or cancelled).")
        self.rejected = counter("num_rejected_requests", "Requests refused because the waiting queue was full.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        # speculative decoding, vLLM's spec_decode_* counters
        self.spec_drafts = counter("spec_decode_num_drafts", "Drafting steps of requests (speculative decoding).")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.ttft = hist("time_to_first_token_seconds", "Time to first token (from submission).", _LATENCY)
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive output tokens.", _ITL)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency (from submission).", _LATENCY)
        self.queue = hist("request_queue_time_seconds", "Time from submission to first scheduling.", _LATENCY)
        self.req_prompt = hist("request_prompt_tokens", "Prompt tokens per finished request.", _TOKENS)
        self.req_generation = hist("request_generation_tokens", "Generated tokens per finished request.", _TOKENS)
        self._submitted: dict[str, float] = {}  # engine thread only, like everything below
        self._last_token: dict[str, float] = {}
        # counters fed from the engine's cumulative totals (EngineStats: prefix queries, hits, drafting steps,
        # drafted, accepted), and the totals already counted
        self._engine_totals = (self.prefix_queries, self.prefix_hits, self.spec_drafts, self.spec_draft_tokens,
                               self.spec_accepted)
        self._totals_seen = (0,) * len(self._engine_totals)

    content_type = CONTENT_TYPE_LATEST

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # ---- EngineObserver (engine thread) ------------------------------------------------------------------------
    def on_add(self, request_id: str, submitted: float, num_prompt_tokens: int) -> None:
        self._submitted[request_id] = submitted
        self.prompt_tokens.inc(num_prompt_tokens)

    def on_step(self, outputs: Sequence[RequestOutput], now: float, stats: EngineStats) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_usage.set(stats.kv_blocks_used / max(stats.kv_blocks_total, 1))
        self.slot_usage.set(stats.state_slots_used / max(stats.state_slots_total, 1))
        totals = (stats.prefix_queries, stats.prefix_hits, stats.spec_steps, stats.spec_drafted, stats.spec_accepted)
        for counter, total, before in zip(self._engine_totals, totals, self._totals_seen):
            if total > before:
                counter.inc(total - before)
        self._totals_seen = totals
        generated = 0
        for out in outputs:
            rid = out.request_id
            submitted = self._submitted.get(rid, now)
            n = len(out.new_token_ids)
            if n:
                generated += n
                last = self._last_token.get(rid)
                if last is None:
                    self.ttft.observe(now - submitted)
                    if out.metrics is not None and out.metrics.first_scheduled is not None:
                        self.queue.observe(max(out.metrics.first_scheduled - submitted, 0.0))
                else:
                    self.itl.observe((now - last) / n)
                self._last_token[rid] = now
            if out.finished:
                self.success.labels(self.model_name, out.finish_reason or "stop").inc()
                self.e2e.observe(now - submitted)
                self.req_prompt.observe(len(out.prompt_token_ids))
                self.req_generation.observe(len(out.token_ids))
                self._forget(rid)
        if generated:
            self.generation_tokens.inc(generated)

    def on_abort(self, request_id: str) -> None:
        self.aborted.inc()
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        self._submitted.pop(request_id, None)
        self._last_token.pop(request_id, None)
