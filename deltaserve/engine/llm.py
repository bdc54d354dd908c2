"""LLM: the offline public API (vLLM-style): generate, generate_stream, chat, logits, get_tokenizer.

Every call goes through the same engine path (schedule -> execute -> update): `generate` of several prompts runs
them as one continuous batch, and `logits` is a request that asks for logits at every prompt position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import torch
from tokenizers import Tokenizer

from ..model.cache import parse_kv_cache_dtype
from ..model.config import ModelConfig
from ..structured.params import opens_reasoning
from .chat import ChatTemplateError, render_chat
from .engine import EngineConfig, LLMEngine, resolve_decode_gemv
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .tokenizer import TokenizerInfo, load_tokenizer

Prompt = str | Sequence[int]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": None}


def parse_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype | None:
    """The activation dtype. "auto" (or None): bfloat16 on CUDA (the Triton kernels and CUDA graphs need 16-bit
    activations), float32 on the CPU (the reference path, exact against transformers in fp32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(dtype, dtype or "auto")
    if key not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if key == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return DTYPES[key]


class LLM:
    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str | torch.dtype | None = "auto",
        max_num_seqs: int = 8,
        block_size: int = 16,
        num_blocks: int | None = None,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 512,
        seed: int = 0,
        progress: bool = False,
        cuda_graphs: bool | None = None,
        kv_cache_dtype: str = "auto",
        decode_gemv: str = "auto",
    ):
        from ..weights.loader import load_checkpoint  # lazy: loading pulls in every checkpoint format

        self.model_dir = Path(model_dir)
        parse_kv_cache_dtype(kv_cache_dtype)  # cheap checks first: options, config, tokenizer, then the weights
        resolve_decode_gemv(decode_gemv, max_num_seqs)
        ModelConfig.from_dir(self.model_dir)
        tok = load_tokenizer(self.model_dir)
        ckpt = load_checkpoint(self.model_dir, device, parse_dtype(dtype, device), progress)
        config = EngineConfig(block_size, num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, seed=seed,
                              cuda_graphs=cuda_graphs, kv_cache_dtype=kv_cache_dtype, decode_gemv=decode_gemv)
        self._setup(ckpt.model, tok, config)

    @classmethod
    def from_model(
        cls, model: torch.nn.Module, tokenizer: TokenizerInfo | Tokenizer | None = None, **engine_config
    ) -> "LLM":
        """An LLM over an already built model (tests, tools); engine_config are EngineConfig fields."""
        self = cls.__new__(cls)
        self.model_dir = None
        if isinstance(tokenizer, Tokenizer):
            tokenizer = TokenizerInfo(tokenizer)
        self._setup(model, tokenizer, EngineConfig(**engine_config))
        return self

    def _setup(self, model: torch.nn.Module, tok: TokenizerInfo | None, config: EngineConfig) -> None:
        self.tokenizer_info = tok
        eos = list(tok.eos_token_ids) if tok is not None else []
        eos += [t for t in model.config.eos_token_ids if t not in eos]
        self.engine = LLMEngine(model, tok.tokenizer if tok is not None else None, eos, config)

    def get_tokenizer(self) -> Tokenizer:
        if self.tokenizer_info is None:
            raise ValueError("this LLM has no tokenizer (built from a model without one)")
        return self.tokenizer_info.tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.get_tokenizer().encode(text, add_special_tokens=add_special_tokens).ids

    # ---- generation ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Final outputs, in the order of the prompts."""
        final: dict[str, RequestOutput] = {}
        ids = None
        bar = None
        for ids, out in self._run(prompts, sampling_params):
            if out.finished:
                final[out.request_id] = out
                if use_tqdm:
                    bar = bar or _progress_bar(len(ids))
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [final[i] for i in ids] if ids is not None else []

    def generate_stream(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> Iterator[RequestOutput]:
        """One RequestOutput per request per step that made progress: `new_text` / `new_token_ids` are the deltas."""
        for _, out in self._run(prompts, sampling_params):
            yield out

    def chat(
        self,
        messages: Sequence[dict] | Sequence[Sequence[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        enable_thinking: bool = True,
        tools: Sequence[dict] | None = None,
        use_tqdm: bool = False,
        **template_kwargs,
    ) -> list[RequestOutput]:
        """Render each conversation with the checkpoint's chat template (generation prompt on), then generate.

        A structured-output constraint applies to the answer: where the rendered prompt opens the model's reasoning
        (enable_thinking), it starts after </think>."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.render_chat(c, enable_thinking, tools, **template_kwargs) for c in conversations]
        token_prompts = [self.encode(p, add_special_tokens=False) for p in prompts]
        _, params = self._normalise(token_prompts, sampling_params)
        params = [_after_think(sp) if opens_reasoning(p) else sp for p, sp in zip(prompts, params)]
        outs = self.generate(token_prompts, params, use_tqdm)
        for out, text in zip(outs, prompts):
            out.prompt = text
        return outs

    def render_chat(
        self, messages: Sequence[dict], enable_thinking: bool = True, tools: Sequence[dict] | None = None, **kwargs
    ) -> str:
        info = self.tokenizer_info
        if info is None or not info.chat_template:
            raise ChatTemplateError("the checkpoint has no chat_template (tokenizer_config.json / chat_template.jinja)")
        return render_chat(
            info.chat_template, messages, tools, True, info.special_tokens, enable_thinking=enable_thinking, **kwargs
        )

    @torch.inference_mode()
    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Next-token logits at every position of token_ids, [len, vocab] float32 (one logits_only request)."""
        self._require_idle()
        rid = self.engine.add_request(token_ids, SamplingParams(max_tokens=1), logits_only=True)
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id == rid and out.finished:
                    return out.prompt_logits
        raise RuntimeError("the logits request ended without output")

    # ---- plumbing ----------------------------------------------------------------------------------------------
    def _require_idle(self) -> None:
        if self.engine.has_unfinished():
            raise RuntimeError("the engine still has requests in flight (an unfinished generate_stream?)")

    def _normalise(self, prompts, sampling_params) -> tuple[list[Prompt], list[SamplingParams]]:
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts: give one, or one per prompt")
        return prompts, params

    def _run(self, prompts, sampling_params) -> Iterator[tuple[list[str], RequestOutput]]:
        self._require_idle()
        prompts, params = self._normalise(prompts, sampling_params)
        ids: list[str] = []
        try:
            for p, sp in zip(prompts, params):
                if isinstance(p, str):
                    ids.append(self.engine.add_request(self.encode(p), sp, prompt=p))
                else:
                    ids.append(self.engine.add_request(list(p), sp))
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    yield ids, out
        finally:  # an abandoned stream (or an error) must not leave requests holding cache memory
            for rid in ids:
                self.engine.abort(rid)


def _after_think(params: SamplingParams) -> SamplingParams:
    """params whose structured-output constraint (if any) starts after the reasoning's </think>."""
    so = params.structured_outputs
    return params if so is None or so.after_think else params.clone(structured_outputs=so.clone(after_think=True))


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="req")
