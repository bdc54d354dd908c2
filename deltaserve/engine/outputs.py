"""RequestOutput: what the engine hands back for a request, after every step it made progress and at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .request import RequestMetrics


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability under the model's raw logits and its rank among the vocabulary (1: the most
    likely), as vLLM's."""

    logprob: float
    rank: int


@dataclass
class CompletionOutput:
    """One of a prompt's n completions (SamplingParams.n), as vLLM's: index j of n, its text and tokens, why it
    ended, and with SamplingParams.logprobs one {token_id: Logprob} per output token (and their sum)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


class RequestOutput:
    """One request's progress. `text` / `token_ids` are the whole output so far (final once `finished`);
    `new_text` / `new_token_ids` what this step added (streaming). The engine builds the whole-output views lazily
    (a step costs O(new tokens), not O(output length)): they are read from the request's growing token list and
    text up to this output's lengths, which never change afterwards."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        text: str | Callable[[], str] = "",
        token_ids: list[int] | Callable[[], list[int]] | None = None,
        finished: bool = False,
        finish_reason: str | None = None,  # "stop" | "length" | "abort" once finished
        stop_reason: str | int | None = None,  # the stop string or stop token id that matched (None for eos/length)
        new_text: str = "",
        new_token_ids: list[int] | None = None,
        metrics: RequestMetrics | None = None,
        prompt_logits: torch.Tensor | None = None,  # LLM.logits requests only: [len, vocab] float32
        logprobs: list[dict[int, Logprob]] | None = None,  # SamplingParams.logprobs: one dict per output token
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self._text = text
        self._token_ids = token_ids if token_ids is not None else []
        self.finished = finished
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.new_text = new_text
        self.new_token_ids = new_token_ids if new_token_ids is not None else []
        self.metrics = metrics
        self.prompt_logits = prompt_logits
        self.logprobs = logprobs
        self._outputs: list[CompletionOutput] | None = None

    @property
    def text(self) -> str:
        if callable(self._text):
            self._text = self._text()
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text = value

    @property
    def token_ids(self) -> list[int]:
        """The output tokens so far (including a stop/eos token that ended it)."""
        if callable(self._token_ids):
            self._token_ids = self._token_ids()
        return self._token_ids

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        self._token_ids = value

    @property
    def outputs(self) -> list[CompletionOutput]:
        """The prompt's completions, vLLM's shape: this request's own as outputs[0] (with SamplingParams.n > 1,
        LLM.generate sets all n)."""
        if self._outputs is None:
            return [self.completion(0)]
        return self._outputs

    @outputs.setter
    def outputs(self, value: list[CompletionOutput]) -> None:
        self._outputs = value

    def completion(self, index: int) -> CompletionOutput:
        """This request's output as completion `index` of its prompt."""
        lps = self.logprobs
        total = None
        if lps is not None:
            total = sum(d[t].logprob for d, t in zip(lps, self.token_ids) if t in d)
        return CompletionOutput(index, self.text, self.token_ids, self.finish_reason, self.stop_reason, lps, total)

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, text={self.text!r}, token_ids={self.token_ids}, "
            f"finished={self.finished}, finish_reason={self.finish_reason!r})"
        )
