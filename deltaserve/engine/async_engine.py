"""AsyncLLMEngine: one engine thread that keeps stepping an LLMEngine while coroutines add, stream and abort requests.

LLMEngine is not thread-safe, so exactly one thread (the engine thread) ever touches it. Coroutines talk to it
through an inbox (adds and aborts, drained between steps, in arrival order) and get their outputs through one
asyncio queue per request, fed with `loop.call_soon_threadsafe` (one call per event loop per step, not per token).

    engine = AsyncLLMEngine(LLMEngine(...)); engine.start()
    async for out in engine.generate(prompt_ids, params, request_id="r1"):   # RequestOutput deltas
        ...
    engine.abort("r1")          # from any coroutine or thread; blocks and state slot are freed before the next step

A consumer that stops iterating (a client that went away: the coroutine is cancelled) aborts its request in
`generate`'s `finally`. An error in `step()` is fatal: every open stream raises EngineDeadError and so does every
later add (the server's /health then answers 503); a bad request only fails its own add.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Sequence

from .engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread stopped (an error in a step, or shutdown); nothing more can be served."""


class QueueFullError(RuntimeError):
    """More requests than running slots + the waiting limit: the caller should retry later."""


@dataclass(frozen=True)
class EngineStats:
    """The scheduler's state after the last step (read on the engine thread, published as one immutable object)."""

    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 1
    state_slots_used: int = 0
    state_slots_total: int = 1
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache so far (cumulative; 0 without one)
    prefix_hits: int = 0  # of those, tokens served from it
    spec_steps: int = 0  # speculative decoding (cumulative; 0 without it): drafting steps of requests,
    spec_drafted: int = 0  # draft tokens verified,
    spec_accepted: int = 0  # and those accepted


class EngineObserver(Protocol):
    """Called on the engine thread (so it may keep per-request state without locks); must not raise or block."""

    def on_add(self, request_id: str, submitted: float, num_prompt_tokens: int) -> None: ...
    def on_step(self, outputs: Sequence[RequestOutput], now: float, stats: EngineStats) -> None: ...
    def on_abort(self, request_id: str) -> None: ...


class RequestStream:
    """One request's outputs, delivered on its caller's event loop. Iterate with `async for out in stream`; leaving
    the loop before the request finished (break, an exception, cancellation) aborts it."""

    def __init__(self, engine: "AsyncLLMEngine", request_id: str, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()  # RequestOutput, or an exception to raise
        self.accepted: asyncio.Future = loop.create_future()  # the engine thread's verdict on the add
        self.finished = False

    async def next_batch(self) -> list[RequestOutput]:
        """Every output queued so far (at least one); raises what the engine thread sent instead."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        for item in items:
            if isinstance(item, BaseException):
                raise item
        return items

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                out = merge_outputs(await self.next_batch())
                self.finished = out.finished
                yield out
        finally:
            if not self.finished:
                self.abort()

    def abort(self) -> None:
        self.engine.abort(self.request_id)


def merge_outputs(outs: list[RequestOutput]) -> RequestOutput:
    """Outputs of consecutive steps as one (a consumer that fell behind sends one chunk, not several)."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    last.new_text = "".join(o.new_text for o in outs)
    last.new_token_ids = [t for o in outs for t in o.new_token_ids]
    return last


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, observer: EngineObserver | None = None,
                 max_queued_requests: int | None = None):
        self.engine = engine
        self.observer = observer
        # unfinished requests allowed beyond the running slots (None: no limit); more -> QueueFullError
        self.max_queued_requests = max_queued_requests
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._inbox: deque[tuple] = deque()  # ("add", rid, ids, params, prompt, submitted, kwargs) | ("abort", rid)
        self._streams: dict[str, RequestStream] = {}  # guarded by _cond's lock
        self._live: set[str] = set()  # engine thread only: ids added to the engine and not yet finished/aborted
        self._stopping = False
        self._error: BaseException | None = None
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="deltaserve-engine", daemon=True)

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> "AsyncLLMEngine":
        self._publish_stats()  # before the engine thread owns the engine
        self._thread.start()
        return self

    def shutdown(self, timeout: float | None = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._error is None and not self._stopping

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def num_unfinished(self) -> int:
        """Requests added (or being added) and not yet finished or aborted."""
        with self._cond:
            return len(self._streams)

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    # ---- requests ----------------------------------------------------------------------------------------------
    async def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str,
                          prompt: str | None = None, **engine_kwargs) -> RequestStream:
        """Queue a request; returns its stream once the engine thread accepted it (the engine's ValueError if it
        refused it: a prompt too long, a token id out of range, a cache too small for it, a bad image).
        engine_kwargs go to LLMEngine.add_request (snapshot_hints, images, cache_salt)."""
        stream = self._register(request_id)
        with self._cond:
            self._inbox.append(("add", request_id, list(prompt_token_ids), params, prompt, time.perf_counter(),
                                engine_kwargs))
            self._cond.notify()
        try:
            await stream.accepted
        except BaseException:
            self.abort(request_id)  # refused (then a no-op), or the caller was cancelled while waiting
            raise
        return stream

    def check_capacity(self, count: int = 1) -> None:
        """Raise QueueFullError if `count` more requests would exceed running slots + max_queued_requests."""
        if self.max_queued_requests is None:
            return
        limit = self.engine.config.max_num_seqs + self.max_queued_requests
        if self.num_unfinished + count > limit:
            raise QueueFullError(f"{self.num_unfinished} requests in flight; the server takes at most {limit} "
                                 f"({self.engine.config.max_num_seqs} running + {self.max_queued_requests} waiting)")

    def _register(self, request_id: str) -> RequestStream:
        if self._error is not None or self._stopping:
            raise EngineDeadError(f"the engine is not running ({self._error or 'shut down'})")
        with self._cond:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            stream = self._streams[request_id] = RequestStream(self, request_id, asyncio.get_running_loop())
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request (thread-safe, never blocks); a finished or unknown id is ignored."""
        with self._cond:
            if self._streams.pop(request_id, None) is None:
                return
            self._inbox.append(("abort", request_id))
            self._cond.notify()

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str | None = None,
                       prompt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its outputs (deltas in new_text / new_token_ids) until it finishes. Leaving the
        loop early (break, an exception, cancellation) aborts it."""
        stream = await self.add_request(prompt_token_ids, params, request_id or self.new_request_id(), prompt)
        async for out in stream:
            yield out

    # ---- the engine thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                items = self._take_inbox(block=not self.engine.has_unfinished())
                if items is None:
                    break
                for item in items:
                    self._handle(item)
                if self.engine.has_unfinished():
                    outputs = self.engine.step()
                    now = time.perf_counter()
                    self._publish_stats()
                    self._observe("on_step", outputs, now, self.stats)
                    self._dispatch(outputs)
                elif items:
                    self._publish_stats()
                    self._observe("on_step", (), time.perf_counter(), self.stats)
        except BaseException as e:  # noqa: BLE001 - fatal: reported to every stream and to /health
            self._error = e
        finally:
            self._fail_all(EngineDeadError(f"the engine stopped: {self._error!r}" if self._error
                                           else "the engine was shut down"))

    def _take_inbox(self, block: bool) -> list[tuple] | None:
        """Everything queued (waiting for something when idle); None once shutdown was asked."""
        with self._cond:
            while block and not self._inbox and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            items = list(self._inbox)
            self._inbox.clear()
            return items

    def _handle(self, item: tuple) -> None:
        if item[0] == "abort":
            rid = item[1]
            if rid in self._live:
                self._live.discard(rid)
                self.engine.abort(rid)  # frees its KV blocks and state slot now
                self._observe("on_abort", rid)
            return
        _, rid, ids, params, prompt, submitted, engine_kwargs = item
        with self._cond:
            stream = self._streams.get(rid)
        if stream is None:  # aborted before the engine saw it
            return
        try:
            self.engine.add_request(ids, params, request_id=rid, prompt=prompt, **engine_kwargs)
        except (ValueError, TypeError) as e:  # a bad request: only its caller hears of it
            with self._cond:
                self._streams.pop(rid, None)
            stream.loop.call_soon_threadsafe(_settle, stream.accepted, e)
            return
        self._live.add(rid)
        self._observe("on_add", rid, submitted, len(ids))
        stream.loop.call_soon_threadsafe(_settle, stream.accepted, None)

    def _observe(self, method: str, *args) -> None:
        """Tell the observer (metrics); its failure is logged, never allowed to stop the serving."""
        if self.observer is None:
            return
        try:
            getattr(self.observer, method)(*args)
        except Exception:  # noqa: BLE001
            logger.exception("engine observer %s failed", method)

    def _dispatch(self, outputs: Sequence[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        with self._cond:
            for out in outputs:
                if out.finished:
                    self._live.discard(out.request_id)
                    stream = self._streams.pop(out.request_id, None)
                else:
                    stream = self._streams.get(out.request_id)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream, out))
        for loop, pairs in by_loop.items():
            _call_soon(loop, _deliver, pairs)

    def _publish_stats(self) -> None:
        s = self.engine.scheduler
        cache = getattr(self.engine, "prefix_cache", None)
        spec = getattr(self.engine, "spec_stats", None)
        self.stats = EngineStats(
            running=len(s.running), waiting=len(s.waiting),
            kv_blocks_used=s.blocks.num_blocks - s.blocks.num_free, kv_blocks_total=s.blocks.num_blocks,
            state_slots_used=s.slots.num_slots - s.slots.num_free, state_slots_total=s.slots.num_slots,
            prefix_queries=cache.queries if cache is not None else 0, prefix_hits=cache.hits if cache is not None else 0,
            **({} if spec is None else dict(spec_steps=spec.steps, spec_drafted=spec.drafted,
                                            spec_accepted=spec.accepted)),
        )

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            _call_soon(stream.loop, _fail, stream, error)


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _deliver(pairs: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in pairs:
        stream.queue.put_nowait(out)


def _fail(stream: RequestStream, error: BaseException) -> None:
    _settle(stream.accepted, error)
    stream.queue.put_nowait(error)
