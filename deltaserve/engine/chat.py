"""Chat template rendering with jinja2, with the conventions transformers' apply_chat_template uses.

Environment: sandboxed, trim_blocks and lstrip_blocks on, the loopcontrols extension; a `tojson` filter that keeps
non-ASCII characters; globals `raise_exception(msg)` and `strftime_now(fmt)`. Variables: messages, tools,
add_generation_prompt, the special-token strings (bos_token, eos_token, ...) and any extra keyword
(enable_thinking, ...).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Sequence

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template raised, or the messages are malformed; the message says which."""


def _raise(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse: line {e.lineno}: {e.message}") from None


def check_messages(messages: Sequence[dict]) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"messages[{i}] must be a dict, found {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] has no string 'role'")


def render_chat(
    template: str,
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str | None] | None = None,
    **kwargs: Any,
) -> str:
    """The prompt text for a conversation (special tokens appear as text; encode without adding more)."""
    check_messages(messages)
    variables = dict(special_tokens or {})
    variables.update(kwargs)
    try:
        return _compile(template).render(
            messages=list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None
