"""`deltaserve serve`: build the engine (a checkpoint directory, or a preset's random full-size weights built on the
device as `deltaserve bench` does), wrap it in the async engine, and run the app under uvicorn."""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path

from ..engine.async_engine import AsyncLLMEngine
from ..engine.llm import LLM
from ..engine.tokenizer import load_tokenizer, read_generation_config
from .metrics import ServerMetrics
from .serving import GENERATION_DEFAULTS, ServerConfig, ServerState

logger = logging.getLogger("deltaserve.server")


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_engine(args, model_dir: Path | None) -> tuple[LLM, Path, str]:
    """The LLM (engine + tokenizer), the directory its tokenizer files came from, and its default served name."""
    device = resolve_device(args.device)
    engine_kw = dict(max_num_seqs=args.max_num_seqs, block_size=args.block_size, max_model_len=args.max_model_len,
                     max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed,
                     cuda_graphs=False if args.enforce_eager else None, kv_cache_dtype=args.kv_cache_dtype,
                     decode_gemv=args.decode_gemv, enable_prefix_caching=args.enable_prefix_caching,
                     speculative_tokens=args.speculative_tokens)
    tp = {k: getattr(args, k) for k in ("tensor_parallel_size", "enable_expert_parallel",
                                        "distributed_executor_backend") if hasattr(args, k)}  # docs/parallel.md
    if args.preset is None:
        llm = LLM(model_dir, device=device, dtype=args.dtype, limit_mm_per_prompt=args.limit_mm_per_prompt,
                  **engine_kw, **tp)
        return llm, model_dir, model_dir.name
    if tp.get("tensor_parallel_size", 1) > 1 or tp.get("enable_expert_parallel"):
        raise ValueError("--preset builds one device's random weights; tensor parallelism needs a checkpoint (--model)")
    from ..bench.random_model import build_random_model
    from ..model import ModelConfig
    from ..synthetic import make_checkpoint
    from ..synthetic.presets import get_preset

    files = Path(tempfile.mkdtemp(prefix=f"deltaserve-{args.preset}-"))
    atexit.register(shutil.rmtree, files, True)
    make_checkpoint(files, args.preset, config_only=True, progress=False)  # config + the synthetic tokenizer
    config = ModelConfig.from_dict(get_preset(args.preset).config)
    logger.info("building %s (%s, random weights) on %s", args.preset, args.quant, device)
    mtp = config.mtp_num_hidden_layers if args.speculative_tokens else 0  # the draft head, random too
    model = build_random_model(config, args.quant, device, mtp_layers=mtp)
    return LLM.from_model(model, load_tokenizer(files), **engine_kw), files, args.preset


def build_state(llm: LLM, config: ServerConfig, max_queued_requests: int | None) -> ServerState:
    if llm.tokenizer_info is None:
        raise ValueError("the server needs a tokenizer (tokenizer.json in the checkpoint directory)")
    metrics = ServerMetrics(config.served_model_names[0])
    engine = AsyncLLMEngine(llm.engine, metrics, max_queued_requests).start()
    return ServerState(engine, llm.tokenizer_info, config, metrics)


def serve(args, model_dir: Path | None) -> int:
    import uvicorn

    from .app import build_app

    for name in ("max_num_seqs", "max_queued_requests", "max_request_bytes"):
        if getattr(args, name) is not None and getattr(args, name) < (0 if name == "max_queued_requests" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, found {getattr(args, name)}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    llm, files, default_name = load_engine(args, model_dir)
    if not llm.is_driver:  # a torchrun rank > 0: it served rank 0's steps until rank 0 shut down
        return 0
    gen = read_generation_config(files) if args.generation_config == "auto" else {}
    config = ServerConfig(served_model_names=args.served_model_name or [default_name], api_key=args.api_key,
                          max_request_bytes=args.max_request_bytes, model_root=str(model_dir or args.preset),
                          allowed_local_media_path=args.allowed_local_media_path,
                          generation_defaults={k: gen[k] for k in GENERATION_DEFAULTS if k in gen})
    warm = llm.engine.warm_up()  # the prefill graphs every chunk length needs, before the first client (CUDA only)
    if warm:
        logger.info("captured the prefill graphs in %.1f s", warm)
    state = build_state(llm, config, args.max_queued_requests)
    e = llm.engine
    logger.info("serving %s: max_model_len %d, max_num_seqs %d, %d KV blocks of %d, %s, prefix cache %s, on %s; "
                "http://%s:%d/", config.served_model_names[0], e.max_model_len, e.config.max_num_seqs, e.num_blocks,
                e.config.block_size, "CUDA graphs" if e.config.cuda_graphs else "eager",
                "on" if e.prefix_cache is not None else "off", e.device, args.host, args.port)
    try:
        uvicorn.run(build_app(state), host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                    timeout_graceful_shutdown=5)
    finally:
        state.engine.shutdown()
        llm.shutdown()  # tensor parallelism: the other ranks leave their loop
    return 0
