"""The FastAPI app: routes, API-key check, the chat page.

  POST /v1/chat/completions  POST /v1/completions  GET /v1/models        (API key, when one is set)
  POST /tokenize             POST /detokenize                            (API key, when one is set)
  GET /health                GET /metrics          GET / (the chat page) (open)
"""

from __future__ import annotations

import hmac
from importlib import resources

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from .chat import create_chat_completion, render_prompt, resolve_tools
from .completions import create_completion
from .errors import APIError, install_handlers, parse_model, read_body
from .protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from .serving import ServerState


def chat_page() -> str:
    return resources.files(__package__).joinpath("static/chat.html").read_text(encoding="utf-8")


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="deltaserve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install_handlers(app)
    key = state.config.api_key.encode() if state.config.api_key else None
    page = chat_page()

    async def require_key(request: Request) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    guarded = [Depends(require_key)]

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(request: Request):
        return await create_chat_completion(state, request)

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(request: Request):
        return await create_completion(state, request)

    @app.get("/v1/models", dependencies=guarded)
    async def models():
        data = [{"id": name, "object": "model", "created": state.created, "owned_by": "deltaserve",
                 "root": state.config.model_root or name, "parent": None, "max_model_len": state.max_model_len}
                for name in state.config.served_model_names]
        return {"object": "list", "data": data}

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(request: Request):
        req = parse_model(await read_body(request, state.config.max_request_bytes), TokenizeRequest)
        state.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        if req.prompt is not None:
            ids = state.encode(req.prompt, req.add_special_tokens)
        else:
            chat = ChatCompletionRequest(messages=req.messages, tools=req.tools,
                                         chat_template_kwargs=req.chat_template_kwargs)
            ids = state.encode(render_prompt(state, chat, resolve_tools(chat)).text, add_special_tokens=False)
        return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}

    @app.post("/detokenize", dependencies=guarded)
    async def detokenize(request: Request):
        req = parse_model(await read_body(request, state.config.max_request_bytes), DetokenizeRequest)
        state.check_model(req.model)
        vocab = state.engine.engine.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens: ids must be in [0, {vocab}), found {bad[0]}", param="tokens")
        return {"prompt": state.tokenizer.tokenizer.decode(req.tokens, skip_special_tokens=False)}

    @app.get("/health")
    async def health():
        if not state.engine.is_alive:
            return JSONResponse(APIError(503, "the engine is not running", code="engine_dead").body(), 503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.exposition(), media_type=state.metrics.content_type)

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(page)

    return app
