"""SamplingParams: how one request picks its tokens and when it stops (vLLM field names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..structured.params import StructuredOutputsError, StructuredOutputsParams


MAX_LOGPROBS = 20  # as vLLM's default max_logprobs


class SamplingParamsError(ValueError):
    """A sampling parameter out of range; the message names the field, the allowed range and the value found."""


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (argmax, ties to the lower token id)
    top_k: int = 0  # 0 (or -1) = off
    top_p: float = 1.0  # in (0, 1]
    min_p: float = 0.0  # in [0, 1]
    repetition_penalty: float = 1.0  # > 0; over prompt + output tokens
    presence_penalty: float = 0.0  # in [-2, 2]; over output tokens
    frequency_penalty: float = 0.0  # in [-2, 2]; over output tokens
    seed: int | None = None  # None: the engine draws one at admission
    max_tokens: int | None = 16  # None: up to the model's context length
    stop: list[str] | str | None = None  # stop strings, matched on the detokenised text
    stop_token_ids: list[int] | None = None  # extra stop tokens (always active, even with ignore_eos)
    ignore_eos: bool = False  # do not stop at the model's end-of-sequence tokens
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True  # leave special tokens (e.g. <|im_end|>) out of the text
    # constrain the reply to a JSON schema / regex / choice / grammar (docs/structured_output.md); a dict is read
    # as StructuredOutputsParams' fields. guided_decoding is vLLM's earlier name for the same thing.
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None
    n: int = 1  # completions per prompt (LLM.generate: RequestOutput.outputs); sample j's seed from `seed` and j
    # top log-probabilities per output token (RequestOutput.logprobs): the sampled token's and the `logprobs` most
    # likely tokens', from the model's raw logits (log_softmax before temperature, penalties or top-k/p, as vLLM's
    # default "raw_logprobs"); None: none, 0: the sampled token's alone
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop else []
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids else []
        self._structured_outputs()
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def _validate(self) -> None:
        _number(self, "temperature", lo=0.0)
        _integer(self, "top_k", lo=0)
        _number(self, "top_p", lo=0.0, hi=1.0, lo_open=True)
        _number(self, "min_p", lo=0.0, hi=1.0)
        _number(self, "repetition_penalty", lo=0.0, lo_open=True)
        _number(self, "presence_penalty", lo=-2.0, hi=2.0)
        _number(self, "frequency_penalty", lo=-2.0, hi=2.0)
        if self.seed is not None:
            _integer(self, "seed", lo=0, hi=(1 << 64) - 1)
        if self.max_tokens is not None:
            _integer(self, "max_tokens", lo=1)
        _integer(self, "n", lo=1)
        if self.logprobs is not None:
            _integer(self, "logprobs", lo=0, hi=MAX_LOGPROBS)
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise SamplingParamsError(f"SamplingParams.stop[{i}] must be a non-empty string, found {s!r}")
        for i, t in enumerate(self.stop_token_ids):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise SamplingParamsError(
                    f"SamplingParams.stop_token_ids[{i}] must be a non-negative int, found {t!r}"
                )
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(f"SamplingParams.{name} must be a bool, found {getattr(self, name)!r}")

    def _structured_outputs(self) -> None:
        if self.guided_decoding is not None:
            if self.structured_outputs is not None and self.structured_outputs is not self.guided_decoding:
                raise SamplingParamsError("SamplingParams: give structured_outputs or its old name guided_decoding, "
                                          "not both")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        so = self.structured_outputs
        try:
            if isinstance(so, dict):
                self.structured_outputs = StructuredOutputsParams.from_dict(so)
            elif so is not None and not isinstance(so, StructuredOutputsParams):
                raise SamplingParamsError("SamplingParams.structured_outputs must be a StructuredOutputsParams (or a "
                                          f"dict of its fields), found {type(so).__name__}")
        except StructuredOutputsError as e:
            raise SamplingParamsError(f"SamplingParams.{e}") from None

    def clone(self, **changes) -> "SamplingParams":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return SamplingParams(**values)


def _number(p: SamplingParams, name: str, lo=None, hi=None, lo_open=False) -> None:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SamplingParamsError(f"SamplingParams.{name} must be a number, found {value!r}")
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and value > hi
    if too_low or too_high:
        left = "(" if lo_open else "["
        rng = f"{left}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise SamplingParamsError(f"SamplingParams.{name} must be in {rng}, found {value!r}")
    setattr(p, name, float(value))


def _integer(p: SamplingParams, name: str, lo=None, hi=None) -> None:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(f"SamplingParams.{name} must be an int, found {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SamplingParamsError(
            f"SamplingParams.{name} must be in [{lo}, {hi if hi is not None else 'inf'}], found {value!r}"
        )
