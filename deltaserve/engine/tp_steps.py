"""The step loop of a tensor-parallel engine: rank 0 schedules and samples, every rank runs the model.

Rank 0 (the driver) runs the whole engine: scheduler, runner, sampling. Its runner reaches the model through three
entry points - `model(batch, cache)` (an eager step), `graphs.run(...)` (a decode step through the CUDA-graph
buckets), `prefill_graphs.run(...)` (a prefill chunk through its graph). `attach_driver` wraps those three so
each call first sends the same call to the other ranks: a message on the control group (the kind and its plain
arguments: token ids, depths, block tables, state slots; for an eager step the ForwardBatch's host fields and the
shapes of its tensors), then, for an eager step, the batch's tensors by broadcast on the model's group (device to
device under NCCL: no host copy). `serve_steps` is the other ranks' loop: it receives each call and makes it on
its own model, cache and graphs. All ranks therefore run the same forward with the same KV block ids and state
slots (each on its own cache, built identically from the driver's resolved EngineConfig), meet in the same
collectives, and end with the same logits; only rank 0 samples from them.

Every message carries a step number, so a rank that falls out of step is caught (and named) at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import torch

from ..model.forward_batch import ForwardBatch
from ..model.parallel import ParallelError
from .distributed import Ranks

STOP, CONFIG, FORWARD, DECODE_GRAPH, PREFILL_GRAPH = "stop", "config", "forward", "decode_graph", "prefill_graph"


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
    """The driver runner's DecodeGraphs / PrefillGraphs: each run(...) is sent to the other ranks first."""

    def __init__(self, graphs, kind: str, channel: StepChannel):
        self._graphs, self._kind, self._channel = graphs, kind, channel

    def run(self, *args):
        self._channel.ranks.check_workers()
        self._channel.send(self._kind, args)
        return _collective(self._channel.ranks, lambda: self._graphs.run(*args))

    def __getattr__(self, name):
        return getattr(self._graphs, name)


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
    channel.send(CONFIG, config)
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
    from .engine import LLMEngine

    channel = StepChannel(ranks)
    kind, config = channel.receive()
    if kind != CONFIG:
        raise ParallelError(f"tensor-parallel rank {ranks.rank}: expected the engine config first, received {kind}")
    engine = LLMEngine(model, None, (), config)
    runner = engine.runner
    with torch.inference_mode():
        while True:
            kind, payload = channel.receive()
            if kind == STOP:
                return
            if kind == FORWARD:
                model(payload, engine.cache)
            elif kind == DECODE_GRAPH:
                runner.graphs.run(*payload)
            elif kind == PREFILL_GRAPH:
                runner.prefill_graphs.run(*payload)
            else:
                raise ParallelError(f"tensor-parallel rank {ranks.rank}: unknown step message {kind!r}")


def start_parallel_llm(llm, tok, options, device: str, dtype, load, setup) -> None:
    """LLM(tensor_parallel_size > 1): start (or join) the ranks and load this rank's shard - load(device, parallel,
    vision) -> LoadedCheckpoint; rank 0 then builds its engine (setup(checkpoint)) and drives the others, while a
    rank > 0 (external launcher) serves rank 0's steps and returns when it stops."""
    import atexit

    from ..model.config import ModelConfig
    from ..model.tp_layout import TPLayout
    from .distributed import start_ranks

    options.check()
    # a size the model cannot be split by is refused here, before any process starts
    TPLayout(ModelConfig.from_dir(llm.model_dir), 0, options.tensor_parallel_size, options.enable_expert_parallel)
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
