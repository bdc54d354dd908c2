"""CUDA-graph decode: one captured graph per batch bucket, replayed for every decode step.

A decode step for B sequences (one new token each) reads only device tensors on the fast path, so it can be
captured once per bucket size and replayed. The graph owns static input buffers; `DecodeGraph.step` copies the
step's metadata into them and replays. With `greedy_feedback=True` the captured step also takes the argmax of its
logits as the next input and advances positions, context lengths and KV slots on the device, so a run of N greedy
decode steps is N back-to-back replays with no host work (what the benchmark times).

Buckets: a batch of B sequences uses the smallest bucket >= B; the padding rows point at a dedicated scratch state
slot and a scratch KV block, so they never touch a real sequence's cache.
"""

from __future__ import annotations

import torch

from ..model import ForwardBatch, HybridCache

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class DecodeGraph:
    """A captured decode step for exactly `batch` rows."""

    def __init__(self, model, cache: HybridCache, batch: int, max_blocks: int, greedy_feedback: bool = False):
        self.model, self.cache, self.batch = model, cache, batch
        self.block_size = cache.block_size
        dev = next(model.parameters()).device
        i64 = dict(dtype=torch.int64, device=dev)
        self.input_ids = torch.zeros(batch, **i64)
        self.positions = torch.zeros(batch, **i64)
        self.context_lens = torch.ones(batch, **i64)
        self.slot_mapping = torch.zeros(batch, **i64)
        self.state_slots = torch.zeros(batch, **i64)
        self.block_tables = torch.zeros(batch, max_blocks, dtype=torch.int32, device=dev)
        self.fb = ForwardBatch(
            input_ids=self.input_ids,
            positions=self.positions,
            cu_seqlens=torch.arange(batch + 1, **i64),
            context_lens=self.context_lens,
            block_tables=self.block_tables,
            slot_mapping=self.slot_mapping,
            state_slots=self.state_slots,
            logits_indices=torch.arange(batch, **i64),
            seq_lens_cpu=[1] * batch,
            context_lens_cpu=[1] * batch,  # host copy unused on the fast path (device context_lens are read)
            block_size=self.block_size,
        )
        self.greedy_feedback = greedy_feedback
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _forward(self) -> torch.Tensor:
        logits = self.model(self.fb, self.cache)
        if self.greedy_feedback:
            nxt = logits.argmax(-1)
            self.input_ids.copy_(nxt)
            self.positions.add_(1)
            self.context_lens.add_(1)
            self._derive_slots()
        return logits

    def _derive_slots(self) -> None:
        """KV slot of each row's new token: cache index context_lens[b] looked up in its block table."""
        pos = self.context_lens
        blk = self.block_tables.gather(1, (pos // self.block_size).unsqueeze(1)).squeeze(1).to(torch.int64)
        self.slot_mapping.copy_(blk * self.block_size + pos % self.block_size)

    @torch.no_grad()
    def capture(self, warmup: int = 2) -> None:
        """Run eagerly (compiles kernels, settles allocations), then capture one step. The caller restores any
        cache state the warm-up steps changed (they write real KV slots / state slots of the loaded metadata)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        snapshot = self._snapshot()
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._restore(snapshot)
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self._restore(snapshot)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()
        self._restore(snapshot)

    def _snapshot(self):
        return [t.clone() for t in (self.input_ids, self.positions, self.context_lens, self.slot_mapping)]

    def _restore(self, snap) -> None:
        for dst, src in zip((self.input_ids, self.positions, self.context_lens, self.slot_mapping), snap):
            dst.copy_(src)

    def load(self, input_ids, positions, context_lens, block_tables, state_slots) -> None:
        """Set the step's metadata (device or host tensors of the bucket's size; the cache index of each new token
        is context_lens[b], its slot is derived from block_tables)."""
        self.input_ids.copy_(input_ids)
        self.positions.copy_(positions)
        self.context_lens.copy_(context_lens)
        self.block_tables.copy_(block_tables)
        self.state_slots.copy_(state_slots)
        self._derive_slots()

    def replay(self) -> torch.Tensor:
        """One decode step (the graph if captured, else eager). Returns the static fp32 logits [batch, vocab]."""
        if self.graph is None:
            with torch.no_grad():
                return self._forward()
        self.graph.replay()
        return self.logits
