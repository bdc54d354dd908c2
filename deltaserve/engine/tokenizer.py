"""The tokenizer side of a checkpoint directory: tokenizer.json, the chat template, special tokens and stop ids.

Files read (Hugging Face layout):
  tokenizer.json            the `tokenizers` model (required for text prompts)
  tokenizer_config.json     special tokens (eos_token, bos_token, pad_token, unk_token) and usually chat_template
  chat_template.jinja       newer exports keep the template here instead (preferred when present)
  chat_template.json        {"chat_template": ...}, another variant
  generation_config.json    eos_token_id (int or list): the ids that end a reply (<|im_end|> and <|endoftext|>)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass
class TokenizerInfo:
    tokenizer: Tokenizer
    chat_template: str | None = None
    special_tokens: dict[str, str | None] = field(default_factory=dict)  # bos_token ... as strings (template vars)
    eos_token_ids: list[int] = field(default_factory=list)  # tokenizer_config eos + generation_config eos


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return data


def _token_text(value: Any) -> str | None:
    """tokenizer_config writes special tokens as a string or as an AddedToken dict {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any, source: Path) -> str | None:
    """chat_template may be a string or a list of {"name", "template"}; we use the "default" one."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
        raise ValueError(f"{source}: chat_template list has no 'default' entry (found {sorted(map(str, named))})")
    raise ValueError(f"{source}: chat_template should be a string, found {type(value).__name__}")


def read_generation_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "generation_config.json"
    return _read_json(path) if path.exists() else {}


def eos_ids_from(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def load_tokenizer(model_dir: str | Path) -> TokenizerInfo:
    d = Path(model_dir)
    tok_file = d / "tokenizer.json"
    if not tok_file.exists():
        raise ValueError(f"{d}: no tokenizer.json (deltaserve reads the Hugging Face `tokenizers` file)")
    try:
        tokenizer = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # the tokenizers library raises a bare Exception on malformed files
        raise ValueError(f"{tok_file}: cannot be read by tokenizers ({e})") from None
    cfg_file = d / "tokenizer_config.json"
    tcfg = _read_json(cfg_file) if cfg_file.exists() else {}
    special = {k: _token_text(tcfg.get(k)) for k in SPECIAL_KEYS}
    template = _pick_template(tcfg.get("chat_template"), cfg_file)
    if (d / "chat_template.jinja").exists():
        template = (d / "chat_template.jinja").read_text()
    elif (d / "chat_template.json").exists():
        template = _pick_template(_read_json(d / "chat_template.json").get("chat_template"), d / "chat_template.json")
    eos: list[int] = []
    if special["eos_token"] is not None:
        tid = tokenizer.token_to_id(special["eos_token"])
        if tid is not None:
            eos.append(tid)
    for t in eos_ids_from(read_generation_config(d).get("eos_token_id")):
        if t not in eos:
            eos.append(t)
    return TokenizerInfo(tokenizer, template, special, eos)
