"""CUDA graphs of speculative decoding steps (engine/speculative.py): one per batch bucket and table width, each
two captured parts replayed back to back, so a drafting step is one host-to-device copy, two replays and one copy
back, like a plain decode step (engine/cuda_graph.DecodeGraph).

A step of B sequences with k drafts each, T = B (k + 1) rows:
  verify (graph A)  rows b(k+1) + i: the sequence's newest token (i = 0), then its drafts, at cache indices
                    start[b] + i; ForwardBatch.verify (every row a decode step's bits); the rows' plain sampling
                    (greedy / temperature: kernels/triton_sampling) into `sampled`. Rows that sample otherwise
                    (top-k / top-p / min-p; the one row of a request with penalties or logprobs) are sampled by the
                    engine's Sampler between the two replays, from the static logits, into the same buffer.
  accept (graph B)  a[b] = the leading drafts equal to the target's samples, capped at kcap[b] (the drafts the host
                    allowed: fewer near max_tokens, none for a row that does not draft; the rest are filler that can
                    never be kept); commit the DeltaNet states after a[b] + 1 rows; then, with the MTP head as the
                    draft source, draft the next k tokens on the device:
                      one MTP pass over all k + 1 rows (the pairs (h_{start+i}, s_i): rows past a[b] write MTP KV that
                      the next step writes again before anything reads it, so the pass has a fixed shape), its
                      logits at row a[b] only; then k - 1 one-row steps at positions start + a + j.
  read back         [B, (k + 1) + 1 + k] int64: the samples s_0 .. s_k, a, the next drafts.

Every row's target logits are a one-token decode step's bits (the verify's contract), and every kept token is the
target's own sample at its position: the reply is the undrafted one. The drafts' bits (MTP pass of k + 1 rows
rather than the eager a + 1) do not matter: acceptance only compares them with the target's samples.

Padding rows (bucket > B) sit on the scratch state slot and block (engine/cuda_graph.DecodeGraphs), at cache
indices 0 .. 2k, with kcap 0. A bucket's graph verifies SpecGraphs.step_k drafts a sequence: the engine's k, or
fewer where bucket (k + 1) rows would pass speculative.MAX_VERIFY_ROWS. Where capture is impossible (CPU) the same
step runs eagerly (tests).
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels.triton_greedy import cache_slots
from ..model import ForwardBatch
from .cuda_graph import DecodeGraphs, greedy_kernels, sample_rows


class SpecGraph:
    """The two captured parts of a speculative step for exactly `batch` sequences of k drafts."""

    def __init__(self, model, cache, batch: int, k: int, table_source: torch.Tensor, draft: bool):
        self.model, self.cache, self.batch, self.k = model, cache, batch, k
        self.draft = draft  # the MTP head drafts inside the step (else the host's draft source does, after it)
        self.table_source = table_source  # [num_slots, width] int32, the sequences' block tables by state slot
        bs = cache.block_size
        self.block_size = bs
        dev = table_source.device
        i64 = dict(dtype=torch.int64, device=dev)
        k1, t = k + 1, batch * (k + 1)
        self.rows_per_seq = k1
        # the step's inputs: one int64 block (pinned staging on the host, one asynchronous copy): per sequence its
        # newest token, start (cache index of that token), state slot, kcap and k drafts; per row its temperature
        # (fp32 bits) and sampling key (kernels/sampling.row_keys of its seed and sampled position)
        self._layout = [("token", batch), ("start", batch), ("slot", batch), ("kcap", batch), ("drafts", batch * k),
                        ("temperature", t), ("keys", t)]
        size = sum(n for _, n in self._layout)
        self._dev = torch.zeros(size, **i64)
        self._stage = torch.zeros(size, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._copied = torch.cuda.Event() if dev.type == "cuda" else None
        self.inp = self._fields(self._dev)
        self._staged = self._fields(self._stage.numpy())
        self._offsets = torch.arange(k1, **i64)
        self._seq_rows = torch.arange(0, t, k1, **i64)  # each sequence's first row
        width = table_source.shape[1]
        # the verify forward's batch: its tensors are written in place by each run (the graph read their addresses)
        self.block_tables = torch.zeros(batch, width, dtype=torch.int32, device=dev)
        self.verify_fb = ForwardBatch(
            input_ids=torch.zeros(t, **i64), positions=torch.zeros(t, **i64),
            cu_seqlens=torch.arange(0, t + 1, k1, **i64), context_lens=self.inp["start"],
            block_tables=self.block_tables, slot_mapping=torch.zeros(t, **i64), state_slots=self.inp["slot"],
            logits_indices=torch.arange(t, **i64), seq_lens_cpu=[k1] * batch, context_lens_cpu=[0] * batch,
            block_size=bs, logits_all_rows=True, verify=True, row_context_lens=torch.zeros(t, **i64),
            row_block_tables=torch.zeros(t, width, dtype=torch.int32, device=dev))
        # the MTP pass over the same rows (positions, KV slots), logits of row a[b] of each sequence; its rows are
        # decode rows as the verify's are (the decode kernels: a handful of rows, not a prompt)
        v = self.verify_fb
        self.mtp_fb = ForwardBatch(
            input_ids=torch.zeros(t, **i64), positions=v.positions, cu_seqlens=v.cu_seqlens,
            context_lens=self.inp["start"], block_tables=self.block_tables, slot_mapping=v.slot_mapping,
            state_slots=self.inp["slot"], logits_indices=torch.zeros(batch, **i64), seq_lens_cpu=[k1] * batch,
            context_lens_cpu=[0] * batch, block_size=bs, verify=True, row_context_lens=v.row_context_lens,
            row_block_tables=v.row_block_tables)
        # the draft chain's one-row steps
        self.chain_fb = ForwardBatch(
            input_ids=torch.zeros(batch, **i64), positions=torch.zeros(batch, **i64),
            cu_seqlens=torch.arange(batch + 1, **i64), context_lens=torch.zeros(batch, **i64),
            block_tables=self.block_tables, slot_mapping=torch.zeros(batch, **i64), state_slots=self.inp["slot"],
            logits_indices=torch.arange(batch, **i64), seq_lens_cpu=[1] * batch, context_lens_cpu=[0] * batch,
            block_size=bs, logits_all_rows=True)
        self.sampled = torch.zeros(t, **i64)
        # the read-back: [batch, k1 + 1 + k]: samples, accepted drafts, next drafts
        self.result = torch.zeros(batch, k1 + 1 + k, **i64)
        self._host = torch.zeros(batch, k1 + 1 + k, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._read = torch.cuda.Event() if dev.type == "cuda" else None
        self.graphs: tuple | None = None
        self.logits: torch.Tensor | None = None  # [t, V] fp32, the verify's (static once captured)
        self.hidden: torch.Tensor | None = None  # [t, H], the verify's final-norm hidden states

    def _fields(self, block) -> dict:
        out, at = {}, 0
        for name, n in self._layout:
            out[name] = block[at: at + n]
            at += n
        return out

    # ---- inputs ----------------------------------------------------------------------------------------------
    def load(self, tokens, starts, slots, kcaps, drafts, temperature, keys) -> None:
        """The bucket's `batch` sequences (padding included): tokens/starts/slots/kcaps [batch], drafts [batch][k],
        temperature and keys [batch * (k + 1)] (row b(k+1) + i samples the token at start[b] + i + 1)."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous load's copy has read the staging
        st = self._staged
        st["token"][:], st["start"][:], st["slot"][:], st["kcap"][:] = tokens, starts, slots, kcaps
        st["drafts"][:] = np.asarray(drafts, dtype=np.int64).reshape(-1)
        st["temperature"][:] = np.asarray(temperature, dtype=np.float32).view(np.int32)
        st["keys"][:] = keys
        self._dev.copy_(self._stage, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        if not self._dev.is_cuda:  # the reference path reads host lengths
            self.verify_fb.context_lens_cpu = self.mtp_fb.context_lens_cpu = [int(s) for s in starts]

    # ---- the two parts ---------------------------------------------------------------------------------------
    def _verify(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, k1, v = self.batch, self.rows_per_seq, self.verify_fb
        start = self.inp["start"]
        pos = (start[:, None] + self._offsets).reshape(-1)  # [t]
        v.positions.copy_(pos)
        v.row_context_lens.copy_(pos)
        torch.index_select(self.table_source, 0, self.inp["slot"], out=self.block_tables)
        v.row_block_tables.copy_(self.block_tables.repeat_interleave(k1, 0))
        v.slot_mapping.copy_(cache_slots(v.row_block_tables, pos, self.block_size))
        ids = v.input_ids.view(b, k1)
        ids[:, 0].copy_(self.inp["token"])
        ids[:, 1:].copy_(self.inp["drafts"].view(b, self.k))
        logits, hidden = self.model.forward_with_hidden(v, self.cache)
        temperature = self.inp["temperature"].to(torch.int32).view(torch.float32)
        sample_rows(logits, temperature, self.inp["keys"], self.sampled)
        return logits, hidden

    def _accept(self) -> None:
        b, k, k1 = self.batch, self.k, self.rows_per_seq
        s = self.sampled.view(b, k1)
        drafts = self.inp["drafts"].view(b, k)
        a = (drafts == s[:, :k]).to(torch.int64).cumprod(1).sum(1)
        a = torch.minimum(a, self.inp["kcap"])
        self.model.commit_verified(self.verify_fb, self.cache, a + 1)
        self.result[:, :k1].copy_(s)
        self.result[:, k1].copy_(a)
        if self.draft:
            self._draft_chain(s, a)

    def _draft_chain(self, s: torch.Tensor, a: torch.Tensor) -> None:
        """The MTP head's next k drafts of each sequence into result[:, k1 + 1:] (spec 3.9, model/mtp.py). Each
        draft's argmax also advances the chain's row (its next input token, position, context length and KV slot:
        kernels/triton_greedy.greedy_advance, two launches) for the next step."""
        k, k1 = self.k, self.rows_per_seq
        m, c = self.mtp_fb, self.chain_fb
        m.input_ids.copy_(s.reshape(-1))
        m.logits_indices.copy_(self._seq_rows + a)
        logits, y = self.model.draft(m, self.cache, self.hidden)
        h = y.index_select(0, m.logits_indices)
        q = self.inp["start"] + a  # the cache index of each sequence's newest token after the step
        c.positions.copy_(q)
        c.context_lens.copy_(q)
        self._advance(logits)  # draft 1; the chain's rows at q + 1
        self.result[:, k1 + 1].copy_(c.input_ids)
        for j in range(1, k):
            if not q.is_cuda:  # the reference path reads host lengths
                c.context_lens_cpu = (q + j).tolist()
            logits, h = self.model.draft(c, self.cache, h, step=j)
            self._advance(logits)
            self.result[:, k1 + 1 + j].copy_(c.input_ids)

    def _advance(self, logits: torch.Tensor) -> None:
        """The chain's rows: input_ids <- argmax(logits), positions and context lengths + 1, the KV slot of the new
        index (the step's tables cover it: SpecGraphs.reach)."""
        from ..kernels import triton_greedy

        c = self.chain_fb
        args = (logits, c.input_ids, c.positions, c.context_lens, self.block_tables, c.slot_mapping, self.block_size)
        if greedy_kernels(logits):
            triton_greedy.greedy_advance(*args)
        else:
            triton_greedy.greedy_advance_reference(*args)

    # ---- capture and replay ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self, pool=None, warmup: int = 2) -> None:
        """Warm up (compiles kernels, settles allocations) and capture both parts, the inputs loaded with padding
        rows only (every write lands in the scratch slot and block)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.logits, self.hidden = self._verify()
                self._accept()
        torch.cuda.current_stream().wait_stream(stream)
        verify, accept = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(verify, pool=pool):
            self.logits, self.hidden = self._verify()
        with torch.cuda.graph(accept, pool=pool):
            self._accept()
        self.graphs = (verify, accept)

    def run_verify(self) -> torch.Tensor:
        """Part A; returns the verify's fp32 logits [t, V] (static: sample them before the next run)."""
        if self.graphs is None:
            with torch.no_grad():
                self.logits, self.hidden = self._verify()
        else:
            self.graphs[0].replay()
        return self.logits

    def run_accept(self) -> None:
        """Part B, then the read-back's copy to the host (waited for by `read`)."""
        if self.graphs is None:
            with torch.no_grad():
                self._accept()
        else:
            self.graphs[1].replay()
        if self._read is not None:
            self._host.copy_(self.result, non_blocking=True)
            self._read.record()
        else:
            self._host.copy_(self.result)

    def read(self, n: int) -> list[list[int]]:
        """The first n sequences' [samples (k + 1), accepted drafts, next drafts (k)]."""
        if self._read is not None:
            self._read.synchronize()
        return self._host[:n].tolist()


class SpecGraphs(DecodeGraphs):
    """The engine's speculative step graphs: one `SpecGraph` per (batch bucket, table width), captured lazily where
    `capturable`; the block tables by state slot, the buckets and the widths are DecodeGraphs'."""

    def __init__(self, model, cache, k: int, draft: bool, scratch_slot: int, scratch_block: int, max_blocks: int,
                 buckets, max_rows: int):
        super().__init__(model, cache, scratch_slot, scratch_block, max_blocks, buckets)
        self.k, self.draft = k, draft
        self.max_rows = max_rows  # the verify's row limit (speculative.MAX_VERIFY_ROWS)
        self.spec_graphs: dict[tuple[int, int], SpecGraph] = {}

    def step_k(self, bucket: int) -> int:
        """Drafts a sequence verifies in a step graph of this bucket: k, or fewer where bucket (k + 1) rows would
        pass the verify's row limit (0: no step graph for the bucket)."""
        return max(0, min(self.k, self.max_rows // bucket - 1))

    def rows_fit(self, bucket: int) -> bool:
        """Is there a step graph for this bucket (one draft a sequence at least within the verify's row limit)?"""
        return self.step_k(bucket) > 0

    def reach(self, start: int) -> int:
        """Cache indices a step from `start` may write: the verify's k + 1 rows and the draft chain's k - 1 more
        (k the engine's: a bound for every bucket's graph)."""
        return start + 2 * self.k + 1

    def fits_reach(self, starts: list[int]) -> bool:
        return max(self.reach(s) for s in starts) <= self.max_blocks * self.cache.block_size

    def key(self, n: int, max_start: int) -> tuple[int, int]:
        """The (bucket, table width) of the step graph for n sequences whose newest tokens sit at up to max_start."""
        return self.bucket(n), self.width(self.reach(max_start))

    def graph(self, n: int, max_start: int) -> SpecGraph:
        key = self.key(n, max_start)
        g = self.spec_graphs.get(key)
        if g is None:
            g = SpecGraph(self.model, self.cache, key[0], self.step_k(key[0]), self.tables[:, :key[1]], self.draft)
            if self.capturable:
                self.load(g, [], [], [], [], [], [], [])
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                g.capture(self._pool)
            self.spec_graphs[key] = g
        return g

    @torch.inference_mode()
    def capture_buckets(self, max_seqs: int) -> None:
        """Capture, ahead of the workload, the plain decode graphs of every bucket up to max_seqs sequences and the
        step graphs of those whose rows keep to the verify's limit (rows_fit), at the narrowest table width
        (contexts up to MIN_WIDTH_TOKENS)."""
        for b in self.buckets:
            if b > self.bucket(max_seqs):
                break
            if self.rows_fit(b):
                self.graph(b, 0)
            self._graph(b, self.width(1))

    def load(self, g: SpecGraph, tokens, starts, slots, kcaps, drafts, temperature, keys) -> None:
        """Real sequences first (drafts padded to the graph's k), then padding (the scratch slot at cache index 0,
        kcap 0)."""
        pad, k1 = g.batch - len(tokens), g.k + 1
        g.load(list(tokens) + [0] * pad, list(starts) + [0] * pad, list(slots) + [self.scratch_slot] * pad,
               list(kcaps) + [0] * pad, [list(d) + [0] * (g.k - len(d)) for d in drafts] + [[0] * g.k] * pad,
               list(temperature) + [0.0] * pad * k1, list(keys) + [0] * pad * k1)
