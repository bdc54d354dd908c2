"""Qwen3-Coder XML tool calls in a reply, fed text as it streams; argument values typed by the tool's JSON schema.

The format the chat template declares (spec section 5) and the model writes:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Berlin
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

-> {"name": "get_weather", "arguments": "{\"city\": \"Berlin\", \"days\": 3}"} (days is an integer in the schema).

A block is a call only if it is well formed: one <function=NAME> of a declared tool, parameters each closed, nothing
but whitespace between them. Anything else (an unknown function, a missing </parameter>, a block never closed)
stays text. A call is handed out whole when its </tool_call> arrives: a half-parsed call could still turn out to be
text, and an OpenAI client accumulates the deltas either way. Whitespace around calls belongs to no one.
Streaming is split-invariant: the concatenation of feed()/finish() pieces is the same for every chunking.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*\Z", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def to_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d = {"index": index, **d}
        return d


def tool_schemas(tools: Sequence[dict] | None) -> dict[str, dict]:
    """name -> the JSON schema of its parameters, from OpenAI `tools` ([{"type": "function", "function": {...}}])."""
    out = {}
    for tool in tools or ():
        fn = tool.get("function") or {}
        if isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


# ---- values ---------------------------------------------------------------------------------------------------------
def _schema_types(schema: dict) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    types = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            if isinstance(sub, dict):
                types += _schema_types(sub)
    if not types and ("properties" in schema):
        return ["object"]
    if not types and "enum" in schema:
        types = sorted({_json_type(v) for v in schema["enum"]})
    return types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "string")


_INT = re.compile(r"[+-]?\d+\Z")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")


def _as(kind: str, raw: str) -> tuple[bool, Any]:
    """(parsed?, value) of raw text read as one JSON-schema type."""
    s = raw.strip()
    if kind == "string":
        return True, raw
    if kind == "integer" and _INT.match(s):
        return True, int(s)
    if kind == "number" and _NUMBER.match(s):
        return True, int(s) if _INT.match(s) else float(s)
    if kind == "boolean" and s.lower() in ("true", "false"):
        return True, s.lower() == "true"
    if kind == "null" and s.lower() in ("null", "none"):
        return True, None
    if kind in ("object", "array"):
        try:
            value = json.loads(s)
        except ValueError:
            return False, None
        if isinstance(value, dict if kind == "object" else list):
            return True, value
    return False, None


def convert_value(raw: str, schema: dict | None) -> Any:
    """A parameter's text as the type its schema names (the first that parses, string last); text otherwise."""
    types = _schema_types(schema) if isinstance(schema, dict) else []
    for kind in [t for t in types if t != "string"] + (["string"] if "string" in types else []):
        ok, value = _as(kind, raw)
        if ok:
            return value
    return raw


def parse_call(block: str, schemas: dict[str, dict]) -> ToolCall | None:
    """The text between <tool_call> and </tool_call> as a call, or None if it is not a well-formed one."""
    m = _FUNCTION.match(block)
    if m is None:
        return None
    name, body = m.group(1).strip(), m.group(2)
    if name not in schemas:
        return None
    props = schemas[name].get("properties") if isinstance(schemas[name].get("properties"), dict) else {}
    args: dict[str, Any] = {}
    pos = 0
    for p in _PARAMETER.finditer(body):
        if body[pos:p.start()].strip():
            return None  # stray text between parameters
        key = p.group(1).strip()
        args[key] = convert_value(p.group(2), props.get(key))
        pos = p.end()
    if body[pos:].strip():
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


# ---- the stream -----------------------------------------------------------------------------------------------------
def _partial_tag(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """feed(text) -> (text delta, calls completed); finish() -> the same for what was held back."""

    def __init__(self, tools: Sequence[dict] | None):
        self.schemas = tool_schemas(tools)
        self.buf = ""  # text not handed out yet: a possible tag start and whitespace, or an open block
        self.in_call = False
        self.space_before = ""  # the whitespace before the open block: text again if the block is not a call
        self.after_call = False  # whitespace right after a call belongs to no one
        self.calls = 0  # calls handed out so far

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buf += text
        out: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if not self.in_call:
                if self.after_call:
                    self.buf = self.buf.lstrip()
                    if not self.buf:
                        break
                    self.after_call = False
                i = self.buf.find(OPEN)
                if i < 0:
                    # hold back a possible tag start and the whitespace before it (it may precede a call)
                    keep = _partial_tag(self.buf, OPEN)
                    safe = len(self.buf[: len(self.buf) - keep].rstrip())
                    out.append(self.buf[:safe])
                    self.buf = self.buf[safe:]
                    break
                head = self.buf[:i]
                body = head.rstrip()
                out.append(body)
                self.space_before, self.buf, self.in_call = head[len(body):], self.buf[i:], True
            j = self.buf.find(CLOSE)
            if j < 0:
                break
            call = parse_call(self.buf[len(OPEN):j], self.schemas)
            if call is None:
                out.append(self.space_before + self.buf[: j + len(CLOSE)])  # not a call: it stays text
            else:
                calls.append(call)
                self.calls += 1
                self.after_call = True
            self.buf, self.in_call = self.buf[j + len(CLOSE):], False
        return "".join(out), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self.buf = self.buf, ""
        if self.in_call:
            self.in_call = False
            call = parse_call(rest[len(OPEN):], self.schemas)  # a call the reply ended before closing
            if call is not None:
                self.calls += 1
                return "", [call]
            return self.space_before + rest, []
        return ("" if self.after_call else rest), []
