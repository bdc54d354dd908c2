"""`deltaserve serve`'s flags (in vLLM's spelling where vLLM has one). Light on purpose: `deltaserve --help` builds
this parser without importing torch or the web stack."""

from __future__ import annotations

import argparse
import json

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """Add the serve flags to p."""
    p.add_argument("--model", help="checkpoint directory (default: the built-in tiny-moe synthetic one)")
    p.add_argument("--preset", help="serve random full-size weights of a synthetic preset built on the device "
                   "(benchmarks; the synthetic tokenizer), e.g. qwen3.6-35b-a3b")
    p.add_argument("--quant", default="q4", choices=["q4", "q8", "bf16"], help="weight format for --preset")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1, /tokenize and /detokenize")
    p.add_argument("--served-model-name", nargs="+", help="name(s) clients use as `model` (default: the model "
                   "directory's name, or the preset's); the first is reported")
    p.add_argument("--max-model-len", type=int, help="context length (default min(model's, 8192))")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests running at once (default 64)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step (default 512)")
    p.add_argument("--block-size", type=int, help="KV-cache block size in tokens (default: 64 on CUDA, 16 on the CPU)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="share the KV blocks and DeltaNet snapshots of common prompt prefixes (default on)")
    p.add_argument("--allowed-local-media-path", help="image parts may name files under this directory (default: "
                   "data: URLs only)")
    p.add_argument("--limit-mm-per-prompt", type=json.loads,
                   help='most images per prompt as JSON, e.g. \'{"image": 2}\'; {"image": 0} loads no vision tower')
    p.add_argument("--max-queued-requests", type=int, default=1024,
                   help="requests allowed to wait beyond --max-num-seqs; more get 503 (default 1024)")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help=f"largest request body; larger get 413 (default {DEFAULT_MAX_REQUEST_BYTES})")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                   help="attention K/V cache: auto = the activation dtype, fp8 = e4m3 with a scale per token and head")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (default: graphs on CUDA)")
    p.add_argument("--speculative-tokens", type=int, default=0, choices=range(0, 5), metavar="K",
                   help="draft K = 1..4 tokens a step with the checkpoint's MTP head (the same replies; default 0)")
    p.add_argument("--dtype", default="auto",
                   help="auto | float32 | bfloat16 | float16 (default auto: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--device", default="auto", help="cpu | cuda | auto (default: cuda when there is one)")
    p.add_argument("--decode-gemv", default="auto", choices=["auto", "mma", "cuda", "wide", "head"],
                   help="decode GEMV mode of q4 linears (default auto: from --max-num-seqs)")
    p.add_argument("--generation-config", default="auto", choices=["auto", "vllm"],
                   help="auto: the checkpoint's generation_config.json sets sampling defaults; vllm: OpenAI's")
    p.add_argument("--seed", type=int, default=0, help="engine seed for requests without one (default 0)")
    p.add_argument("--threads", type=int, help="CPU threads (default: 1 for the built-in model, else torch's)")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
