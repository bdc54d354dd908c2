"""What chat and completions share: the server's state, request -> SamplingParams, prompt checks, submitting a
request's choices to the engine, merging their streams, SSE framing, and giving up when the client goes away."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..engine.llm import samples_of
from ..engine.async_engine import AsyncLLMEngine, EngineDeadError, QueueFullError, RequestStream
from ..engine.outputs import RequestOutput
from ..engine.sampling_params import SamplingParams, SamplingParamsError
from ..engine.tokenizer import TokenizerInfo
from ..structured.openai_request import request_structured_outputs
from ..structured.params import StructuredOutputsError, StructuredOutputsParams
from .args import DEFAULT_MAX_REQUEST_BYTES
from .errors import APIError
from .metrics import ServerMetrics
from .protocol import SamplingFields

# generation_config.json keys that set a request's defaults (vLLM's --generation-config auto reads the same)
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class ServerConfig:
    served_model_names: list[str]
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    model_root: str = ""  # where the weights came from (/v1/models "root")
    allowed_local_media_path: str | None = None  # image parts may name files under this directory
    generation_defaults: dict = field(default_factory=dict)


@dataclass
class ServerState:
    engine: AsyncLLMEngine
    tokenizer: TokenizerInfo
    config: ServerConfig
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.config.served_model_names[0]

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    def check_model(self, model: str | None) -> str:
        if model is not None and model not in self.config.served_model_names:
            raise APIError(404, f"the model `{model}` does not exist; this server serves "
                           f"{', '.join(self.config.served_model_names)}", param="model", code="model_not_found")
        return model or self.model_name

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ---- parameters -------------------------------------------------------------------------------------------------------
def refuse_unsupported(req: SamplingFields) -> None:
    found = req.unsupported()
    if found is not None:
        raise APIError(400, f"{found[0]}: {found[1]}", param=found[0], code="unsupported")


def max_tokens_for(num_prompt: int, requested: int | None, max_model_len: int, prompt_field: str) -> int | None:
    """Check a prompt against the context; the max_tokens to ask of the engine (None: the rest of the context)."""
    if num_prompt >= max_model_len:
        raise APIError(400, f"{prompt_field}: the prompt has {num_prompt} tokens; this model's max_model_len is "
                       f"{max_model_len} (one position is kept for the first output token)", param=prompt_field,
                       code="context_length_exceeded")
    if requested is not None and num_prompt + requested > max_model_len:
        raise APIError(400, f"max_tokens: {requested} output tokens after a {num_prompt}-token prompt exceed this "
                       f"model's max_model_len of {max_model_len}", param="max_tokens",
                       code="context_length_exceeded")
    return requested


def structured_outputs(req: SamplingFields, enable_thinking: bool) -> StructuredOutputsParams | None:
    """The request's output constraint (response_format, forced tool calls, structured_outputs, guided_*), if any;
    with the reasoning open in the prompt it starts after </think>."""
    try:
        return request_structured_outputs(req.model_dump(exclude_none=True), enable_thinking)
    except StructuredOutputsError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_structured_output") from None


def sampling_params(req: SamplingFields, max_tokens: int | None, defaults: dict,
                    structured: StructuredOutputsParams | None = None) -> list[SamplingParams]:
    """One SamplingParams per choice (n), seeded as LLM.generate seeds a prompt's n samples (engine.llm.samples_of:
    choice 0 takes the seed, choice j one derived from it)."""

    def pick(name, fallback):
        value = getattr(req, name)
        return value if value is not None else defaults.get(name, fallback)

    try:
        base = SamplingParams(
            temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0), top_k=pick("top_k", 0),
            min_p=pick("min_p", 0.0), repetition_penalty=pick("repetition_penalty", 1.0),
            presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
            seed=req.seed, max_tokens=max_tokens, stop=req.stop, stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos, include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens, structured_outputs=structured,
            logprobs=req.engine_logprobs(), n=req.n,
        )
    except SamplingParamsError as e:
        text = str(e)
        param = text.split(" ", 1)[0].removeprefix("SamplingParams.").split("[", 1)[0]
        raise APIError(400, text.removeprefix("SamplingParams."), param=param, code="invalid_value") from None
    return samples_of(base)


# ---- running the choices ------------------------------------------------------------------------------------------
@dataclass
class Choice:
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    engine_kwargs: dict = field(default_factory=dict)  # LLMEngine.add_request's snapshot_hints, images


async def submit(state: ServerState, request_id: str, choices: Sequence[Choice]) -> list[RequestStream]:
    """Add every choice to the engine; all or none (a refused one aborts those already added)."""
    engine = state.engine
    try:
        engine.check_capacity(len(choices))
    except QueueFullError as e:
        state.metrics.rejected.inc()
        raise APIError(503, f"server busy: {e}; retry later", code="queue_full", headers={"Retry-After": "1"}) from None
    streams: list[RequestStream] = []
    try:
        for c in choices:
            streams.append(await engine.add_request(c.prompt_ids, c.params, f"{request_id}-{c.index}", c.prompt,
                                                    **c.engine_kwargs))
    except BaseException as e:
        for s in streams:
            s.abort()
        if isinstance(e, EngineDeadError):
            raise APIError(503, "the engine is not running", code="engine_dead") from None
        if isinstance(e, ValueError):
            raise APIError(400, str(e), code="invalid_request") from None
        raise
    return streams


async def merged(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(position in `streams`, output) from every stream as they come; leaving early aborts the unfinished ones."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            if not streams[0].finished:
                streams[0].abort()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        pending = len(streams)
        while pending:
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield i, item
            pending -= item.finished
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            if not s.finished:
                s.abort()


async def collect(streams: Sequence[RequestStream]) -> list[RequestOutput]:
    """Each stream's final output (non-streaming requests)."""
    final: list[RequestOutput | None] = [None] * len(streams)
    async for i, out in merged(streams):
        final[i] = out
    return final  # type: ignore[return-value]


class ClientGone(Exception):
    """The client disconnected before the answer was ready; the work was aborted."""


async def unless_disconnected(request: Request, work: Awaitable):
    """Run `work`; if the client disconnects first, cancel it (aborting its requests) and raise ClientGone."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    return task.result()


def engine_error(e: BaseException) -> APIError:
    if isinstance(e, EngineDeadError):
        return APIError(503, "the engine is not running", code="engine_dead")
    return APIError(500, "internal server error", code="internal_error")


# ---- SSE ------------------------------------------------------------------------------------------------------------
def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """An SSE response that aborts its requests however it ends (even a client gone before the first event)."""

    def __init__(self, events: AsyncIterator[str], streams: Sequence[RequestStream]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for s in self.streams:
                if not s.finished:
                    s.abort()


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def cached_tokens(out: RequestOutput) -> int:
    """Prompt tokens of a request that the prefix cache served."""
    return out.metrics.num_cached_tokens if out.metrics is not None else 0
