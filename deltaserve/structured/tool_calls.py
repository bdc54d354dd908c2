"""Forced tool calls in the model's own format: the structural tag that makes the reply one or more Qwen3-Coder XML
tool calls naming an allowed function, with schema-valid parameters.

The format (the checkpoint's chat template, spec section 5; calls separated by one newline):

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

A string VALUE is raw text (no quotes; anything but "</parameter>"), any other type is JSON; xgrammar's "qwen_xml"
style of a JSON schema is exactly this parameter list. Nothing may stand before the first call or between calls,
and the reply ends after the last one (the grammar then allows only the end-of-sequence token).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from .params import StructuredOutputsError, StructuredOutputsParams
from .schema_check import check_schema

CALL_BEGIN = "<tool_call>\n<function={name}>\n"
CALL_END = "\n</function>\n</tool_call>"
CALL_SEPARATOR = "\n"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's function-name rule (dots as vLLM allows)


def function_tools(tools: Any) -> dict[str, dict]:
    """name -> parameters schema of OpenAI `tools` ([{"type": "function", "function": {...}}]); checks the shape."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise StructuredOutputsError("tools must be a non-empty list of {'type': 'function', 'function': {...}}",
                                     "tools")
    out: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise StructuredOutputsError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise StructuredOutputsError(f"tools[{i}].function.name must match [A-Za-z0-9_.-]{{1,64}}, found "
                                         f"{name!r}", "tools")
        if name in out:
            raise StructuredOutputsError(f"tools[{i}]: the function name {name!r} appears twice", "tools")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}  # OpenAI: no parameters = an empty parameter list
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise StructuredOutputsError(f"tools[{i}].function.parameters must be a JSON schema of type 'object', "
                                         f"found {params!r}", "tools")
        try:
            check_schema(params, field=f"tools[{i}].function.parameters")
        except StructuredOutputsError as e:
            raise StructuredOutputsError(str(e).replace("structured_outputs.", "", 1), "tools") from None
        out[name] = params
    return out


def forced_tool_names(tools: dict[str, dict], tool_choice: Any) -> list[str] | None:
    """The functions a reply must call under `tool_choice` (None: the reply is not forced to call)."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        return list(tools)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice.get("function"), dict) \
            else None
        if name not in tools:
            raise StructuredOutputsError(f"tool_choice names the function {name!r}, which is not among the tools "
                                         f"({', '.join(tools)})", "tool_choice")
        return [name]
    raise StructuredOutputsError("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                                 f"'function': {{'name': ...}}}}, found {tool_choice!r}", "tool_choice")


def tool_call_tag(tools: dict[str, dict], names: Sequence[str], parallel: bool = True,
                  max_whitespace: int | None = None) -> dict:
    """The xgrammar structural tag: one call (parallel False) or one or more calls, each to one of `names`.

    max_whitespace caps runs of whitespace between the parameters and inside JSON values (not inside string
    values); None leaves the layout to the model (the template's own is single newlines)."""
    content = {"type": "json_schema", "style": "qwen_xml", "max_whitespace_cnt": max_whitespace}
    tags = [{"type": "tag", "begin": CALL_BEGIN.format(name=name), "content": dict(content, json_schema=tools[name]),
             "end": CALL_END} for name in names]
    return {"type": "structural_tag", "format": {
        "type": "tags_with_separator", "tags": tags, "separator": CALL_SEPARATOR,
        "at_least_one": True, "stop_after_first": not parallel,
    }}


def tool_call_params(tools: Any, tool_choice: Any, parallel_tool_calls: bool = True,
                     max_whitespace: int | None = None) -> StructuredOutputsParams | None:
    """StructuredOutputsParams forcing the calls that `tool_choice` asks for ("required": any of the tools, one or
    more when parallel; a named function: exactly one call to it), or None when the reply is free."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tools is None:
        raise StructuredOutputsError(f"tool_choice {tool_choice!r} needs tools", "tool_choice")
    schemas = function_tools(tools)
    names = forced_tool_names(schemas, tool_choice)
    parallel = bool(parallel_tool_calls) and tool_choice == "required"
    tag = tool_call_tag(schemas, names, parallel, max_whitespace)
    return StructuredOutputsParams(structural_tag=json.dumps(tag))
