"""POST /v1/chat/completions: messages -> the checkpoint's chat template -> the engine -> reasoning, content and
tool calls, as one JSON answer or as SSE chunks (`chat.completion.chunk`, then `data: [DONE]`).

Tools: `tool_choice` "auto" (the default when tools are given) renders them into the prompt and parses the replies'
Qwen3-Coder calls; "required" and a named function do the same with the reply constrained to such calls
(deltaserve/structured); "none" leaves them out of the prompt and parses nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.async_engine import RequestStream
from ..engine.chat import ChatTemplateError, render_chat
from ..engine.multimodal import split_images
from .errors import APIError, parse_model, read_body
from .protocol import ChatCompletionRequest, Message
from .logprobs import LogprobFormatter, new_logprobs
from .reasoning import prompt_opens_reasoning
from .reply import ReplyDelta, ReplyParser, parse_reply
from .serving import (SSE_DONE, Choice, ClientGone, EventStream, cached_tokens, ServerState, collect, engine_error, max_tokens_for, merged,
                      new_id, refuse_unsupported, sampling_params, sse, structured_outputs, submit,
                      unless_disconnected, usage)

RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt")


def template_messages(messages: list[Message]) -> list[dict]:
    """OpenAI messages as the chat template reads them (tool call arguments as mappings; content parts as sent:
    text, and images that `split_images` takes out)."""
    out = []
    for i, m in enumerate(messages):
        d: dict = {"role": "system" if m.role == "developer" else m.role}
        if isinstance(m.content, list):
            d["content"] = [part.model_dump(exclude_none=True) for part in m.content]
        else:
            d["content"] = m.content if m.content is not None else ""
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(m, key) is not None:
                d[key] = getattr(m, key)
        if m.tool_calls:
            d["tool_calls"] = [_tool_call_for_template(i, j, c) for j, c in enumerate(m.tool_calls)]
        out.append(d)
    return out


def _tool_call_for_template(i: int, j: int, call) -> dict:
    args = call.function.arguments
    if isinstance(args, str):
        param = f"messages[{i}].tool_calls[{j}].function.arguments"
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise APIError(400, f"{param}: not valid JSON ({e.msg})", param=param, code="invalid_json") from None
        if not isinstance(args, dict):
            raise APIError(400, f"{param}: must be a JSON object", param=param, code="invalid_value")
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": args}}


def resolve_tools(req: ChatCompletionRequest) -> list[dict] | None:
    """The tools to render and parse (None: none)."""
    if not req.tools:
        if req.tool_choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice: needs tools", param="tool_choice", code="invalid_value")
        return None
    if req.tool_choice == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


@dataclass
class ChatPrompt:
    text: str
    messages: list[dict]  # as rendered (image parts reduced to {"type": "image"})
    images: list  # one per image placeholder, in order
    kwargs: dict  # chat_template_kwargs


def render_prompt(state: ServerState, req: ChatCompletionRequest, tools: list[dict] | None) -> ChatPrompt:
    info = state.tokenizer
    if not info.chat_template:
        raise APIError(400, "this model has no chat template: use /v1/completions", code="no_chat_template")
    kwargs = dict(req.chat_template_kwargs or {})
    bad = [k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS]
    if bad:
        raise APIError(400, f"chat_template_kwargs: {bad[0]!r} is set by the server", param="chat_template_kwargs")
    try:
        messages, images = split_images(template_messages(req.messages))
        text = render_chat(info.chat_template, messages, tools, True, info.special_tokens, **kwargs)
    except ChatTemplateError as e:
        raise APIError(400, f"messages: {e}", param="messages", code="invalid_messages") from None
    except ValueError as e:  # an image part the server cannot read, a video
        raise APIError(400, str(e), param="messages", code="invalid_messages") from None
    return ChatPrompt(text, messages, [_image_source(state, i, im) for i, im in enumerate(images)], kwargs)


def _image_source(state: ServerState, index: int, source) -> object:
    """An image a client sent: a data: URL, or a file under --allowed-local-media-path (a client must not make the
    server read its own files otherwise); http(s) URLs are not fetched."""
    if isinstance(source, str) and source[:5].lower() == "data:":
        return source
    root = state.config.allowed_local_media_path
    if isinstance(source, str) and root is not None:
        path = Path(source[7:] if source[:7].lower() == "file://" else source).resolve()
        if path.is_relative_to(Path(root).resolve()):
            return path
    shown = source[:60] if isinstance(source, str) else type(source).__name__
    allowed = "a data: URL" + (f" or a file under {root}" if root is not None else
                               " (local files need --allowed-local-media-path)")
    raise APIError(400, f"messages: image {index} ({shown!r}) must be {allowed}", param="messages",
                   code="invalid_image")


def message_ends(state: ServerState, prompt: ChatPrompt, tools: list[dict] | None) -> list[int]:
    """Token positions where each message but the last ends: where a later turn of this conversation diverges, so
    the prefix cache snapshots there (as LLM.chat does)."""
    info, ends = state.tokenizer, []
    for i in range(1, len(prompt.messages)):
        text = render_chat(info.chat_template, prompt.messages[:i], tools, False, info.special_tokens,
                           **prompt.kwargs)
        ends.append(len(state.encode(text, add_special_tokens=False)))
    return ends


async def create_chat_completion(state: ServerState, request: Request) -> Response:
    req = parse_model(await read_body(request, state.config.max_request_bytes), ChatCompletionRequest)
    model = state.check_model(req.model)
    refuse_unsupported(req)
    tools = resolve_tools(req)
    prompt = render_prompt(state, req, tools)
    ids = state.encode(prompt.text, add_special_tokens=False)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = max_tokens_for(len(ids), requested, state.max_model_len, "messages")
    opens = prompt_opens_reasoning(prompt.text)
    params = sampling_params(req, max_tokens, state.config.generation_defaults, structured_outputs(req, opens))
    extra = {"snapshot_hints": message_ends(state, prompt, tools)}
    if prompt.images:
        extra["images"] = prompt.images
    rid = new_id("chatcmpl")
    streams = await submit(state, rid, [Choice(i, ids, p, prompt.text, extra) for i, p in enumerate(params)])
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = chat_events(rid, model, int(time.time()), streams, opens, tools, include_usage, req.return_token_ids,
                             formatter(state, req))
        return EventStream(events, streams)
    try:
        finals = await unless_disconnected(request, collect(streams))
    except ClientGone:
        return Response(status_code=499)
    except Exception as e:  # noqa: BLE001 - the engine failed under this request
        raise engine_error(e) from None
    fmt = formatter(state, req)
    choices = []
    for i, out in enumerate(finals):
        reply = parse_reply(out.text, opens, tools)
        message = {"role": "assistant", "content": reply.content if reply.content or not reply.tool_calls else None,
                   "reasoning_content": reply.reasoning or None,
                   "tool_calls": [c.to_openai() for c in reply.tool_calls] or None}
        lps = None
        if fmt is not None and out.logprobs is not None:
            lps = {"content": fmt.chat_entries(out.token_ids, out.logprobs)}
        choices.append({"index": i, "message": message, "logprobs": lps,
                        "finish_reason": _finish_reason(out.finish_reason, bool(reply.tool_calls)),
                        "stop_reason": out.stop_reason})
        if req.return_token_ids:
            choices[-1]["token_ids"] = out.token_ids
    body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(len(finals[0].prompt_token_ids), sum(len(o.token_ids) for o in finals),
                           max(cached_tokens(o) for o in finals))}
    if req.return_token_ids:
        body["prompt_token_ids"] = finals[0].prompt_token_ids
    return JSONResponse(body)


def formatter(state: ServerState, req) -> LogprobFormatter | None:
    top = req.engine_logprobs()
    return None if top is None else LogprobFormatter(state.tokenizer.tokenizer, top)


def _finish_reason(reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and reason == "stop" else reason


def _delta(parts: ReplyDelta, first_tool_index: int) -> dict:
    d: dict = {}
    if parts.reasoning:
        d["reasoning_content"] = parts.reasoning
    if parts.content:
        d["content"] = parts.content
    if parts.tool_calls:
        d["tool_calls"] = [c.to_openai(first_tool_index + k) for k, c in enumerate(parts.tool_calls)]
    return d


async def chat_events(rid: str, model: str, created: int, streams: list[RequestStream], opens: bool,
                      tools: list[dict] | None, include_usage: bool, token_ids: bool = False,
                      fmt: LogprobFormatter | None = None):
    parsers = [ReplyParser(opens, tools) for _ in streams]
    pending_lps: list[list[dict]] = [[] for _ in streams]  # entries of tokens whose text is not out yet
    calls_sent = [0] * len(streams)
    completion_tokens = [0] * len(streams)
    num_prompt = cached = 0

    def chunk(i: int, delta: dict, finish: str | None = None, stop_reason=None, ids=None) -> str:
        lps = None
        if pending_lps[i]:
            lps, pending_lps[i] = {"content": pending_lps[i]}, []
        choice = {"index": i, "delta": delta, "logprobs": lps, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = stop_reason
        if token_ids and ids:
            choice["token_ids"] = ids
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [choice]})

    try:
        for i in range(len(streams)):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for i, out in merged(streams):
            completion_tokens[i] = len(out.token_ids)
            num_prompt, cached = len(out.prompt_token_ids), max(cached, cached_tokens(out))
            if fmt is not None:
                pending_lps[i] += fmt.chat_entries(*new_logprobs(out))
            parts = parsers[i].feed(out.new_text)
            if out.finished:
                parts.add(parsers[i].finish())
            ids = out.new_token_ids
            if parts or (token_ids and ids and not out.finished):
                yield chunk(i, _delta(parts, calls_sent[i]), ids=ids)
                calls_sent[i] += len(parts.tool_calls)
                ids = None
            if out.finished:
                yield chunk(i, {}, _finish_reason(out.finish_reason, calls_sent[i] > 0), out.stop_reason, ids)
        if include_usage:
            yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage(num_prompt, sum(completion_tokens), cached)})
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - the stream has started: the error goes into it
        yield sse(engine_error(e).body())
    yield SSE_DONE
