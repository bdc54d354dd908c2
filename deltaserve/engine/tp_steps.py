"""The step loop of a tensor-parallel engine: rank 0 schedules and samples, every rank runs the model.

Rank 0 (the driver) runs the whole engine: scheduler, runner, sampling, prefix cache. Its runner reaches the model
through three entry points - `model(batch, cache)` (an eager forward), `graphs.run(...)` (a decode step through the
CUDA-graph buckets), `prefill_graphs.run(...)` (a prefill chunk through its graph) - and its engine touches the cache
outside a forward in two ways (the prefix cache's `load_state` / `save_state`). `attach_driver` wraps those so each
call is first sent to the other ranks: a message on the control group (the kind and its plain arguments: token ids,
depths, block tables, state slots, slot epochs, sampling temperatures and keys; for an eager step the ForwardBatch's
host fields and its tensors' shapes), then tensors by broadcast on the model's group (device to device under NCCL: no
host copy): an eager step's batch, packed by dtype, and, for a decode step whose input tokens rank 0 sampled but has
not read back (`from_device` rows), rank 0's token_source. `serve_steps` is the other ranks' loop (`worker_main`: a
started rank's whole life): it makes each call on its own model, cache and graphs. All ranks therefore run the same
forward with the same KV block ids, state slots and input tokens (each on its own cache, built from rank 0's
resolved EngineConfig), meet in the same collectives and end with the same logits; rank 0 samples (a decode graph
also samples the plain rows in-graph on every rank, identically, from identical logits).

Every message carries a step number, so a rank that falls out of step is caught (and named) at once.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import traceback
from dataclasses import replace

import torch

from ..model.forward_batch import ForwardBatch
from ..model.parallel import ParallelError
from .distributed import Ranks, join_group, watch_parent

STOP, CONFIG, FORWARD, DECODE_GRAPH, PREFILL_GRAPH, CACHE = ("stop", "config", "forward", "decode_graph",
                                                             "prefill_graph", "cache")
CACHE_OPS = ("load_state", "save_state")  # the engine's cache operations outside a forward (the prefix cache's)


class StepChannel:
    """Rank 0 -> every rank: (step, kind, payload) on the control group; an eager step's tensors on the model's."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.step = 0

    def send(self, kind: str, payload=None, tensors: list[torch.Tensor] = ()) -> None:
        import torch.distributed as dist

        self.step += 1
        try:
            dist.broadcast_object_list([(self.step, kind, payload)], src=0, group=self.ranks.control)
            for t in tensors:
                dist.broadcast(t, src=0, group=self.ranks.data)
        except (RuntimeError, ValueError) as e:
            raise self.ranks.explain(ParallelError(
                f"tensor-parallel rank 0: sending step {self.step} ({kind}) to the other ranks failed: {e}")) from None

    def receive(self):
        """(kind, payload) of the next message; an eager step's ForwardBatch is rebuilt here."""
        import torch.distributed as dist

        box = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=self.ranks.control)
            step, kind, payload = box[0]
            if step != self.step + 1:
                raise ParallelError(f"expected step {self.step + 1}, received step {step}")
            self.step = step
            if kind == FORWARD:
                payload = self._receive_batch(payload)
        except (RuntimeError, ValueError) as e:
            raise ParallelError(f"tensor-parallel rank {self.ranks.rank}: receiving step {self.step + 1} from rank 0 "
                                f"failed ({e}); rank 0 exited or the ranks fell out of step") from None
        return kind, payload

    def send_batch(self, batch: ForwardBatch) -> None:
        """The batch's host fields in the message; its tensors packed flat, one broadcast per dtype (int64 and the
        int32 block tables: two collectives, not one per field)."""
        fields, packs = {}, {}
        for f in dataclasses.fields(batch):
            v = getattr(batch, f.name)
            if isinstance(v, torch.Tensor):
                pack = packs.setdefault(v.dtype, [])
                fields[f.name] = ("tensor", tuple(v.shape), v.dtype, sum(t.numel() for t in pack))
                pack.append(v.reshape(-1))
            else:
                fields[f.name] = ("value", v)
        flat = {dtype: torch.cat(parts) for dtype, parts in packs.items()}
        self.send(FORWARD, (fields, {dtype: t.numel() for dtype, t in flat.items()}), list(flat.values()))

    def receive_into(self, t: torch.Tensor) -> None:
        """A tensor rank 0 sent after the message (broadcast into t, in place)."""
        import torch.distributed as dist

        try:
            dist.broadcast(t, src=0, group=self.ranks.data)
        except (RuntimeError, ValueError) as e:
            raise ParallelError(f"tensor-parallel rank {self.ranks.rank}: receiving step {self.step}'s tensor "
                                f"failed ({e}); rank 0 exited") from None

    def _receive_batch(self, payload) -> ForwardBatch:
        import torch.distributed as dist

        fields, sizes = payload
        flat = {}
        for dtype, n in sizes.items():  # the order the driver sent them in
            flat[dtype] = torch.empty(n, dtype=dtype, device=self.ranks.device)
            dist.broadcast(flat[dtype], src=0, group=self.ranks.data)
        values = {}
        for name, spec in fields.items():
            if spec[0] == "tensor":
                _, shape, dtype, offset = spec
                numel = torch.Size(shape).numel()
                values[name] = flat[dtype][offset:offset + numel].view(shape)
            else:
                values[name] = spec[1]
        return ForwardBatch(**values)


class _ModelEntry:
    """The driver runner's model: each forward call is sent to the other ranks first."""

    def __init__(self, model, channel: StepChannel):
        self._model, self._channel = model, channel

    def __call__(self, batch: ForwardBatch, cache):
        self._channel.ranks.check_workers()
        self._channel.send_batch(batch)
        return _collective(self._channel.ranks, lambda: self._model(batch, cache))

    def __getattr__(self, name):
        return getattr(self._model, name)


class _GraphsEntry:
    """The driver runner's DecodeGraphs / PrefillGraphs: each run(...) is sent to the other ranks first. A decode
    step whose rows take their input token from the device (`from_device`: sampled by rank 0, not yet read back)
    also sends rank 0's token_source, so every rank embeds the same tokens."""

    def __init__(self, graphs, kind: str, channel: StepChannel):
        self._graphs, self._kind, self._channel = graphs, kind, channel

    def run(self, *args, **kwargs):
        self._channel.ranks.check_workers()
        tokens = self._kind == DECODE_GRAPH and any(kwargs.get("from_device") or ())
        self._channel.send(self._kind, (args, kwargs, tokens), [self._graphs.token_source] if tokens else [])
        return _collective(self._channel.ranks, lambda: self._graphs.run(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._graphs, name)


class _CacheEntry:
    """The driver engine's cache: the operations it makes outside a forward (CACHE_OPS) are sent to the other
    ranks first, in order with the steps, so every rank's state slots and snapshots stay the same."""

    def __init__(self, cache, channel: StepChannel):
        self._cache, self._channel = cache, channel

    def __getattr__(self, name):
        value = getattr(self._cache, name)
        if name not in CACHE_OPS:
            return value

        def op(*args):
            self._channel.ranks.check_workers()
            self._channel.send(CACHE, (name, args))
            return value(*args)

        return op


def _collective(ranks: Ranks, fn):
    """fn() (a forward: it meets the other ranks in collectives); a failure names the workers that died."""
    try:
        return fn()
    except ParallelError as e:
        raise ranks.explain(e) from None


def attach_driver(engine, ranks: Ranks) -> StepChannel:
    """Rank 0: send the engine's resolved config to the other ranks (they build the same cache and graphs from
    it), then route the runner's model entry points through the channel."""
    channel = StepChannel(ranks)
    config = replace(engine.config, num_blocks=engine.num_blocks)  # the driver's memory budget decides, once
    channel.send(CONFIG, (config, engine.num_snapshots))
    engine.cache = _CacheEntry(engine.cache, channel)
    runner = engine.runner
    runner.model = _ModelEntry(runner.model, channel)
    if runner.graphs is not None:
        runner.graphs = _GraphsEntry(runner.graphs, DECODE_GRAPH, channel)
    if runner.prefill_graphs is not None:
        runner.prefill_graphs = _GraphsEntry(runner.prefill_graphs, PREFILL_GRAPH, channel)
    return channel


def stop_workers(channel: StepChannel) -> None:
    """Rank 0: tell the other ranks to leave their loop, then wait for the spawned ones."""
    ranks = channel.ranks
    if ranks.closed:
        return
    try:
        channel.send(STOP)
    except ParallelError:
        pass  # a worker already gone: explain() stopped the rest
    ranks.join_workers()


def serve_steps(model, ranks: Ranks) -> None:
    """Ranks > 0: build the engine from rank 0's config, then make every call rank 0 sends until it says stop."""
    channel = StepChannel(ranks)
    kind, payload = channel.receive()
    if kind != CONFIG:
        raise ParallelError(f"tensor-parallel rank {ranks.rank}: expected the engine config first, received {kind}")
    engine = _worker_engine(model, *payload)
    runner = engine.runner
    with torch.inference_mode():
        while True:
            kind, payload = channel.receive()
            if kind == STOP:
                return
            if kind == FORWARD:
                model(payload, engine.cache)
            elif kind in (DECODE_GRAPH, PREFILL_GRAPH):
                args, kwargs, tokens = payload
                graphs = runner.graphs if kind == DECODE_GRAPH else runner.prefill_graphs
                if tokens:
                    channel.receive_into(graphs.token_source)
                graphs.run(*args, **kwargs)
            elif kind == CACHE and payload[0] in CACHE_OPS:
                getattr(engine.cache, payload[0])(*payload[1])
            else:
                raise ParallelError(f"tensor-parallel rank {ranks.rank}: unknown step message {kind!r}")


def _worker_engine(model, config, num_snapshots: int):
    """The engine of a rank > 0: rank 0's resolved config (its KV blocks) and as many prefix-cache snapshots."""
    from ..model.cache import cache_spec, parse_kv_cache_dtype
    from .cuda_graph import activation_param
    from .engine import LLMEngine

    if config.enable_prefix_caching:  # the snapshot count follows a memory budget: give rank 0's count exactly
        per = cache_spec(model.config, config.block_size, activation_param(model).dtype,
                         parse_kv_cache_dtype(config.kv_cache_dtype)).bytes_per_state_slot
        if per:
            config = replace(config, prefix_state_budget=num_snapshots * per)
    engine = LLMEngine(model, None, (), config)
    if engine.num_snapshots != num_snapshots:
        raise ParallelError(f"tensor parallelism: this rank made {engine.num_snapshots} prefix snapshots, rank 0 "
                            f"{num_snapshots}")
    return engine


def start_parallel_llm(llm, tok, options, device: str, dtype, load, setup) -> None:
    """LLM(tensor_parallel_size > 1): start (or join) the ranks and load this rank's shard - load(device, parallel,
    vision) -> LoadedCheckpoint; rank 0 then builds its engine (setup(checkpoint)) and drives the others, while a
    rank > 0 (external launcher) serves rank 0's steps and returns when it stops."""
    import atexit

    from ..model.config import ModelConfig
    from .distributed import start_ranks

    options.check_for(ModelConfig.from_dir(llm.model_dir))  # a size the model cannot be split by: before any start
    ranks = start_ranks(llm.model_dir, device, dtype, options)
    try:
        if ranks.rank > 0:
            model = load(ranks.device, ranks.parallel, False).model
            llm.is_driver, llm.engine, llm.tokenizer_info = False, None, tok
            serve_steps(model, ranks)
            ranks._release()
            return
        setup(load(ranks.device, ranks.parallel))
        llm._channel = attach_driver(llm.engine, ranks)
    except BaseException:
        ranks.abort()
        raise
    atexit.register(stop_workers, llm._channel)


def worker_main(spec_file: str) -> None:
    """A started rank: join the group, load this rank's shard, serve rank 0's steps until it stops."""
    from ..weights.loader import load_checkpoint

    with open(spec_file, "rb") as f:
        spec = pickle.load(f)  # distributed.WorkerSpec
    watch_parent(spec.parent_pid, spec.rank)
    torch.set_num_threads(spec.threads)
    try:
        ranks = join_group(spec.rank, spec.size, spec.device, spec.init_method, spec.options)
        model = load_checkpoint(spec.model_dir, ranks.device, spec.dtype, progress=False, parallel=ranks.parallel).model
        serve_steps(model, ranks)
    except BaseException as e:  # noqa: BLE001 - reported to rank 0 and on stderr, then this process ends
        message = f"{type(e).__name__}: {e}"
        try:
            with open(spec.error_file, "w") as f:
                f.write(message)
        except OSError:
            pass  # rank 0 removed its directory: it is gone
        print(f"deltaserve: tensor-parallel rank {spec.rank} of {spec.size} stops: {message}", file=sys.stderr,
              flush=True)
        if not isinstance(e, (ParallelError, KeyboardInterrupt)):
            traceback.print_exc()
        os._exit(1)  # skip interpreter teardown: a broken process group can abort in its destructors
    ranks._release()
