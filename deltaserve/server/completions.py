"""POST /v1/completions: raw prompts (text, token ids, or a list of either) -> `text_completion` answers or SSE chunks.

Choice index = prompt index * n + choice within the prompt (OpenAI's order). No chat template, no reasoning split.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.async_engine import RequestStream
from .errors import APIError, parse_model, read_body
from .logprobs import LogprobFormatter, new_logprobs
from .protocol import CompletionRequest
from .serving import (SSE_DONE, Choice, ClientGone, EventStream, ServerState, cached_tokens, collect, engine_error, max_tokens_for,
                      merged, new_id, refuse_unsupported, sampling_params, sse, structured_outputs, submit,
                      unless_disconnected, usage)

MAX_PROMPTS = 64


def prompt_choices(state: ServerState, req: CompletionRequest) -> tuple[list[Choice], list[str], int]:
    """The engine choices, each prompt's text (for echo) and the prompt tokens counted for usage."""
    prompts = req.prompts()
    if not prompts:
        raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
    if len(prompts) > MAX_PROMPTS:
        raise APIError(400, f"prompt: at most {MAX_PROMPTS} prompts per request, found {len(prompts)}",
                       param="prompt", code="invalid_value")
    choices, texts, num_prompt = [], [], 0
    vocab = state.engine.engine.vocab_size
    structured = structured_outputs(req, enable_thinking=False)
    for p_index, p in enumerate(prompts):
        name = "prompt" if len(prompts) == 1 else f"prompt[{p_index}]"
        if isinstance(p, str):
            ids, text = state.encode(p, add_special_tokens=True), p
        else:
            bad = [t for t in p if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"{name}: token ids must be in [0, {vocab}), found {bad[0]}", param=name,
                               code="invalid_value")
            ids, text = list(p), None
        if not ids:
            raise APIError(400, f"{name}: the prompt is empty (no tokens)", param=name, code="invalid_value")
        max_tokens = max_tokens_for(len(ids), req.max_tokens, state.max_model_len, name)
        for k, params in enumerate(sampling_params(req, max_tokens, state.config.generation_defaults, structured)):
            choices.append(Choice(p_index * req.n + k, ids, params, text))
        if req.echo and text is None:
            text = state.tokenizer.tokenizer.decode(ids, skip_special_tokens=False)
        texts.append(text or "")
        num_prompt += len(ids)
    return choices, texts, num_prompt


async def create_completion(state: ServerState, request: Request) -> Response:
    req = parse_model(await read_body(request, state.config.max_request_bytes), CompletionRequest)
    model = state.check_model(req.model)
    refuse_unsupported(req)
    choices, texts, num_prompt = prompt_choices(state, req)
    rid = new_id("cmpl")
    streams = await submit(state, rid, choices)
    echo = [texts[c.index // req.n] if req.echo else "" for c in choices]
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        fmt = None if req.logprobs is None else LogprobFormatter(state.tokenizer.tokenizer, req.logprobs)
        events = completion_events(rid, model, int(time.time()), streams, echo, include_usage, num_prompt,
                                   req.return_token_ids, req.n, fmt)
        return EventStream(events, streams)
    try:
        finals = await unless_disconnected(request, collect(streams))
    except ClientGone:
        return Response(status_code=499)
    except Exception as e:  # noqa: BLE001
        raise engine_error(e) from None
    fmt = None if req.logprobs is None else LogprobFormatter(state.tokenizer.tokenizer, req.logprobs)
    out_choices = [{"index": i, "text": echo[i] + out.text,
                    "logprobs": None if fmt is None else fmt.completion(out.token_ids, out.logprobs, len(echo[i])),
                    "finish_reason": out.finish_reason, "stop_reason": out.stop_reason} for i, out in enumerate(finals)]
    if req.return_token_ids:
        for c, out, choice in zip(out_choices, finals, choices):
            c["token_ids"], c["prompt_token_ids"] = out.token_ids, choice.prompt_ids
    return JSONResponse({"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                         "choices": out_choices, "usage": usage(num_prompt, sum(len(o.token_ids) for o in finals),
                                                                _cached_per_prompt(finals, req.n))})


def _cached_per_prompt(finals, n: int) -> int:
    """Prompt tokens served from the prefix cache, counted once per prompt (its choices share the prompt)."""
    return sum(max(cached_tokens(o) for o in finals[k:k + n]) for k in range(0, len(finals), n))


async def completion_events(rid: str, model: str, created: int, streams: list[RequestStream], echo: list[str],
                            include_usage: bool, num_prompt: int, token_ids: bool = False, n: int = 1,
                            fmt: LogprobFormatter | None = None):
    pending_echo = list(echo)
    pending_lps: list[tuple[list, list]] = [([], []) for _ in streams]  # tokens whose text is not out yet
    offsets = [len(e) for e in echo]  # text_offset of each choice's next reported token (its tokens' texts summed)
    completion_tokens = [0] * len(streams)
    finals: list = [None] * len(streams)

    def chunk(i: int, text: str, finish: str | None = None, stop_reason=None, ids=None) -> str:
        lps = None
        if fmt is not None:
            lps = fmt.completion(*pending_lps[i], offsets[i])
            offsets[i] += sum(len(t) for t in lps["tokens"])
            pending_lps[i] = ([], [])
        choice = {"index": i, "text": text, "logprobs": lps, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = stop_reason
        if token_ids:
            choice["token_ids"] = ids or []
        return sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]})

    try:
        async for i, out in merged(streams):
            completion_tokens[i] = len(out.token_ids)
            if out.finished:
                finals[i] = out
            text, pending_echo[i] = pending_echo[i] + out.new_text, ""
            if fmt is not None:
                new_ids, new_lps = new_logprobs(out)
                pending_lps[i][0].extend(new_ids)
                pending_lps[i][1].extend(new_lps)
            if out.finished:
                yield chunk(i, text, out.finish_reason, out.stop_reason, out.new_token_ids)
            elif text or (token_ids and out.new_token_ids):
                yield chunk(i, text, ids=out.new_token_ids)
        if include_usage:
            yield sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                       "usage": usage(num_prompt, sum(completion_tokens), _cached_per_prompt(finals, n))})
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001
        yield sse(engine_error(e).body())
    yield SSE_DONE
