"""StructuredOutputsParams: what a request's reply must match (vLLM's `structured_outputs` field and spelling).

Exactly one constraint per request:
  json            a JSON schema (dict or JSON text): the reply is one JSON value valid under it
  regex           the whole reply matches the regular expression
  choice          the reply is exactly one of these strings
  grammar         an EBNF grammar (xgrammar / GBNF dialect, start rule `root`)
  json_object     any JSON object (OpenAI's response_format {"type": "json_object"})
  structural_tag  an xgrammar structural tag (JSON text or dict): tool calls are built from one (tool_calls.py)

Only cheap type checks happen here; the grammar itself is parsed (and bad schemas refused) by the engine at
add_request (`compiler.py`), so one SamplingParams can be built without the grammar library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputsError(ValueError):
    """A structured-output request that cannot be served; the message names the field and the problem.

    `param` is the request field at fault in OpenAI's spelling (e.g. "response_format"), for a server's 400."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict | None = None
    # JSON output on one line without optional whitespace (vLLM's disable_any_whitespace): with it off, a grammar
    # allows any run of whitespace between JSON tokens, which a weak model may fill.
    disable_any_whitespace: bool = False
    # The reply opens inside the model's reasoning (a chat prompt rendered with enable_thinking): the constraint
    # starts with the token after the first </think> and the reasoning before it is free. Set by LLM.chat and by
    # the server's translation; off for raw prompts, where the constraint applies from the first token.
    after_think: bool = False

    def __post_init__(self) -> None:
        chosen = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(chosen) != 1:
            found = " and ".join(chosen) if chosen else "none"
            raise StructuredOutputsError(
                f"structured_outputs: set exactly one of {', '.join(CONSTRAINTS)}; found {found}")
        if isinstance(self.json, dict):
            self.json = json.dumps(self.json)  # one spelling: the compile cache is keyed by the text
        if isinstance(self.structural_tag, dict):
            self.structural_tag = json.dumps(self.structural_tag)
        _check_type(self, "json", str)
        _check_type(self, "regex", str)
        _check_type(self, "grammar", str)
        _check_type(self, "structural_tag", str)
        if self.json_object not in (None, True, False):
            raise StructuredOutputsError(f"structured_outputs.json_object must be a bool, found {self.json_object!r}")
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)) or not self.choice:
                raise StructuredOutputsError(
                    f"structured_outputs.choice must be a non-empty list of strings, found {self.choice!r}")
            bad = [c for c in self.choice if not isinstance(c, str) or not c]
            if bad:
                raise StructuredOutputsError(
                    f"structured_outputs.choice entries must be non-empty strings, found {bad[0]!r}")
            self.choice = list(self.choice)
        for name in ("disable_any_whitespace", "after_think"):
            if not isinstance(getattr(self, name), bool):
                raise StructuredOutputsError(
                    f"structured_outputs.{name} must be a bool, found {getattr(self, name)!r}")

    @property
    def kind(self) -> str:
        """Which constraint this is: one of CONSTRAINTS."""
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False))

    @property
    def cache_key(self) -> tuple:
        """What the compiled grammar depends on (not after_think: that is the request's, not the grammar's)."""
        value: Any = getattr(self, self.kind)
        if isinstance(value, list):
            value = tuple(value)
        return self.kind, value, self.disable_any_whitespace

    def clone(self, **changes) -> "StructuredOutputsParams":
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict, param: str = "structured_outputs") -> "StructuredOutputsParams":
        """From a request body's dict (vLLM's `structured_outputs` extra field); unknown keys are refused."""
        if not isinstance(data, dict):
            raise StructuredOutputsError(f"{param} must be an object, found {type(data).__name__}", param)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise StructuredOutputsError(f"{param}: unknown field(s) {', '.join(unknown)}; known: "
                                         f"{', '.join(sorted(known))}", param)
        try:
            return cls(**data)
        except StructuredOutputsError as e:
            raise StructuredOutputsError(str(e).replace("structured_outputs", param, 1), param) from None


# vLLM's earlier name for the same parameters (SamplingParams.guided_decoding).
GuidedDecodingParams = StructuredOutputsParams


def opens_reasoning(prompt: str, think: str = "<think>", think_end: str = "</think>") -> bool:
    """Does a rendered chat prompt leave the model inside its reasoning (its last <think> not yet closed)? True for
    the Qwen3.5 generation prompt with thinking on ('...assistant\n<think>\n'), False with it off ('<think>\n\n
    </think>\n\n') or without think tags: then a constraint applies from the reply's first token."""
    return prompt.rfind(think) > prompt.rfind(think_end)


def _check_type(p: StructuredOutputsParams, name: str, kind: type) -> None:
    value = getattr(p, name)
    if value is not None and not (isinstance(value, kind) and value):
        raise StructuredOutputsError(
            f"structured_outputs.{name} must be a non-empty {kind.__name__}, found {value!r}")
