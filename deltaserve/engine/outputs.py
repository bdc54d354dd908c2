"""RequestOutput: what the engine hands back for a request, after every step it made progress and at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .request import RequestMetrics


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str  # the whole output text so far (final once `finished`)
    token_ids: list[int]  # the whole output so far (includes a stop/eos token that ended it)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    stop_reason: str | int | None = None  # the stop string or stop token id that matched (None for eos/length)
    new_text: str = ""  # what this step added to `text` (streaming)
    new_token_ids: list[int] = field(default_factory=list)  # what this step added to `token_ids`
    metrics: RequestMetrics | None = None
    # LLM.logits requests only: next-token logits at every prompt position, [len, vocab] float32
    prompt_logits: torch.Tensor | None = None

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, text={self.text!r}, token_ids={self.token_ids}, "
            f"finished={self.finished}, finish_reason={self.finish_reason!r})"
        )
