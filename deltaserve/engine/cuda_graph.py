"""CUDA-graph decode: one captured graph per batch bucket, replayed for every decode step.

A decode step for B sequences (one new token each) reads only device tensors on the fast path, so it can be
captured once per bucket size and replayed. The graph owns static input buffers; `DecodeGraph.step` copies the
step's metadata into them and replays. With `greedy_feedback=True` the captured step also takes the argmax of its
logits as the next input and advances positions, context lengths and KV slots on the device, so a run of N greedy
decode steps is N back-to-back replays with no host work (what the benchmark times).

Buckets: a batch of B sequences uses the smallest bucket >= B; the padding rows point at a dedicated scratch state
slot and a scratch KV block, so they never touch a real sequence's cache.

`DecodeGraphs` is the engine's side: one lazily captured `DecodeGraph` per bucket, the padding, and the copy-out of
the real rows' logits. On a device without capture (CPU) `DecodeGraph.replay` runs the same step eagerly, so the
padding and bucketing logic is testable without a GPU.
"""

from __future__ import annotations

import numpy as np
import torch

from ..model import ForwardBatch, HybridCache, fast
from .transfer import to_device

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_WIDTH_TOKENS = 1024  # the narrowest decode graph's block tables (tokens); wider ones double up to max_model_len


def greedy_kernels(logits: torch.Tensor) -> bool:
    """Does the greedy feedback run as kernels/triton_greedy's two launches (fast-path logits: CUDA, or CPU under
    the interpreter's fast path) or as the torch sequence (the same values)?"""
    return fast.enabled(torch.empty(0, dtype=torch.bfloat16, device=logits.device))


def activation_param(model) -> torch.Tensor | None:
    """The model's first floating-point parameter, whose dtype and device are its activations': a quantised
    checkpoint's first parameter is often a packed integer weight (an MLX q4 embedding is uint32)."""
    return next((q for q in model.parameters() if q.is_floating_point()), None)


def capturable(model) -> bool:
    """Can the model's forward be captured? CUDA and the fast path (the reference path synchronises with the host)."""
    p = activation_param(model)
    return p is not None and p.is_cuda and fast.enabled(torch.empty(0, dtype=p.dtype, device=p.device))


@torch.no_grad()
def warm_and_capture(forward, restore, warmup: int, pool=None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`warmup` eager runs of forward() on a side stream (compiles kernels, settles allocations), then one captured
    run; restore() before each run and after the capture puts back what a run changes (its caller's state).
    Returns the graph and the captured run's output tensor."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            restore()
            forward()
    torch.cuda.current_stream().wait_stream(stream)
    restore()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = forward()
    restore()
    return graph, out


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> None:
    """Every row sampled the plain way (greedy where temperature <= 0, else temperature + Gumbel of its key) into
    out, on the device and without host syncs: kernels/triton_sampling on the fast path, else its reference."""
    from ..kernels import backend
    from ..kernels.sampling import sample_plain_reference

    if logits.is_cuda and not backend.reference_enabled():
        from ..kernels.triton_sampling import sample_plain

        sample_plain(logits, temperature, keys, out=out)
    else:
        out.copy_(sample_plain_reference(logits, temperature, keys))


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
            context_lens_cpu=[1] * batch,  # host copy: set by load() from host tensors for the (eager) reference
            # path; the fast path reads only the device context_lens
            block_size=self.block_size,
            logits_all_rows=True,  # one token a row, each with logits: no gather before the final norm
        )
        self.greedy_feedback = greedy_feedback
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        # The engine's form (attach_sources): the step reads its rows' block tables from a table kept per state slot,
        # a row flagged `from_device` takes its input token from a per-slot token buffer (the newest sampled token,
        # not yet read back by the host), and the step ends by sampling every row the plain way (greedy or
        # temperature: kernels/triton_sampling) into `sampled` and the token buffer; all of it inside the graph, so
        # a decode step is one host-to-device copy, the replay and one copy back.
        self.table_source: torch.Tensor | None = None  # [num_slots, max_blocks] int32
        self.token_source: torch.Tensor | None = None  # [num_slots] int64
        self.sampled: torch.Tensor | None = None  # [batch] int64
        self._stage = self._rows = None

    ROWS = ("ids", "from_device", "positions", "context_lens", "slots", "temperature", "keys")

    def attach_sources(self, table_source: torch.Tensor, token_source: torch.Tensor) -> None:
        """Switch to the engine's form (before capture): load_rows() then sets the rows' inputs in one asynchronous
        copy, and the graph derives tables, KV slots and input ids, and samples."""
        dev = self.input_ids.device
        self.table_source, self.token_source = table_source, token_source
        # one [7, batch] int64 block on the device whose rows are the step's inputs (ROWS; the temperature as its
        # fp32 bits), and its pinned host staging
        self._rows = torch.zeros(len(self.ROWS), self.batch, dtype=torch.int64, device=dev)
        self._stage = torch.zeros(len(self.ROWS), self.batch, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._copied = torch.cuda.Event() if dev.type == "cuda" else None
        self.positions, self.context_lens, self.state_slots = self._rows[2], self._rows[3], self._rows[4]
        self.fb.positions, self.fb.context_lens, self.fb.state_slots = self.positions, self.context_lens, self.state_slots
        self.sampled = torch.zeros(self.batch, dtype=torch.int64, device=dev)

    def load_rows(self, ids, from_device, positions, context_lens, slots, temperature, keys) -> None:
        """The engine's form: each argument the bucket's `batch` host values (temperature: floats; keys:
        kernels/sampling.row_keys of each row's seed and sampled position)."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous load's copy has read the staging (long done: a step ago)
        stage = self._stage.numpy()
        for row, values in enumerate((ids, from_device, positions, context_lens, slots)):
            stage[row] = values
        stage[5] = np.asarray(temperature, dtype=np.float32).view(np.int32)
        stage[6] = keys
        self._rows.copy_(self._stage, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        if self.input_ids.device.type != "cuda":
            self.fb.context_lens_cpu = [int(c) for c in context_lens]

    def _gather_sources(self) -> None:
        torch.index_select(self.table_source, 0, self.state_slots, out=self.block_tables)
        self._derive_slots()
        pick = self.token_source.index_select(0, self.state_slots)
        self.input_ids.copy_(torch.where(self._rows[1] != 0, pick, self._rows[0]))

    def _sample(self, logits: torch.Tensor) -> None:
        temperature, keys = self._rows[5].to(torch.int32).view(torch.float32), self._rows[6]
        sample_rows(logits, temperature, keys, self.sampled)
        self.token_source.index_copy_(0, self.state_slots, self.sampled)

    def _forward(self) -> torch.Tensor:
        if self.table_source is not None:
            self._gather_sources()
        logits = self.model(self.fb, self.cache)
        if self.table_source is not None:
            self._sample(logits)
        if self.greedy_feedback:
            from ..kernels import triton_greedy

            args = (logits, self.input_ids, self.positions, self.context_lens, self.block_tables, self.slot_mapping,
                    self.block_size)
            if greedy_kernels(logits):
                triton_greedy.greedy_advance(*args)  # two launches instead of ~12 torch ops, the same results
            else:
                triton_greedy.greedy_advance_reference(*args)
            self.fb.context_lens_cpu = [c + 1 for c in self.fb.context_lens_cpu]  # the eager reference path reads it
        return logits

    def _derive_slots(self) -> None:
        """KV slot of each row's new token: cache index context_lens[b] looked up in its block table."""
        from ..kernels.triton_greedy import cache_slots

        self.slot_mapping.copy_(cache_slots(self.block_tables, self.context_lens, self.block_size))

    def capture(self, warmup: int = 2, pool=None) -> None:
        """Run eagerly (compiles kernels, settles allocations), then capture one step. The caller restores any
        cache state the warm-up steps changed (they write real KV slots / state slots of the loaded metadata). `pool`: a
        memory pool shared with other graphs that never run concurrently (torch.cuda.graph_pool_handle())."""
        snapshot = self._snapshot()
        self.graph, self.logits = warm_and_capture(self._forward, lambda: self._restore(snapshot), warmup, pool)

    def _snapshot(self):
        tensors = [t.clone() for t in self._state()]
        return tensors, list(self.fb.context_lens_cpu)

    def _state(self):
        """The buffers a run may change (greedy feedback advances them; the engine's form rewrites the derived ones)."""
        return (self.input_ids, self.positions, self.context_lens, self.slot_mapping, self.block_tables)

    def _restore(self, snap) -> None:
        tensors, host = snap
        for dst, src in zip(self._state(), tensors):
            dst.copy_(src)
        self.fb.context_lens_cpu = list(host)

    def load(self, input_ids, positions, context_lens, block_tables, state_slots) -> None:
        """Set the step's metadata (device or host tensors of the bucket's size; the cache index of each new token
        is context_lens[b], its slot is derived from block_tables)."""
        self.input_ids.copy_(input_ids)
        self.positions.copy_(positions)
        self.context_lens.copy_(context_lens)
        self.block_tables.copy_(block_tables)
        self.state_slots.copy_(state_slots)
        if not context_lens.is_cuda:  # the reference path's host copy; the fast path reads only the device tensor
            self.fb.context_lens_cpu = [int(c) for c in context_lens.tolist()]
        self._derive_slots()

    def replay(self) -> torch.Tensor:
        """One decode step (the graph if captured, else eager). Returns the static fp32 logits [batch, vocab]."""
        if self.graph is None:
            with torch.no_grad():
                return self._forward()
        self.graph.replay()
        return self.logits


def bucket_for(n: int, buckets=DEFAULT_BUCKETS) -> int | None:
    """The smallest bucket >= n, or None when n exceeds the largest (the step runs eagerly)."""
    return next((b for b in sorted(buckets) if b >= n), None)


class DecodeGraphs:
    """Per-bucket decode graphs for the engine's runner.

    A decode step of B real rows runs in the graph of bucket_for(B); rows B.. are padding that read and write only
    the reserved `scratch_slot` (DeltaNet state) and `scratch_block` (KV), which the engine keeps out of the
    scheduler's pools. Padding rows decode token 0 at cache index 0 of the scratch block (context 0: a fresh
    sequence), so they never read a real sequence's cache. Rows are independent (batch-invariant decode kernels),
    so a real row's logits do not depend on the bucket or on the padding.

    Graphs are captured lazily, the first time a bucket is used, only where `capturable` (CUDA and the fast path:
    the reference path synchronises with the host); elsewhere `DecodeGraph.replay` runs the step eagerly.
    """

    def __init__(self, model, cache: HybridCache, scratch_slot: int, scratch_block: int, max_blocks: int,
                 buckets=DEFAULT_BUCKETS):
        self.model, self.cache = model, cache
        self.scratch_slot, self.scratch_block = scratch_slot, scratch_block
        self.max_blocks, self.buckets = max_blocks, tuple(sorted(buckets))
        self.device = next(model.parameters()).device
        self.capturable = capturable(model)
        # (batch bucket, table width in blocks) -> graph. The width bounds the step's attention split grid: a step
        # runs in the narrowest width that holds its longest row (a row's bits do not depend on the width: its
        # splits and their merge follow its own length), so short contexts do not pay for max_model_len's grid.
        self.graphs: dict[tuple[int, int], DecodeGraph] = {}
        self._pool = None  # one memory pool for all buckets: their replays never overlap
        # Block tables by state slot, on the device, kept up to date incrementally: a step uploads only the blocks
        # its rows gained since their last step (a row's table only grows while its request holds the slot; a new
        # holder, told apart by its epoch, starts from -1). The scratch slot's row is the padding rows' table.
        self.tables = torch.full((cache.num_state_slots, max_blocks), -1, dtype=torch.int32, device=self.device)
        self.tables[scratch_slot, 0] = scratch_block
        self._table_len = [0] * cache.num_state_slots
        self._table_epoch: list[object] = [None] * cache.num_state_slots
        # the newest sampled token per state slot (the runner's), read by rows whose input is still on the device
        self.token_source = torch.zeros(cache.num_state_slots, dtype=torch.int64, device=self.device)

    def bucket(self, n: int) -> int | None:
        return bucket_for(n, self.buckets)

    @property
    def batch_buckets(self) -> set[int]:
        """The batch buckets whose graphs exist (at any width)."""
        return {b for b, _ in self.graphs}

    def width(self, tokens: int) -> int:
        """Table width (blocks) of the graph for rows of up to `tokens` cached tokens: a power of two from
        MIN_WIDTH_TOKENS, at most max_blocks."""
        need = max(-(-tokens // self.cache.block_size), -(-MIN_WIDTH_TOKENS // self.cache.block_size))
        return min(self.max_blocks, 1 << (need - 1).bit_length())

    def fits(self, tables: list[list[int]]) -> bool:
        """Every block table fits the graphs' static [bucket, max_blocks] table (else the step runs eagerly)."""
        return all(len(t) <= self.max_blocks for t in tables)

    def _graph(self, bucket: int, width: int) -> DecodeGraph:
        g = self.graphs.get((bucket, width))
        if g is None:
            g = DecodeGraph(self.model, self.cache, bucket, width)
            g.attach_sources(self.tables[:, :width], self.token_source)
            if self.capturable:
                # Warm-up and capture run with every row on the scratch slot/block: the warm-up steps write state
                # and KV, and must never touch a real sequence.
                self._load(g, [], [], [], [])
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                g.capture(pool=self._pool)
            self.graphs[(bucket, width)] = g
        return g

    def _load(self, g: DecodeGraph, tokens: list[int], starts: list[int], slots: list[int],
              from_device: list[int], temperature=None, keys=None, positions: list[int] | None = None) -> None:
        """Real rows first, then padding rows (token 0, cache index 0, the scratch slot and its table, greedy).
        positions: the real rows' RoPE positions (default their cache indices; requests with images differ)."""
        n = len(tokens)
        pad = g.batch - n
        start = list(starts) + [0] * pad
        pos = start if positions is None else list(positions) + [0] * pad
        temperature = list(temperature) + [0.0] * pad if temperature is not None else [0.0] * g.batch
        keys = list(keys) + [0] * pad if keys is not None else [0] * g.batch
        g.load_rows(list(tokens) + [0] * pad, list(from_device) + [0] * pad, pos, start,
                    list(slots) + [self.scratch_slot] * pad, temperature, keys)

    def sync_tables(self, tables: list[list[int]], slots: list[int], epochs: list | None = None) -> None:
        """Bring the device tables of `slots` up to `tables` (each slot's holder given by its epoch; with no epochs,
        every row is rewritten): uploads only what changed, asynchronously."""
        resets, rows, cols, vals = [], [], [], []
        for b, (t, s) in enumerate(zip(tables, slots)):
            epoch = epochs[b] if epochs is not None else None
            if epoch is None or self._table_epoch[s] != epoch:
                resets.append(s)
                self._table_epoch[s], self._table_len[s] = epoch, 0
            n0 = self._table_len[s]
            if len(t) > n0:
                rows += [s] * (len(t) - n0)
                cols += range(n0, len(t))
                vals += t[n0:]
                self._table_len[s] = len(t)
        if resets:
            self.tables.index_fill_(0, to_device(resets, torch.int64, self.device), -1)
        if vals:
            self.tables.index_put_((to_device(rows, torch.int64, self.device), to_device(cols, torch.int64,
                                    self.device)), to_device(vals, torch.int32, self.device))

    def run(self, tokens: list[int], starts: list[int], tables: list[list[int]], slots: list[int],
            epochs: list | None = None, from_device: list[int] | None = None, temperature=None,
            keys=None, positions: list[int] | None = None) -> torch.Tensor:
        """One decode step of B = len(tokens) rows (token b at cache index starts[b] of the sequence with block
        table tables[b] and state slot slots[b]; where from_device[b] is set, the token is token_source[slots[b]]
        instead; its RoPE position positions[b], default starts[b]). Returns the real rows' fp32 logits [B, V]: a
        view of the graph's static output, valid until this bucket's next replay (sample it first). The step also
        samples each row the plain way with temperature[b] and keys[b] (default: greedy): `last_sampled`, [B]
        int64 on the device, and token_source[slots[b]]."""
        n = len(tokens)
        g = self._graph(self.bucket(n), self.width(max(starts) + 1))
        self.sync_tables(tables, slots, epochs)
        self._load(g, tokens, starts, slots, from_device if from_device is not None else [0] * n, temperature, keys,
                   positions)
        logits = g.replay()[:n]
        self.last_sampled = g.sampled[:n]
        return logits


class PrefillGraph:
    """A captured prefill forward for `batch` sequences (default one) of exactly `n` new tokens each, at any depths.

    On the fast path a prefill reads its depths, block tables, KV slots and state slots from device tensors; the
    host sizes it bakes in (grids, fla's chunk indices) depend on (batch, n) alone. So one graph serves every such
    step of any prompts at any context lengths: the engine's full prefill chunks (max_num_batched_tokens) of a
    request prefilled alone, and the benchmark's pp512 of one or of B prompts. The same kernels with the same launch
    parameters as the eager forward: the same bits (tests/gpu/test_engine_graph_gpu.py). Where capture is impossible
    (CPU) `replay` runs the same forward eagerly from the static buffers, so the logic is testable without a GPU.

    Output: the fp32 logits of each sequence's last new token, [batch, V] (what a sampling step needs; a chunk that
    does not end its prompt ignores them).
    """

    def __init__(self, model, cache: HybridCache, n: int, max_blocks: int, batch: int = 1):
        if n < 1 or batch < 1:
            raise ValueError(f"PrefillGraph: {batch} sequences of {n} tokens (both at least 1)")
        self.model, self.cache, self.n, self.batch = model, cache, n, batch
        self.block_size = cache.block_size
        dev = next(model.parameters()).device
        i64 = dict(dtype=torch.int64, device=dev)
        t = batch * n
        # the per-load metadata, staged on the host and copied in two asynchronous copies (one int64 row of ids |
        # positions | KV slots | depths | state slots, and the int32 block tables), from pinned buffers on CUDA; the
        # device buffers the forward reads are views of one row, at fixed addresses (what the graph captured)
        pin = dev.type == "cuda"
        self._host64 = torch.zeros(3 * t + 2 * batch, dtype=torch.int64, pin_memory=pin)
        self._host_tables = torch.zeros(batch, max_blocks, dtype=torch.int32, pin_memory=pin)
        self._dev64 = torch.zeros(3 * t + 2 * batch, **i64)
        self.input_ids, self.positions, self.slot_mapping, self.context_lens, self.state_slots = \
            self._fields(self._dev64)
        self.block_tables = torch.zeros(batch, max_blocks, dtype=torch.int32, device=dev)
        # the host staging's numpy views, the same fields (ids, positions, KV slots as [batch, n])
        ids, pos, slots, depths, states = self._fields(self._host64.numpy())
        self._staged = (ids.reshape(batch, n), pos.reshape(batch, n), slots.reshape(batch, n), depths, states)
        self._staged_tables = self._host_tables.numpy()
        self._copied = torch.cuda.Event() if pin else None  # the last load's copies done: its host rows are free
        self._offsets = np.arange(n, dtype=np.int64)
        self.fb = ForwardBatch(
            input_ids=self.input_ids, positions=self.positions,
            cu_seqlens=torch.arange(0, t + 1, n, **i64), context_lens=self.context_lens,
            block_tables=self.block_tables, slot_mapping=self.slot_mapping, state_slots=self.state_slots,
            logits_indices=torch.arange(n - 1, t, n, **i64),
            seq_lens_cpu=[n] * batch, context_lens_cpu=[0] * batch,  # host depths: set by load() for the eager
            block_size=self.block_size,                                # reference path only
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _fields(self, row):
        """The metadata row's fields, views of a device row or of its host staging (one layout for both): token ids,
        positions, KV slots ([batch * n] each, sequence-major), depths and state slots ([batch] each)."""
        t, b = self.batch * self.n, self.batch
        return row[:t], row[t:2 * t], row[2 * t:3 * t], row[3 * t:3 * t + b], row[3 * t + b:]

    def load(self, token_ids, depth: int, block_table, state_slot: int) -> None:
        """One sequence's chunk (batch 1): its n token ids (host list or tensor), its depth (tokens already
        cached), the sequence's block table (covering depth + n tokens) and state slot."""
        self.load_batch([token_ids], [depth], [block_table], [state_slot])

    def load_batch(self, token_ids, depths, block_tables, state_slots) -> None:
        """The batch's chunks, sequence by sequence: token_ids[b] (n ids each), depths[b], block_tables[b] (covering
        depths[b] + n tokens), state_slots[b]."""
        b = self.batch
        if not (len(token_ids) == len(depths) == len(block_tables) == len(state_slots) == b):
            raise ValueError(f"PrefillGraph for {b} sequences loaded with {len(token_ids)} / {len(depths)} / "
                             f"{len(block_tables)} / {len(state_slots)} token lists / depths / tables / slots")
        if self._copied is not None:
            self._copied.synchronize()  # the previous load's copies have read the host rows
        n, bs = self.n, self.block_size
        h_ids, h_pos, h_slots, h_depths, h_states = self._staged
        tables = self._staged_tables
        tables.fill(-1)
        for i, (ids, table, depth) in enumerate(zip(token_ids, block_tables, depths)):
            ids = np.asarray(ids.tolist() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).reshape(-1)
            table = np.asarray(table.tolist() if isinstance(table, torch.Tensor) else table, dtype=np.int64)
            if ids.size != n:
                raise ValueError(f"PrefillGraph for {n} tokens a sequence: sequence {i} loaded with {ids.size}")
            if table.size > tables.shape[1]:
                raise ValueError(f"PrefillGraph: sequence {i}'s block table of {table.size} blocks exceeds its "
                                 f"static {tables.shape[1]}")
            depth = int(depth)
            if depth < 0 or -(-(depth + n) // bs) > table.size:
                raise ValueError(f"PrefillGraph: sequence {i}'s block table of {table.size} blocks does not cover "
                                 f"its depth {depth} + {n} tokens (blocks of {bs})")
            tables[i, : table.size] = table
            pos = depth + self._offsets
            h_ids[i], h_pos[i], h_slots[i] = ids, pos, table[pos // bs] * bs + pos % bs
            h_depths[i], h_states[i] = depth, int(state_slots[i])
        self._dev64.copy_(self._host64, non_blocking=True)
        self.block_tables.copy_(self._host_tables, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.fb.context_lens_cpu = [int(d) for d in depths]

    def capture(self, warmup: int = 2, pool=None) -> None:
        """Capture with the loaded chunks' metadata. The warm-up and capture runs write the chunks' KV (the values
        the real run writes again) and their sequences' DeltaNet states, which are saved first and restored after."""
        slot = self.state_slots.clone()
        saved = [(p, p.index_select(0, slot)) for p in (*self.cache.ssm.values(), *self.cache.conv.values())]

        def restore():
            for p, rows in saved:
                p.index_copy_(0, slot, rows)

        self.graph, self.logits = warm_and_capture(lambda: self.model(self.fb, self.cache), restore, warmup, pool)

    def replay(self) -> torch.Tensor:
        """The loaded chunks' forward (the graph if captured, else eager): fp32 logits of each sequence's last
        token, [batch, V]."""
        if self.graph is None:
            with torch.no_grad():
                return self.model(self.fb, self.cache)
        self.graph.replay()
        return self.logits


class PrefillGraphs:
    """The engine's prefill graphs: one `PrefillGraph` per (sequences, tokens each) whose step size (their product)
    is in `sizes`, captured lazily the first time such a step runs: one sequence's full chunk, or B sequences'
    chunks of n tokens each with B * n in sizes (at most MAX_SEQS; a bounded set: the divisors of each size), on
    the real requests' metadata (their states are restored after the warm-up). Only where `capturable` (CUDA and
    the fast path); elsewhere the graphs' forward runs eagerly."""

    MAX_SEQS = 64
    MAX_GRAPHS = 96  # lengths captured at most (each holds its activations in the shared pool); the rest run eagerly

    def __init__(self, model, cache: HybridCache, sizes, max_blocks: int):
        self.model, self.cache = model, cache
        self.sizes, self.max_blocks = frozenset(sizes), max_blocks
        self.capturable = capturable(model)
        self.graphs: dict[tuple[int, int], PrefillGraph] = {}
        self._pool = None

    def can_run(self, n: int, num_blocks: int) -> bool:
        """Can one sequence's chunk of n tokens with a table of num_blocks blocks run through a graph (captured
        already, or a new length within MAX_GRAPHS)?"""
        return n >= 1 and num_blocks <= self.max_blocks and ((1, n) in self.graphs
                                                             or len(self.graphs) < self.MAX_GRAPHS)

    def serves(self, ns: list[int], tables: list[list[int]]) -> bool:
        """Sequences of ns[b] new tokens with block tables tables[b]: equal counts, their sum a captured size."""
        return (1 <= len(ns) <= self.MAX_SEQS and len(set(ns)) == 1 and sum(ns) in self.sizes
                and all(len(t) <= self.max_blocks for t in tables))

    def run(self, tokens: list, depths: list[int], tables: list[list[int]], slots: list[int]) -> torch.Tensor:
        """B prefill chunks of n new tokens each (tokens[b] after depths[b] cached ones). Returns each chunk's last
        token's fp32 logits [B, V], copied out of the graph's static output."""
        key = (len(tokens), len(tokens[0]))
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = PrefillGraph(self.model, self.cache, key[1], self.max_blocks, batch=key[0])
        g.load_batch(tokens, depths, tables, slots)
        if self.capturable and g.graph is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            g.capture(pool=self._pool)
        return g.replay().clone()
