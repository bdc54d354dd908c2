"""LLMEngine: add_request / step / has_unfinished. A step is schedule -> execute -> update.

  schedule  Scheduler picks tokens (decodes, prefill chunks, admissions) within the slot/token/memory budget
  execute   ModelRunner builds the ForwardBatch, runs the model, samples (pure function of logits, seed, position)
  update    the engine appends tokens, detokenises, checks stops, finishes requests (freeing blocks and slots)
            and returns one RequestOutput per request that made visible progress (streaming = these deltas)
"""

from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch
from tokenizers import Tokenizer

from ..model import fast
from ..model.cache import cache_spec, parse_kv_cache_dtype
from ..structured.matcher import COMPLETE, REJECTED
from ..model.plan import resolve_plan
from ..utils.memory import cache_budget_bytes
from . import cuda_graph
from .block_pool import BlockPool, StateSlotPool
from .cuda_graph import DEFAULT_BUCKETS, DecodeGraphs, PrefillGraphs
from .detokenizer import IncrementalDetokenizer
from . import multimodal
from .multimodal import ImageSupport
from .outputs import Logprob, RequestOutput
from .prefix_cache import ALIGN_TOKENS, PrefixCache
from .request import FinishReason, Request
from .runner import ModelRunner, StepHandle
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .spec_graph import SpecGraphs
from .speculative import MAX_VERIFY_ROWS, MTPDrafter, SpeculativeDecoder, check_speculative_tokens
from .structured import GRAMMAR_DEAD_END, StructuredOutputs

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass
class EngineConfig:
    block_size: int | None = None  # KV block tokens; None: 64 on CUDA (the decode kernels' split), 16 on the CPU
    num_blocks: int | None = None  # None: as many as cache_memory_bytes allows (capped at what can be used)
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: min(max_position_embeddings, 8192)
    cache_memory_bytes: int | None = None  # None: utils.memory.cache_budget_bytes(device)
    seed: int = 0  # seeds the engine RNG that gives unseeded requests their seed
    # Decode-only steps through per-bucket CUDA graphs (engine/cuda_graph.DecodeGraphs); reserves one scratch state
    # slot and one scratch KV block for the padding rows. None: on when the model sits on a CUDA device (graph ==
    # eager bit for bit: tests/gpu/test_engine_graph_gpu.py), like vLLM without --enforce-eager. With them, a step
    # that is one request's full prefill chunk (max_num_batched_tokens new tokens) replays that size's prefill graph
    # (engine/cuda_graph.PrefillGraphs: the same kernels without ~40 launches' worth of host time per layer).
    cuda_graphs: bool | None = None
    # K/V cache of the full-attention layers: "auto" (the activation dtype) or "fp8" (e4m3, one fp32 scale per
    # (token, KV head) row: half the bytes per token, kernels/attention/kv_fp8.py), like vLLM's --kv-cache-dtype
    kv_cache_dtype: str = "auto"
    # The decode GEMV family of the q4 linears (model/fast.py decode_gemv): "auto" picks it from the rows a decode
    # forward may carry, max_num_seqs x (1 + speculative_tokens) (model/plan.py decode_gemv_for_rows: the batch-1
    # "head" mode for 1-3 rows, the tensor-core "mma" mode from 4), or one of plan.DECODE_GEMV_MODES. Fixed for the
    # engine's life, so a request's bits never depend on how many others share its steps, nor on whether it drafts;
    # engines of other sizes (or other speculative_tokens) may differ in the last bits.
    decode_gemv: str = "auto"
    # Automatic prefix caching (engine/prefix_cache.py): full KV blocks shared between requests by a hash chain of
    # their tokens, plus DeltaNet state snapshots at chosen prompt seams, so a request whose prompt starts with a
    # cached prefix resumes after it, bit-identical to computing it (like vLLM's --enable-prefix-caching).
    enable_prefix_caching: bool = True
    # bytes for the DeltaNet snapshots (one is cache_spec().bytes_per_state_slot: ~60 MiB for 35B-A3B). None: 5% of
    # the cache memory budget, between 2 and 256 snapshots
    prefix_state_budget: int | None = None
    # long prompts also snapshot every this many tokens (a multiple of the 64-token alignment; None: never)
    prefix_snapshot_interval: int | None = 4096
    # The MoE blocks' kernel family for q4 experts (model/plan.py KernelPlan.moe): "mma" (tensor cores, every token
    # count) or "cuda" (CUDA-core decode kernels: 1.4% faster at batch 1, much slower prefill and batched decode).
    moe_kernels: str = "mma"
    # Speculative decoding with the checkpoint's MTP head (engine/speculative.py, docs/speculative.md): k = 1..4
    # drafts a step, verified in one forward; the reply is bit for bit the undrafted one. 0: off. Drafting steps
    # run through engine/spec_graph.SpecGraphs (with cuda_graphs) and are read back before the next is scheduled;
    # steps without drafts run as usual (decode graphs, one step ahead); prompt chunks run eagerly.
    speculative_tokens: int = 0
    # A request whose drafts were accepted less often than this (after speculative.PROBE_STEPS drafting steps)
    # stops drafting: below it a drafting step costs more than the tokens it gains. 0: never.
    speculative_min_acceptance: float = 0.25


class LLMEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None = None,
        eos_token_ids: Sequence[int] = (),
        config: EngineConfig | None = None,
        images: ImageSupport | None = None,  # the vision tower and image processor (None: text only)
        draft_source=None,  # speculative decoding's drafts (engine/speculative.DraftSource); None: the MTP head
    ):
        config = config or EngineConfig()
        spec_k = check_speculative_tokens(config.speculative_tokens)
        if spec_k and getattr(model, "mtp", None) is None and draft_source is None:
            raise ValueError("speculative_tokens > 0 needs the model's MTP head: this model has none (the checkpoint "
                             "lacks one, e.g. an mlx-community conversion, or it was loaded with mtp=False)")
        self.mtp_kv = bool(spec_k) and draft_source is None  # the MTP head drafts: its KV in the cache
        self.images = images
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        mcfg = model.config
        self.vocab_size = mcfg.vocab_size
        self.device = next(model.parameters()).device
        if config.cuda_graphs is None:
            config = replace(config, cuda_graphs=self.device.type == "cuda")
        if config.block_size is None:
            config = replace(config, block_size=64 if self.device.type == "cuda" else 16)
        self.config = config
        self.max_model_len = config.max_model_len or min(mcfg.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        if self.max_model_len > mcfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{mcfg.max_position_embeddings}"
            )
        self.kv_dtype = parse_kv_cache_dtype(config.kv_cache_dtype)
        # the kernel plan, resolved once and fixed on the model before any step or graph capture
        self.plan = resolve_plan(config.decode_gemv, config.moe_kernels, config.max_num_seqs, spec_k)
        self.decode_gemv = self.plan.decode_gemv
        fast.set_plan(model, self.plan)
        self.num_snapshots = self._num_snapshots() if config.enable_prefix_caching else 0
        self.num_blocks = config.num_blocks or self._auto_num_blocks()
        # With graphs the cache holds one more block and one more state slot than the pools hand out: ids
        # num_blocks and max_num_seqs are the padding rows' scratch, never owned by a request.
        extra = int(config.cuda_graphs)
        self.cache = model.make_cache(self.num_blocks + extra, config.block_size, config.max_num_seqs + extra,
                                      kv_dtype=self.kv_dtype, num_snapshots=self.num_snapshots,
                                      **({"mtp": True} if self.mtp_kv else {}))
        sched_cfg = SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        blocks = BlockPool(self.num_blocks, config.block_size)
        self.prefix_cache = None
        if config.enable_prefix_caching:
            interval = config.prefix_snapshot_interval
            align = math.lcm(config.block_size, ALIGN_TOKENS)
            if interval is not None and (interval <= 0 or interval % align):
                raise ValueError(f"EngineConfig.prefix_snapshot_interval must be a positive multiple of {align} "
                                 f"(lcm of block_size and {ALIGN_TOKENS}), found {interval}")
            salt = f"kv={self.kv_dtype or next(model.parameters()).dtype}".encode()
            self.prefix_cache = PrefixCache(blocks, self.num_snapshots, align, salt, interval)
        self.scheduler = Scheduler(sched_cfg, blocks, StateSlotPool(config.max_num_seqs), self.prefix_cache)
        graphs = prefill_graphs = spec_graphs = None
        if config.cuda_graphs:
            max_blocks = -(-self.max_model_len // config.block_size)
            buckets = tuple(sorted(set(DEFAULT_BUCKETS) | {1 << i for i in range(config.max_num_seqs.bit_length() + 1)
                                                           if 1 << i <= 2 * config.max_num_seqs}))
            scratch = (model, self.cache)
            if spec_k:  # drafting steps through SpecGraphs, which are the decode graphs too (one set of tables);
                # prompt chunks eagerly (the head reads their hidden states)
                graphs = spec_graphs = SpecGraphs(*scratch, spec_k, self.mtp_kv, config.max_num_seqs,
                                                  self.num_blocks, max_blocks, buckets, MAX_VERIFY_ROWS)
            else:
                graphs = DecodeGraphs(*scratch, config.max_num_seqs, self.num_blocks, max_blocks, buckets)
                prefill_graphs = PrefillGraphs(*scratch, (config.max_num_batched_tokens,), max_blocks)
        self.runner = ModelRunner(model, self.cache, self.device, graphs, prefill_graphs)
        self.spec = None
        if spec_k:
            def reserve(req, tokens) -> bool:  # a drafting step's KV rows past the scheduled ones, if blocks allow
                if not blocks.can_allocate(blocks.blocks_for(tokens) - len(req.block_table)):
                    return False
                blocks.may_append(req.block_table, tokens)
                return True

            source = draft_source or MTPDrafter(model, self.cache, config.block_size, self.device, reserve)
            self.spec = SpeculativeDecoder(model, self.cache, self.runner.sampler, self.device, spec_k, source,
                                           spec_graphs, reserve, config.speculative_min_acceptance)
            self.runner.spec = self.spec
        self.rng = random.Random(config.seed)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self._in_flight: tuple[SchedulerOutput, StepHandle] | None = None  # the launched step not yet read back
        self._drafting: tuple[SchedulerOutput, StepHandle] | None = None  # a drafting step launched, not read back
        self.structured = StructuredOutputs(tokenizer, self.vocab_size, self.eos_token_ids)  # grammars, lazily

    def _spec(self):
        dtype = cuda_graph.activation_param(self.model).dtype
        mtp = self.model.mtp.num_layers if self.mtp_kv else 0
        return cache_spec(self.model.config, self.config.block_size, dtype, self.kv_dtype, mtp_layers=mtp)

    @property
    def spec_stats(self):
        """Speculative decoding's totals (engine/speculative.SpecStats: drafted, accepted, mean acceptance length),
        None when the engine does not draft."""
        return self.spec.stats if self.spec is not None else None

    def _num_snapshots(self) -> int:
        """DeltaNet snapshots the prefix cache keeps: EngineConfig.prefix_state_budget bytes' worth, or by default
        5% of the cache budget, between 2 and 256."""
        per = self._spec().bytes_per_state_slot
        if per == 0:
            return 2
        budget = self.config.prefix_state_budget
        if budget is not None:
            if budget < 2 * per:
                raise ValueError(f"EngineConfig.prefix_state_budget {budget} bytes holds fewer than 2 DeltaNet "
                                 f"snapshots of {per} bytes")
            return budget // per
        auto = (self.config.cache_memory_bytes or cache_budget_bytes(self.device)) // 20
        return int(min(max(auto // per, 2), 256))

    def _auto_num_blocks(self) -> int:
        """Blocks from the memory budget (less the prefix cache's snapshots), capped at what max_num_seqs
        full-length requests could ever use."""
        cfg = self.config
        spec = self._spec()
        budget = (cfg.cache_memory_bytes or cache_budget_bytes(self.device)) - self.num_snapshots * spec.bytes_per_state_slot
        per_seq = -(-self.max_model_len // cfg.block_size)
        usable = cfg.max_num_seqs * per_seq
        if spec.bytes_per_block == 0:  # no full-attention layers: blocks cost nothing
            return usable
        extra = int(cfg.cuda_graphs)  # the graphs' scratch slot and block come out of the same budget
        fit = (budget - (cfg.max_num_seqs + extra) * spec.bytes_per_state_slot) // spec.bytes_per_block - extra
        if fit < per_seq:
            raise ValueError(
                f"cache budget {budget / 2**20:.0f} MiB holds {max(fit, 0)} KV blocks of {cfg.block_size} tokens "
                f"(+ {cfg.max_num_seqs} state slots); one max_model_len={self.max_model_len} request needs {per_seq}: "
                "lower max_model_len / max_num_seqs or pass num_blocks"
            )
        return int(min(fit, usable))

    def warm_up(self) -> float:
        """Capture the CUDA graphs a workload will meet before it arrives (as vLLM captures at start-up): one
        throwaway prompt per prefill chunk length a step can cut (the aligned bodies up to the token budget and
        every tail under the alignment), each decoding one step; a drafting engine (whose prompt chunks run
        eagerly) its step graphs and decode graphs of every bucket instead. Seconds taken; nothing where graphs
        are off."""
        t0 = time.perf_counter()
        spec_graphs = self.spec.graphs if self.spec is not None else None
        if spec_graphs is not None and spec_graphs.capturable:  # a drafting engine: its step and decode graphs
            spec_graphs.capture_buckets(self.config.max_num_seqs)
            return time.perf_counter() - t0
        if self.runner.prefill_graphs is None or not self.runner.prefill_graphs.capturable:
            return 0.0
        align, budget = self.scheduler.align, self.config.max_num_batched_tokens
        lengths = [align * j for j in range(1, max(budget // align, 1) + 1)] + [align + r for r in range(1, align)]
        rng = random.Random(0)
        for n in lengths:
            if n + 2 > self.max_model_len:
                continue
            rid = self.add_request([rng.randrange(self.vocab_size) for _ in range(n)],
                                   SamplingParams(max_tokens=2, temperature=0))
            while rid in self.requests:
                self.step()
        return time.perf_counter() - t0

    # ---- requests --------------------------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        prompt: str | None = None,
        logits_only: bool = False,
        snapshot_hints: Sequence[int] = (),
        cache_salt: bytes = b"",
        images: Sequence | None = None,
    ) -> str:
        """Queue a request. snapshot_hints: prompt positions where a later request may diverge (e.g. chat message
        ends), where the prefix cache also snapshots; cache_salt: bytes that change what the prompt's KV holds
        beyond its token ids, mixed into its block hashes (a request's images add their pixels' hash); images: one
        per `<|image_pad|>` placeholder of the prompt, in order (PIL images, paths, bytes, data: URLs;
        engine/multimodal.py); each placeholder is expanded to its image's token count."""
        params = params or SamplingParams()
        mm = None
        if images:
            if self.images is None:
                raise ValueError("this engine has no vision tower (a text-only checkpoint, or loaded with "
                                 "limit_mm_per_prompt={'image': 0}): images cannot be used")
            prompt_token_ids, mm = self.images.prepare(prompt_token_ids, images)
        ids = self._check_prompt(prompt_token_ids, logits_only)
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop needs a tokenizer (stop strings are matched on text)")
        room = self.max_model_len - len(ids)
        req = Request(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            prompt=prompt,
            seed=params.seed if params.seed is not None else self.rng.getrandbits(64),
            max_tokens=min(params.max_tokens or room, room),
            logits_only=logits_only,
            snapshot_hints=[int(h) for h in snapshot_hints],
            cache_salt=bytes(cache_salt) + (multimodal.content_hash(mm) if mm is not None else b""),
            mm=mm,
        )
        req.metrics.arrival = time.perf_counter()
        if params.structured_outputs is not None:
            self.structured.attach(req)  # parses the grammar now (a bad spec raises here); compiles it aside
        if req.grammar is not None and not req.grammar.ready:
            self.scheduler.check_fits(req)
            self.structured.hold(req)  # joins the scheduler once its grammar is compiled (step)
        else:
            self.scheduler.add(req)
        self.requests[request_id] = req
        if self.tokenizer is not None and not logits_only:
            self.detokenizers[request_id] = IncrementalDetokenizer(
                self.tokenizer, ids, params.skip_special_tokens, params.stop, params.include_stop_str_in_output
            )
        return request_id

    def _check_prompt(self, prompt_token_ids: Sequence[int], logits_only: bool) -> list[int]:
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        limit = self.max_model_len if logits_only else self.max_model_len - 1
        if len(ids) > limit:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len {self.max_model_len} allows {limit}"
                + ("" if logits_only else " (one position is kept for the first output token)")
            )
        return ids

    def abort(self, request_id: str) -> None:
        """Finish a request now and give back its blocks and state slot (a step in flight that computes one more
        token for it still runs; its result is dropped)."""
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.finish(req, FinishReason.ABORT)
            self.detokenizers.pop(request_id, None)
            self.runner.sampler.forget(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.structured.holding

    # ---- the step --------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and launch the next step, then read back the previous one and return its outputs.

        The engine runs one step ahead of the device: while step n computes, the host schedules step n+1 (a
        sequence's next input token is taken from the device, written there by step n's sampling) and only then
        waits for step n's sampled ids, appends them, detokenises and checks stops. A request that stops at step n
        has already been given one more token in step n+1; that token is dropped. Tokens are the same as a step
        at a time: sampling is a function of (logits, seed, position) alone. (A constrained row's mask needs its
        step-n token: the runner calls back once step n+1's forward is launched, and the matchers take step n's
        tokens there, engine/structured.py.)"""
        outputs = []
        for req, error in self.structured.release(self.scheduler):  # compiled grammars' requests join the scheduler
            self._finish(req, FinishReason.ABORT, stop_reason=error)
            outputs.append(self._output(req, []))
        if self._drafting is not None:  # a drafting step in flight: read it back (and maybe launch its follower)
            outputs += self._complete_drafting()
            if self._drafting is not None:
                return outputs
        out = self.scheduler.schedule()
        launched = None
        if not out.is_empty:
            now = time.perf_counter()
            for s in out.seqs:
                if s.request.metrics.first_scheduled is None:
                    s.request.metrics.first_scheduled = now
                if s.request.resume_snapshot is not None:  # a prefix hit: its DeltaNet state, before its chunk
                    self.cache.load_state(s.request.resume_snapshot, s.request.state_slot)
                    s.request.resume_snapshot = None
            handle = self.runner.launch(out, self.structured.catch_up(out, self._in_flight))
            self._take_snapshots(out)
            self.scheduler.update(out)
            for req in handle.sampled_reqs:
                req.num_pending += 1
            launched = (out, handle)
            if self.spec is not None and (handle.spec_tokens or handle.spec_pending is not None
                                          or any(s.request.draft_token_ids for s in out.seqs)):
                # drafting: the next step verifies this one's tokens and drafts, so nothing is scheduled before it
                # is read back (after the step in flight, if any: a plain one before this step's prompt chunks gave
                # drafts); a step launched through a graph is read back by the next call (_complete_drafting)
                previous, self._in_flight = self._in_flight, None
                done = self._complete(*previous) if previous is not None else []
                if handle.spec_pending is not None:
                    self._drafting = launched
                    return outputs + done
                return outputs + done + self._complete(out, handle)
        elif self._in_flight is None:
            if self.structured.holding:  # only requests whose grammar is still compiling: wait for one
                self.structured.wait()
                return outputs
            if self.has_unfinished():
                raise RuntimeError("scheduler made no progress with requests pending (cache too small?)")
            return outputs
        previous, self._in_flight = self._in_flight, launched
        return outputs + (self._complete(*previous) if previous is not None else [])

    def _complete_drafting(self) -> list[RequestOutput]:
        """Read back the drafting step in flight and apply it. Where the same requests go on drafting and nothing
        else could be scheduled (no request waits, or none could be admitted: every sequence slot is taken), the
        next drafting step is launched from its read-back first (SpeculativeDecoder.follow), so the
        device computes it while the host appends, detokenises and checks stops; it is the step the scheduler would
        have made (one row group per request, at its newest token, with the drafts just made), and it stays in
        flight. A request the follower computes for that has stopped meanwhile (a stop string) gets its row
        dropped, as a plain step's one-ahead token is."""
        out, handle = self._drafting
        self._drafting = None
        pending = handle.spec_pending
        handle.spec_tokens = self.spec.finish(pending).tokens
        rows = {s.request.request_id for s in pending.seqs}
        follower = None
        sched = self.scheduler
        full = len(sched.running) >= sched.config.max_num_seqs  # (nobody waiting could be admitted now)
        if (len(out.seqs) == len(pending.seqs) and (full or not sched.waiting) and not self.structured.holding
                and {r.request_id for r in sched.running} == rows):
            follower = self.spec.follow(pending, self.eos_token_ids)
        done = self._complete(out, handle)
        if follower is not None:
            nxt = SchedulerOutput(follower.seqs)
            sched.update(nxt)  # (after the tokens above: the follower's rows start at their newest token)
            self._drafting = (nxt, StepHandle(spec_pending=follower))
        return done

    def _take_snapshots(self, out: SchedulerOutput) -> None:
        """After a launch: each prompt chunk that ended on one of its request's seams copies the request's state
        slot into a snapshot (queued behind the chunk's forward, before any later step touches the slot)."""
        if self.prefix_cache is None:
            return
        for s in out.seqs:
            req, end = s.request, s.start + s.num_new_tokens
            if req.seams and end in req.seams and s.start < req.num_prompt_tokens:
                snap = self.prefix_cache.snapshot_for(req, end)
                if snap is not None:
                    self.cache.save_state(req.state_slot, snap)

    def _complete(self, out: SchedulerOutput, handle: StepHandle) -> list[RequestOutput]:
        """Read back a launched step and apply it: full blocks registered in the prefix cache, tokens appended,
        stops checked, outputs made."""
        result = handle.result()
        outputs = []
        for s in out.seqs:
            req = s.request
            if s.sample and req.request_id not in handle.spec_tokens:
                req.num_pending -= 1
            if req.is_finished:  # aborted, or stopped by an earlier step's token: this step's token is dropped
                continue
            if self.prefix_cache is not None and not req.logits_only and s.start < req.num_prompt_tokens:
                self.prefix_cache.register(req, s.start + s.num_new_tokens)  # (a prompt chunk's blocks)
            if req.logits_only:
                req.all_logits.append(result.logits[req.request_id])
                if s.start + s.num_new_tokens == req.num_prompt_tokens:
                    self._finish(req, FinishReason.LENGTH)
                    outputs.append(self._output(req, []))
            elif req.request_id in handle.spec_tokens:  # a verified row: its accepted drafts and the bonus token
                tokens = handle.spec_tokens[req.request_id]
                req.num_computed_tokens += len(tokens) - 1  # the accepted drafts are in the cache now
                # (a request asking for logprobs does not draft: one token, its logprobs as a decode step's)
                lp = self.runner.sampler.pop_logprobs(req.request_id) if req.params.logprobs is not None else None
                new = []
                for token in tokens:
                    if self._append_token(req, token):
                        new.append(token)
                        if lp is not None:
                            req.output_logprobs.append({t: Logprob(v, rank) for t, (v, rank) in lp.items()})
                    if req.is_finished:  # a stop inside the accepted run: the rest is dropped
                        break
                outputs.append(self._output(req, new))
            elif s.sample:
                token = result.sampled[req.request_id]
                lp = self.runner.sampler.pop_logprobs(req.request_id) if req.params.logprobs is not None else None
                kept = self._append_token(req, token)
                if lp is not None and kept:
                    req.output_logprobs.append({t: Logprob(v, rank) for t, (v, rank) in lp.items()})
                outputs.append(self._output(req, [token] if kept else []))
        return outputs

    def _append_token(self, req: Request, token: int) -> bool:
        """Append a sampled token and end the request if it stops; False if its grammar refused the token (a dead
        end: the token is dropped and the request ends)."""
        if req.metrics.first_token is None:
            req.metrics.first_token = time.perf_counter()
        verdict = req.grammar.accept(token) if req.grammar is not None else None
        if verdict == REJECTED:
            if req.request_id in self.detokenizers:
                self.detokenizers[req.request_id].flush()
            self._finish(req, FinishReason.STOP, stop_reason=GRAMMAR_DEAD_END)
            return False
        req.output_token_ids.append(token)
        p = req.params
        if token in p.stop_token_ids:
            self._finish(req, FinishReason.STOP, stop_reason=token)
            return True
        if (not p.ignore_eos and token in self.eos_token_ids) or verdict == COMPLETE:
            self._finish(req, FinishReason.STOP)
            return True
        detok = self.detokenizers.get(req.request_id)
        if detok is not None:
            matched = detok.add_token(token)
            if matched is not None:
                self._finish(req, FinishReason.STOP, stop_reason=matched)
                return True
        if len(req.output_token_ids) >= req.max_tokens:
            self._finish(req, FinishReason.LENGTH)
        return True

    def _finish(self, req: Request, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        req.stop_reason = stop_reason
        req.metrics.finished = time.perf_counter()
        detok = self.detokenizers.get(req.request_id)
        if detok is not None and not isinstance(stop_reason, str):
            detok.flush()  # a stop string cut the text on purpose; anything else ends with all pending text
        self.scheduler.finish(req, reason)

    def _output(self, req: Request, new_tokens: list[int]) -> RequestOutput:
        """The request's output after this step. Its whole-output views are lazy slices (O(new tokens) a step)."""
        finished = req.is_finished
        detok = self.detokenizers.get(req.request_id)
        new_text = detok.take_delta(finished) if detok is not None else ""
        tokens, n = req.output_token_ids, len(req.output_token_ids)
        if detok is None:
            text = ""
        elif finished:
            text = detok.text[: detok.streamed]
        else:
            streamed = detok.streamed
            text = lambda: detok.text[:streamed]  # noqa: E731 (the streamed prefix never changes afterwards)
        out = RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            text=text,
            token_ids=list(tokens) if finished else (lambda: tokens[:n]),
            finished=finished,
            finish_reason=req.finish_reason.value if finished else None,
            stop_reason=req.stop_reason,
            new_text=new_text,
            new_token_ids=new_tokens,
            metrics=req.metrics,
            logprobs=list(req.output_logprobs) if req.params.logprobs is not None else None,
        )
        if finished:
            self.runner.sampler.forget(req.request_id)
            self.requests.pop(req.request_id, None)
            self.detokenizers.pop(req.request_id, None)
            if req.logits_only:
                out.prompt_logits = torch.cat(req.all_logits) if req.all_logits else None
        return out
