"""OpenAI request bodies (pydantic): what /v1/chat/completions, /v1/completions, /tokenize and /detokenize accept.

Top-level unknown fields are refused (a typo must not be silently ignored); messages keep OpenAI's shape and ignore
extra keys (clients echo back assistant messages with fields such as `refusal` or `annotations`). Ranges are
checked here so a bad value is a 400 naming its field; vLLM's extra sampling fields (top_k, min_p,
repetition_penalty, ignore_eos, ...) are accepted at the top level as vLLM takes them (`extra_body` in the openai
client).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 16  # choices per request (each is a request of its own in the engine)
MAX_LOGPROBS = 20  # the engine's limit (SamplingParams.logprobs), as vLLM's default max_logprobs
MAX_STOP = 16


class _Strict(BaseModel):
    # strict: "16" is not an int and 1 is not a bool; a JSON client sends the types it means
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """Fields shared by chat and completions requests (None: the checkpoint's generation_config, then OpenAI's)."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False  # vLLM's extension: each choice's token ids (and the prompt's) in the answer
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # structured output (deltaserve/structured/openai_request.py reads them): OpenAI's response_format, vLLM's
    # structured_outputs object and its older guided_* fields
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None  # accepted and ignored: there is one backend (xgrammar)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return v

    def engine_logprobs(self) -> int | None:
        """SamplingParams.logprobs for this request (None: no log-probabilities)."""
        return None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, why) of the first field set to something this server does not do."""
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this server"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None


# ---- chat -------------------------------------------------------------------------------------------------------------
class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ToolCallFunction(_Loose):
    name: str
    arguments: str | dict = "{}"


class ToolCallIn(_Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(BaseModel):
    """A message content part; image parts keep their fields (image_url, image) for engine/multimodal.py."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class Message(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: dict


class ChatCompletionRequest(SamplingFields):
    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        return super().unsupported()

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def engine_logprobs(self) -> int | None:
        """SamplingParams.logprobs: the top tokens listed per position (None: no log-probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None


# ---- completions ----------------------------------------------------------------------------------------------------
class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def engine_logprobs(self) -> int | None:
        return self.logprobs

    def unsupported(self) -> tuple[str, str] | None:
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported by this server"
        if self.best_of not in (None, self.n):
            return "best_of", "best_of other than n is not supported by this server"
        return super().unsupported()

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s) as a list: each a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            return []
        if isinstance(p[0], int):
            return [p]
        return list(p)


# ---- tokenizer endpoints -----------------------------------------------------------------------------------------------
class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]
