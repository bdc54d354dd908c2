"""The prompt forms LLM.generate takes (vLLM's): a string, a list of token ids, or a dict ({"prompt": str} or
{"prompt_token_ids": [...]}, images beside them: LLM._add_dict_prompt); the checks that name what is wrong with
anything else."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def is_one_prompt(prompts: Any) -> bool:
    """Whether `prompts` is a single prompt rather than a sequence of them (a str, bytes, a dict, or a non-empty
    list whose first element is an int)."""
    if isinstance(prompts, (str, bytes, bytearray, dict)):
        return True
    return isinstance(prompts, (list, tuple)) and bool(prompts) and isinstance(prompts[0], int)


def prompt_parts(prompt: Any, index: int = 0) -> tuple[str | None, list[int] | None]:
    """(text, token_ids) of one prompt that is not a dict: exactly one of them is set. Raises a TypeError naming
    the prompt's position and what was found for anything else (bytes: decode it first)."""
    where = f"prompt {index}"
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError(f"{where} is bytes; decode it to a str first (e.g. prompt.decode('utf-8'))")
    if isinstance(prompt, (list, tuple, torch.Tensor)):
        return None, token_ids(prompt, where)
    raise TypeError(f"{where} must be a str, a list of token ids, {{'prompt': str}} or {{'prompt_token_ids': [...]}}; "
                    f"found {type(prompt).__name__}")


def token_ids(ids: Sequence[Any] | torch.Tensor, where: str) -> list[int]:
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    out = list(ids)
    bad = next((i for i, t in enumerate(out) if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
    if bad is not None:
        raise TypeError(f"{where}: token ids must be non-negative ints; element {bad} is {out[bad]!r}")
    if not out:
        raise ValueError(f"{where}: no token ids")
    return out
