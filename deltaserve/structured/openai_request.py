"""OpenAI / vLLM request fields -> StructuredOutputsParams (for the server; pure dict handling, no grammar library).

Fields read from a chat or completion request body (the spellings users of vLLM send):
  response_format   {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name",
                    "schema", "strict"}} | {"type": "structural_tag", "format": {...}}
  tools + tool_choice   "required" or {"type": "function", "function": {"name": ...}} force Qwen XML tool calls
                    (tool_calls.py); "auto" / "none" / absent leave the reply free; parallel_tool_calls (default
                    true) allows more than one call under "required"
  structured_outputs    vLLM's object: {"json": ..., "regex": ..., "choice": [...], "grammar": ..., "json_object":
                    true, "structural_tag": ..., "disable_any_whitespace": ...}
  guided_json, guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern   vLLM's older extra fields
                    (guided_decoding_backend is accepted and ignored: there is one backend)

At most one of these may constrain a request; errors are StructuredOutputsError with `param` naming the field, for
an OpenAI-shaped 400. `enable_thinking`: the prompt was rendered with the reasoning open (chat requests of a
thinking model), so the constraint starts after </think>.
"""

from __future__ import annotations

import json
from typing import Any

from .params import StructuredOutputsError, StructuredOutputsParams
from .tool_calls import tool_call_params

GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}


def response_format_params(response_format: Any) -> StructuredOutputsParams | None:
    """OpenAI's response_format -> params (None for absent or {"type": "text"})."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise StructuredOutputsError("response_format.json_schema.schema must be a JSON schema object, found "
                                         f"{schema!r}", "response_format")
        return _params("response_format.json_schema.schema", "response_format", json=schema)
    if kind == "structural_tag":
        return _params("response_format", "response_format", structural_tag=json.dumps(response_format))
    raise StructuredOutputsError("response_format.type must be 'text', 'json_object', 'json_schema' or "
                                 f"'structural_tag', found {kind!r}", "response_format")


def guided_params(body: dict) -> StructuredOutputsParams | None:
    """vLLM's structured_outputs object or its older guided_* fields -> params (None when absent)."""
    if body.get("guided_whitespace_pattern") is not None:
        raise StructuredOutputsError("guided_whitespace_pattern is not supported (the grammar library has no "
                                     "whitespace pattern); use structured_outputs.disable_any_whitespace",
                                     "guided_whitespace_pattern")
    given = [f for f in GUIDED_FIELDS if body.get(f) is not None]
    if body.get("structured_outputs") is not None:
        if given:
            raise StructuredOutputsError(f"structured_outputs and {given[0]} both constrain the reply: send one",
                                         "structured_outputs")
        return StructuredOutputsParams.from_dict(body["structured_outputs"])
    if not given:
        return None
    if len(given) > 1:
        raise StructuredOutputsError(f"{' and '.join(given)} both constrain the reply: send one", given[1])
    field = given[0]
    value = body[field]
    if field == "guided_json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise StructuredOutputsError(f"guided_json is not valid JSON: {e}", field) from None
    return _params(field, field, **{GUIDED_FIELDS[field]: value})


def request_structured_outputs(body: dict, enable_thinking: bool = False) -> StructuredOutputsParams | None:
    """The constraint of one request body (chat or completion), or None when its reply is free.

    enable_thinking: the chat prompt opens the model's reasoning (the server rendered it with enable_thinking on);
    the constraint then applies after </think>. Pass False for completions and for chats rendered without it."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    fmt = response_format_params(body.get("response_format"))
    if fmt is not None:
        found.append(("response_format", fmt))
    tools = tool_call_params(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls", True))
    if tools is not None:
        found.append(("tool_choice", tools))
    guided = guided_params(body)
    if guided is not None:
        found.append(("structured_outputs", guided))
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise StructuredOutputsError(f"{names} both constrain the reply: send one", found[1][0])
    return found[0][1].clone(after_think=bool(enable_thinking))


def _params(field: str, param: str, **kwargs) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**kwargs)
    except StructuredOutputsError as e:
        raise StructuredOutputsError(f"{field}: {e}", param) from None
