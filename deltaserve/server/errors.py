"""The OpenAI error object, and reading a request body into a protocol model with errors that name the field.

Every failure a client can cause answers {"error": {"message", "type", "param", "code"}} with its HTTP status; an
unexpected server fault answers 500 with a generic message (the trace goes to the log, never into the body).
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("deltaserve.server")

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
         500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


# ---- bodies -----------------------------------------------------------------------------------------------------------
async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 past `limit` bytes (by its Content-Length, or while it arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_model(raw: bytes, model: type[BaseModel]):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid UTF-8 (byte {e.start})", code="invalid_utf8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


_UNION_TAGS = ("str", "int", "float", "bool", "list", "dict", "none")


def _param(loc) -> str:
    """pydantic's error location -> 'messages[0].role' (union branch names such as 'list[int]' left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or part in _UNION_TAGS or part.startswith(("function-", "literal[")) or part[:1].isupper():
            continue
        else:
            out += ("." if out else "") + part
    return out


def validation_error(e: ValidationError) -> APIError:
    errors = e.errors()
    # a value that fits no form of a union fails every branch: the branch it got furthest into explains it best
    first = max(errors, key=lambda err: len([p for p in err["loc"] if _param([p])]))
    param = _param(first["loc"])
    found = first.get("input")
    shown = "" if first["type"] in ("missing", "extra_forbidden") else f" (found {json.dumps(found, default=str)[:80]})"
    if first["type"] == "extra_forbidden":
        message = f"{param}: unknown field"
    else:
        message = f"{param or 'body'}: {first['msg'].removeprefix('Value error, ')}{shown}"
    return APIError(400, message, param=param or None, code=first["type"])


# ---- handlers -----------------------------------------------------------------------------------------------------------
def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        errors = e.errors()
        loc = errors[0]["loc"][1:] if errors else ()
        return error_response(APIError(400, f"{_param(loc) or 'request'}: {errors[0]['msg'] if errors else 'invalid'}",
                                       param=_param(loc) or None))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed on "
                   f"{request.url.path}"}.get(e.status_code, str(e.detail))
        return error_response(APIError(e.status_code, message, headers=getattr(e, "headers", None)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("error serving %s %s", request.method, request.url.path)
        return error_response(APIError(500, "internal server error", code="internal_error"))
