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
from ..model.plan import resolve_plan
from ..structured.params import opens_reasoning
from .chat import ChatTemplateError, render_chat
from .distributed import ParallelOptions
from .engine import EngineConfig, LLMEngine
from .multimodal import ImageSupport, split_images
from .outputs import RequestOutput
from .prompts import is_one_prompt, prompt_parts
from .sampling_params import SamplingParams
from .speculative import check_speculative_tokens
from .tokenizer import TokenizerInfo, load_tokenizer, read_generation_config

# A prompt: text, token ids, or vLLM's dict {"prompt": text | "prompt_token_ids": ids, "multi_modal_data":
# {"image": one image or a list}} (images: PIL images, paths, bytes, data: URLs; one <|image_pad|> each).
Prompt = str | Sequence[int] | dict
# the sampling fields a checkpoint's generation_config.json may set, as LLM(generation_config="auto") reads them
GENERATION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
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
    is_driver = True  # False on a tensor-parallel rank > 0 (external launcher): it served rank 0's steps
    _channel = None  # tensor parallelism, rank 0: the step channel to the other ranks

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str | torch.dtype | None = "auto",
        max_num_seqs: int = 8,
        block_size: int | None = None,
        num_blocks: int | None = None,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 512,
        seed: int = 0,
        progress: bool = False,
        cuda_graphs: bool | None = None,
        kv_cache_dtype: str = "auto",
        decode_gemv: str = "auto",
        limit_mm_per_prompt: dict | None = None,
        mm_processor_kwargs: dict | None = None,
        enable_prefix_caching: bool = True,
        prefix_state_budget: int | None = None,
        moe_kernels: str = "mma",
        generation_config: str = "auto",
        speculative_tokens: int = 0,
        tensor_parallel_size: int = 1,
        enable_expert_parallel: bool = False,
        distributed_executor_backend: str | None = None,
        distributed_timeout_s: float = 600.0,
    ):
        """limit_mm_per_prompt: {"image": N} most images per prompt (vLLM's spelling); {"image": 0} loads no vision
        tower. mm_processor_kwargs: image processor overrides (min_pixels, max_pixels, max_input_pixels).
        enable_prefix_caching / prefix_state_budget: the prefix cache (EngineConfig).
        generation_config (vLLM's): "auto" reads the checkpoint's generation_config.json for the sampling defaults
        that generate() / chat() use when given no SamplingParams (get_default_sampling_params); "vllm" ignores it
        (SamplingParams() then). An explicit SamplingParams always stands as given.
        speculative_tokens: k = 1..4 drafts a step from the checkpoint's MTP head (docs/speculative.md; the same
        replies, bit for bit); a checkpoint without the head is refused with a clear error when k > 0.
        tensor_parallel_size > 1: one process per device (docs/parallel.md); distributed_executor_backend "mp"
        (default: this process is rank 0 and starts the others) or "external_launcher" (torchrun started every rank)."""
        from ..weights.loader import load_checkpoint  # lazy: loading pulls in every checkpoint format
        from ..weights.vision_format import checkpoint_has_vision

        self.model_dir = Path(model_dir)
        check_device(device)
        if generation_config not in ("auto", "vllm"):
            raise ValueError(f"generation_config must be 'auto' or 'vllm', found {generation_config!r}")
        self.generation_config = generation_config
        parse_kv_cache_dtype(kv_cache_dtype)  # cheap checks first: options, config, tokenizer, then the weights
        resolve_plan(decode_gemv, moe_kernels, max_num_seqs, check_speculative_tokens(speculative_tokens))
        mcfg = ModelConfig.from_dir(self.model_dir)
        options = ParallelOptions(tensor_parallel_size, enable_expert_parallel, distributed_executor_backend,
                                  distributed_timeout_s)
        options.check_for(mcfg, speculative_tokens)  # before anything is loaded or started
        max_images = _image_limit(limit_mm_per_prompt)
        tok = load_tokenizer(self.model_dir)
        vision = max_images != 0 and mcfg.vision_config is not None and checkpoint_has_vision(self.model_dir)
        config = EngineConfig(block_size, num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, seed=seed,
                              cuda_graphs=cuda_graphs, kv_cache_dtype=kv_cache_dtype, decode_gemv=decode_gemv,
                              enable_prefix_caching=enable_prefix_caching, prefix_state_budget=prefix_state_budget,
                              moe_kernels=moe_kernels, speculative_tokens=speculative_tokens)

        def load(dev, parallel=None, tower: bool = vision):  # the MTP head only to draft with
            return load_checkpoint(self.model_dir, dev, parse_dtype(dtype, device), progress, vision=tower,
                                   mtp=speculative_tokens > 0, parallel=parallel)

        def setup(ckpt) -> None:
            images = None
            if ckpt.vision is not None:
                images = ImageSupport.for_model(ckpt.vision, mcfg, self.model_dir, mm_processor_kwargs, max_images)
            self._setup(ckpt.model, tok, config, images)

        if tensor_parallel_size > 1 or enable_expert_parallel:  # the vision tower, if any, on rank 0 alone
            from .tp_steps import start_parallel_llm

            start_parallel_llm(self, tok, options, device, parse_dtype(dtype, device), load, setup)
            return
        setup(load(device))

    @classmethod
    def from_model(
        cls, model: torch.nn.Module, tokenizer: TokenizerInfo | Tokenizer | None = None,
        vision: torch.nn.Module | None = None, mm_processor_kwargs: dict | None = None, **engine_config
    ) -> "LLM":
        """An LLM over an already built model (tests, tools); engine_config are EngineConfig fields. vision: the
        model's VisionTower (LoadedCheckpoint.vision) to take images."""
        self = cls.__new__(cls)
        self.model_dir = None
        self.generation_config = "vllm"
        if isinstance(tokenizer, Tokenizer):
            tokenizer = TokenizerInfo(tokenizer)
        images = None
        if vision is not None:
            images = ImageSupport.for_model(vision, model.config, None, mm_processor_kwargs)
        self._setup(model, tokenizer, EngineConfig(**engine_config), images)
        return self

    def _setup(self, model: torch.nn.Module, tok: TokenizerInfo | None, config: EngineConfig,
               images: ImageSupport | None = None) -> None:
        self.tokenizer_info = tok
        eos = list(tok.eos_token_ids) if tok is not None else []
        eos += [t for t in model.config.eos_token_ids if t not in eos]
        self.engine = LLMEngine(model, tok.tokenizer if tok is not None else None, eos, config, images)

    def get_tokenizer(self) -> Tokenizer:
        if self.tokenizer_info is None:
            raise ValueError("this LLM has no tokenizer (built from a model without one)")
        return self.tokenizer_info.tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.get_tokenizer().encode(text, add_special_tokens=add_special_tokens).ids

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() / chat() sample with when given no SamplingParams: vLLM's SamplingParams() defaults,
        overridden by the checkpoint's generation_config.json fields (GENERATION_FIELDS) unless
        generation_config="vllm"."""
        if self.generation_config != "auto" or self.model_dir is None:
            return SamplingParams()
        gen = read_generation_config(self.model_dir)
        return SamplingParams(**{k: gen[k] for k in GENERATION_FIELDS if gen.get(k) is not None})

    # ---- generation ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Final outputs, one per prompt in the order of the prompts; with SamplingParams.n > 1 a prompt's n
        completions are its output's `outputs` (the first also its own text and tokens), as vLLM's."""
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
        if ids is None:
            return []
        outs = []
        for group in self._groups:
            first = final[group[0]]
            if len(group) > 1:
                first.outputs = [final[rid].completion(j) for j, rid in enumerate(group)]
            outs.append(first)
        return outs

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
        Image parts ({"type": "image", "image": ...}, OpenAI {"type": "image_url", "image_url": {"url": "data:..."}})
        go to the engine with their placeholders; video parts are refused. A structured-output constraint applies to
        the answer: where the rendered prompt opens the model's reasoning (enable_thinking), it starts after
        </think>."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        split = [split_images(c) for c in conversations]
        prompts = [self.render_chat(c, enable_thinking, tools, **template_kwargs) for c, _ in split]
        token_prompts = [{"prompt_token_ids": self.encode(p, add_special_tokens=False),
                          "snapshot_hints": self._message_ends(c, enable_thinking, tools, **template_kwargs),
                          **({"multi_modal_data": {"image": images}} if images else {})}
                         for p, (c, images) in zip(prompts, split)]
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
    def shutdown(self) -> None:
        """Tensor parallelism: stop the other ranks (also done at interpreter exit). A no-op otherwise."""
        if self._channel is not None:
            from .tp_steps import stop_workers

            stop_workers(self._channel)

    def _require_idle(self) -> None:
        if not self.is_driver:
            raise RuntimeError("this is a tensor-parallel rank > 0: only rank 0 generates (this LLM served rank 0's "
                               "steps until it shut down)")
        if self.engine.has_unfinished():
            raise RuntimeError("the engine still has requests in flight (an unfinished generate_stream?)")

    def _message_ends(self, messages: Sequence[dict], enable_thinking: bool, tools, **kwargs) -> list[int]:
        """Token positions where each message but the last ends in the rendered conversation: where a later
        conversation that shares these messages may diverge, so the prefix cache snapshots there too."""
        info = self.tokenizer_info
        ends = []
        for i in range(1, len(messages)):
            text = render_chat(info.chat_template, messages[:i], tools, False, info.special_tokens,
                               enable_thinking=enable_thinking, **kwargs)
            ends.append(len(self.encode(text, add_special_tokens=False)))
        return ends

    def _add_dict_prompt(self, p: dict, sp: SamplingParams) -> str:
        """vLLM's prompt dict: {"prompt": text} or {"prompt_token_ids": ids}, optional multi_modal_data (and
        deltaserve's snapshot_hints: prompt positions worth a prefix-cache snapshot, engine.add_request)."""
        unknown = sorted(set(p) - {"prompt", "prompt_token_ids", "multi_modal_data", "snapshot_hints"})
        if unknown or ("prompt" in p) == ("prompt_token_ids" in p):
            raise ValueError("a prompt dict needs exactly one of 'prompt' / 'prompt_token_ids' (and optionally "
                             f"'multi_modal_data'); found keys {sorted(p)}")
        mm = dict(p.get("multi_modal_data") or {})
        images = mm.pop("image", None)
        if "video" in mm:
            raise ValueError("multi_modal_data['video']: video input is not supported (images only; docs/vision.md)")
        if mm:
            raise ValueError(f"multi_modal_data: unsupported modality {sorted(mm)} (deltaserve takes 'image')")
        if images is not None and not isinstance(images, (list, tuple)):
            images = [images]
        text = p.get("prompt")
        ids = self.encode(text) if text is not None else list(p["prompt_token_ids"])
        return self.engine.add_request(ids, sp, prompt=text, images=images,
                                       snapshot_hints=p.get("snapshot_hints") or ())

    def _normalise(self, prompts, sampling_params) -> tuple[list[Prompt], list[SamplingParams]]:
        if is_one_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
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
            # every prompt checked before any runs; dicts (vLLM's, images included) by _add_dict_prompt
            parts = [None if isinstance(p, dict) else prompt_parts(p, i) for i, p in enumerate(prompts)]
            self._groups = []  # the request ids of each prompt's n samples, in order
            for p, part, sp in zip(prompts, parts, params):
                tokens = None if part is None else self.encode(part[0]) if part[0] is not None else part[1]
                group = [self._add_dict_prompt(p, sample) if part is None else
                         self.engine.add_request(tokens, sample, prompt=part[0]) for sample in samples_of(sp)]
                self._groups.append(group)
                ids += group
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    yield ids, out
        finally:  # an abandoned stream (or an error) must not leave requests holding cache memory
            for rid in ids:
                self.engine.abort(rid)


def _image_limit(limit_mm_per_prompt: dict | None) -> int | None:
    """limit_mm_per_prompt -> most images per prompt (None: no limit); other modalities are refused."""
    if not limit_mm_per_prompt:
        return None
    bad = sorted(set(limit_mm_per_prompt) - {"image"})
    if bad:
        raise ValueError(f"limit_mm_per_prompt: unsupported modality {bad} (deltaserve takes images only)")
    n = limit_mm_per_prompt["image"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"limit_mm_per_prompt['image'] must be a non-negative integer, found {n!r}")
    return n


def _after_think(params: SamplingParams) -> SamplingParams:
    """params whose structured-output constraint (if any) starts after the reasoning's </think>."""
    so = params.structured_outputs
    return params if so is None or so.after_think else params.clone(structured_outputs=so.clone(after_think=True))


def samples_of(params: SamplingParams) -> list[SamplingParams]:
    """The n requests of a prompt (SamplingParams.n), each n=1: sample 0 keeps the seed; sample j > 0 takes a seed
    derived from (seed, j) (splitmix64), so the n samples differ and are reproducible; without a seed each draws
    its own from the engine's seeded RNG."""
    if params.n == 1:
        return [params]
    out = []
    for j in range(params.n):
        seed = params.seed if params.seed is None or j == 0 else _splitmix64(params.seed + j)
        out.append(params.clone(n=1, seed=seed))
    return out


def _splitmix64(x: int) -> int:
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def check_device(device: str | torch.device) -> None:
    """A CUDA device asked of a torch without CUDA (or with none visible) is refused in one line naming both."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU is visible"
        raise ValueError(f"device {str(device)!r}: this torch {torch.__version__} is {build}; use device='cpu' "
                         f"(--device cpu) or install a CUDA build of torch")


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="req")
