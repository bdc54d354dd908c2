"""The `deltaserve` command: run | serve | make-checkpoint | info | quantize | export-gguf | bench | bench-serve.

Every command imports what it needs inside its function, so `deltaserve --help` is instant and a missing optional
piece only affects its own command. Errors a person can fix (bad directory, bad config, bad value) print one line
`deltaserve: error: ...` and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from .utils import tuning

DEFAULT_PRESET = "tiny-moe"
DEFAULT_SEED = 0


class CLIError(Exception):
    """A usage problem reported as one line, exit status 2."""


# ---- run -----------------------------------------------------------------------------------------------------------
def default_model_dir() -> Path:
    """Where the built-in synthetic checkpoint lives: $DELTASERVE_CACHE/tiny-moe-seed0 or ~/.cache/deltaserve/..."""
    root = tuning.get("DELTASERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "deltaserve")
    return Path(root) / f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}"


def ensure_default_checkpoint() -> Path:
    """Create the tiny-moe synthetic checkpoint once (written aside, then renamed: never half a checkpoint)."""
    target = default_model_dir()
    if (target / "model.safetensors.index.json").exists() or (target / "model.safetensors").exists():
        print(f"no --model given: using the built-in {DEFAULT_PRESET} synthetic checkpoint (random weights) at {target}",
              file=sys.stderr)
        return target
    from .synthetic import make_checkpoint

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    make_checkpoint(partial, DEFAULT_PRESET, seed=DEFAULT_SEED, dtype="bf16", progress=False)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    print(f"no --model given: created the built-in {DEFAULT_PRESET} synthetic checkpoint (random weights, seed "
          f"{DEFAULT_SEED}) at {target}; it is reused from now on", file=sys.stderr)
    return target


def set_threads(threads: int | None, builtin: bool) -> None:
    """CPU threads for torch. The built-in tiny model runs best on one: its ops are so small that handing work to
    other threads costs more than it saves, and on a busy machine spinning threads slow it down many times."""
    import torch

    if threads is not None:
        if threads <= 0:
            raise CLIError(f"--threads must be positive, found {threads}")
        torch.set_num_threads(threads)
    elif builtin:
        torch.set_num_threads(1)


def sampling_from_args(args, llm):
    """Flags win; otherwise LLM.get_default_sampling_params(): the checkpoint's generation_config.json, then vLLM's
    SamplingParams() defaults (the same defaults LLM.generate uses when given no SamplingParams)."""
    flags = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    return llm.get_default_sampling_params().clone(seed=args.seed, max_tokens=args.max_tokens,
                                                   **{k: v for k, v in flags.items() if v is not None})


def prompt_from_args(args) -> str | None:
    """The one prompt of `run`: --prompt TEXT, --prompt - (all of stdin) or --prompt-file PATH; None: chat. Text
    that is not valid UTF-8 is refused in one line naming where it came from and the byte."""
    if args.prompt is not None and args.prompt_file is not None:
        raise CLIError("give --prompt or --prompt-file, not both")
    if args.prompt_file is not None:
        try:
            data = Path(args.prompt_file).read_bytes()
        except OSError as e:
            raise CLIError(f"--prompt-file {args.prompt_file}: {e.strerror or e}") from None
        return utf8(data, f"--prompt-file {args.prompt_file}")
    if args.prompt == "-":
        return utf8(sys.stdin.buffer.read(), "--prompt - (stdin)")
    if args.prompt is not None:  # argv: undecodable bytes arrive as surrogate escapes
        return utf8(os.fsencode(args.prompt), "--prompt")
    return None


def utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"{where} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
                       f"convert it first, e.g. iconv -t UTF-8") from None


def cmd_run(args) -> int:
    from .engine.llm import LLM, check_device

    check_device(args.device)  # before anything is made or loaded
    set_threads(args.threads, builtin=not args.model)
    model_dir = Path(args.model) if args.model else ensure_default_checkpoint()
    if not model_dir.is_dir():
        raise CLIError(f"--model {model_dir}: not a directory")
    prompt = prompt_from_args(args)  # read (and checked) before the model is loaded
    llm = LLM(model_dir, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=1,
              moe_kernels=args.moe_kernels,
              cuda_graphs=False if args.enforce_eager else None, kv_cache_dtype=args.kv_cache_dtype,
              speculative_tokens=args.speculative_tokens, **parallel_from_args(args))
    if not llm.is_driver:  # a torchrun rank > 0: it served rank 0's steps until rank 0 finished
        return 0
    try:
        params = sampling_from_args(args, llm)
        chat = not args.no_chat and llm.tokenizer_info is not None and bool(llm.tokenizer_info.chat_template)
        images = [{"type": "image", "image": p} for p in args.image]  # with the prompt, or the chat's first turn
        if prompt is not None:
            if not chat:
                raw = "<|vision_start|><|image_pad|><|vision_end|>" * len(images) + prompt
                stream_reply(llm, raw, params, not args.no_thinking, [p["image"] for p in images])
                return 0
            messages = [{"role": "user", "content": images + [{"type": "text", "text": prompt}]
                         if images else prompt}]
            stream_reply(llm, messages, params, not args.no_thinking)
            return 0
        return repl(llm, params, chat, not args.no_thinking, images)
    finally:
        llm.shutdown()  # tensor parallelism: the other ranks leave their loop


def parallel_from_args(args) -> dict:
    """LLM keyword arguments of the tensor-parallel flags (docs/parallel.md)."""
    return dict(tensor_parallel_size=args.tensor_parallel_size, enable_expert_parallel=args.enable_expert_parallel,
                distributed_executor_backend=args.distributed_executor_backend)


def add_parallel_flags(parser) -> None:
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="split the model over N devices, one process each (default 1; docs/parallel.md)")
    parser.add_argument("--enable-expert-parallel", action="store_true",
                        help="partition the MoE experts over the ranks instead of splitting each expert")
    parser.add_argument("--distributed-executor-backend", choices=["mp", "external_launcher"],
                        help="mp (default): this process starts the other ranks; external_launcher: torchrun did")


def prompt_ids(llm, conversation, thinking: bool) -> list[int]:
    """The prompt's token ids as stream_reply makes them (the chat template's for messages; image parts aside)."""
    from .engine.multimodal import split_images

    if isinstance(conversation, str):
        return llm.encode(conversation)
    conversation, _ = split_images(conversation)
    return llm.encode(llm.render_chat(conversation, enable_thinking=thinking), add_special_tokens=False)


def stream_reply(llm, conversation, params, thinking: bool, images: list | None = None) -> str:
    """Stream one reply to stdout; print prefill and decode speed to stderr; return the reply text.
    conversation: raw text (images: one per <|image_pad|> of it), or chat messages (image parts inside)."""
    from .engine.multimodal import split_images

    hints = []
    if isinstance(conversation, str):
        ids = llm.encode(conversation)
    else:
        conversation, images = split_images(conversation)
        ids = llm.encode(llm.render_chat(conversation, enable_thinking=thinking), add_special_tokens=False)
        hints = llm._message_ends(conversation, thinking, None)  # prefix-cache seams: the next turn resumes there
    prompt = {"prompt_token_ids": ids, "snapshot_hints": hints, **({"multi_modal_data": {"image": images}}
                                                                    if images else {})}
    final = None
    for out in llm.generate_stream([prompt], params):
        sys.stdout.write(out.new_text)
        sys.stdout.flush()
        final = out
    sys.stdout.write("\n")
    print(speed_line(final), file=sys.stderr)
    return final.text


def speed_line(out) -> str:
    m = out.metrics
    n_prompt, n_out = len(out.prompt_token_ids), len(out.token_ids)
    pre = m.prefill_seconds or 0.0
    dec = m.decode_seconds or 0.0
    n_dec = max(n_out - 1, 0)  # the first token comes out of the prefill
    pre_rate = f"{n_prompt / pre:.1f} tok/s" if pre > 0 else "n/a"
    dec_rate = f"{n_dec / dec:.1f} tok/s" if dec > 0 and n_dec else "n/a"
    drafts = ""
    if m.num_spec_steps:  # speculative decoding: drafts accepted, tokens a drafting step gave
        drafts = (f" | drafts: {m.num_accepted}/{m.num_drafted} accepted, {m.mean_acceptance_length:.2f} tokens a "
                  "drafting step")
    return (f"[prefill: {n_prompt} tokens in {pre:.3f} s, {pre_rate} | decode: {n_dec} tokens in {dec:.3f} s, "
            f"{dec_rate}{drafts} | finish: {out.finish_reason}]")


def fit_history(llm, history: list[dict], thinking: bool) -> list[int] | None:
    """The prompt ids of the conversation, its oldest turns dropped (said on stderr) until the prompt leaves room
    in max_model_len for at least one new token; None (said too) when the last message alone does not fit."""
    limit = llm.engine.max_model_len
    dropped = 0
    while True:
        ids = prompt_ids(llm, history, thinking)
        if len(ids) < limit:
            if dropped:
                print(f"(the conversation outgrew max_model_len {limit}: dropped its oldest {dropped} message"
                      f"{'s' * (dropped != 1)}; /reset starts afresh)", file=sys.stderr)
            return ids
        if len(history) == 1:
            print(f"(that message alone is {len(ids)} tokens, more than max_model_len {limit} allows: shorten it, "
                  f"or run with a larger --max-model-len)", file=sys.stderr)
            history.clear()
            return None
        drop = 2 if len(history) > 2 and history[1].get("role") == "assistant" else 1  # a user turn and its reply
        del history[:drop]
        dropped += drop


def repl(llm, params, chat: bool, thinking: bool, images: list | None = None) -> int:
    """Interactive chat: one line per user turn; /reset clears the history, /exit (or end of input) quits.
    images: image parts that go with the first user turn (--image)."""
    history: list[dict] = []
    print("deltaserve chat: type a message; /reset clears the conversation, /exit quits.", file=sys.stderr)
    if hasattr(sys.stdin, "reconfigure"):  # undecodable bytes reach us as surrogate escapes, to be named below
        sys.stdin.reconfigure(errors="surrogateescape")
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        try:
            line = utf8(line.encode("utf-8", "surrogateescape"), "that line").strip()
        except CLIError as e:
            print(f"({e}; type it again)", file=sys.stderr)
            continue
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            history.clear()
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not chat:
            ids = prompt_ids(llm, line, thinking)
            if len(ids) >= llm.engine.max_model_len:
                print(f"(that line is {len(ids)} tokens, more than max_model_len {llm.engine.max_model_len} "
                      f"allows)", file=sys.stderr)
                continue
            stream_reply(llm, line, params, thinking)
            continue
        first = images if images and not any(m["role"] == "user" for m in history) else []
        history.append({"role": "user", "content": first + [{"type": "text", "text": line}] if first else line})
        if fit_history(llm, history, thinking) is None:
            continue
        reply = stream_reply(llm, history, params, thinking)
        history.append({"role": "assistant", "content": reply})


# ---- serve ---------------------------------------------------------------------------------------------------------
def cmd_serve(args) -> int:
    from .server.launch import serve

    if args.preset and args.model:
        raise CLIError("--preset builds random weights; it cannot be combined with --model")
    set_threads(args.threads, builtin=not args.model and not args.preset)
    model_dir = None
    if not args.preset:
        model_dir = Path(args.model) if args.model else ensure_default_checkpoint()
        if not model_dir.is_dir():
            raise CLIError(f"--model {model_dir}: not a directory")
    return serve(args, model_dir)


def cmd_bench_serve(args) -> int:
    from .bench.serve import main as bench_serve_main

    return int(bench_serve_main(args.bench_args) or 0)


# ---- checkpoints -----------------------------------------------------------------------------------------------------
def cmd_make_checkpoint(args) -> int:
    from .synthetic import PRESETS

    if args.preset not in PRESETS:
        raise CLIError(f"--preset {args.preset!r} is not known; presets: {', '.join(PRESETS)}")
    if args.quant:
        if args.config_only or args.expert_layout or args.dtype != "bf16":
            raise CLIError("--quant writes an MLX checkpoint from bf16 weights; it cannot be combined with "
                           "--config-only, --expert-layout or --dtype")
        from .synthetic.quantized import write_quantized_synthetic

        out = write_quantized_synthetic(args.out, args.preset, args.quant, seed=args.seed)
    else:
        from .synthetic import make_checkpoint

        out = make_checkpoint(args.out, args.preset, seed=args.seed, dtype=args.dtype, config_only=args.config_only,
                              expert_layout=args.expert_layout)
    what = "config + tokenizer" if args.config_only else "checkpoint"
    print(f"wrote {args.preset} {what} to {out}")
    return 0


def cmd_info(args) -> int:
    from .weights.inspect import describe_checkpoint

    tp, ep = args.tensor_parallel_size, args.enable_expert_parallel
    if tp < 1:
        raise CLIError(f"--tensor-parallel-size must be >= 1, found {tp}")
    if (args.dir is None) == (args.preset is None):
        raise CLIError("info: give a checkpoint directory or --preset NAME (one of them)")
    if args.quant and args.preset is None:
        raise CLIError("--quant describes a preset in a release format: use it with --preset")
    if args.preset is not None:
        print(describe_preset(args.preset, args.quant, tp, ep))
    elif not Path(args.dir).is_dir():
        raise CLIError(f"{args.dir}: not a directory")
    else:
        print(describe_checkpoint(args.dir, tp, ep))
    if args.plan:
        from .model.plan import resolve_plan

        plan = resolve_plan(args.decode_gemv, args.moe_kernels, args.max_num_seqs, args.speculative_tokens)
        print(f"deployment: max_num_seqs {args.max_num_seqs}, speculative_tokens {args.speculative_tokens}")
        print("\n".join(plan.details()))
    return 0


def describe_preset(name: str, quant: str | None, tp: int, ep: bool) -> str:
    """`info --preset NAME [--quant Q]`: the preset's config written aside (with a release's quantisation entry)."""
    import json
    import tempfile

    from .synthetic import PRESETS, make_checkpoint
    from .weights.inspect import describe_checkpoint, with_quantization

    if name not in PRESETS:
        raise CLIError(f"--preset {name!r} is not known; presets: {', '.join(PRESETS)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = make_checkpoint(Path(tmp) / name, name, config_only=True, progress=False)
        if quant:
            cfg = with_quantization(json.loads((out / "config.json").read_text()), quant)
            (out / "config.json").write_text(json.dumps(cfg))
        return describe_checkpoint(out, tp, ep)


def cmd_quantize(args) -> int:
    from .weights.quantizer import quantize_checkpoint

    if not Path(args.input).is_dir():
        raise CLIError(f"{args.input}: not a directory")
    out = quantize_checkpoint(args.input, args.output, bits=args.bits, group_size=args.group_size)
    print(f"wrote {args.bits}-bit (group {args.group_size}) MLX checkpoint to {out}")
    return 0


def cmd_bench(args) -> int:
    import importlib

    try:
        bench = importlib.import_module("deltaserve.bench.main")
    except ModuleNotFoundError as e:
        if e.name not in ("deltaserve.bench", "deltaserve.bench.main"):
            raise CLIError(f"`deltaserve bench` needs the module {e.name!r} (pip install -e '.[gpu]')") from None
        raise CLIError("`deltaserve bench` needs the GPU benchmark module (deltaserve.bench.main), "
                       "which this install does not have") from None
    return int(bench.main(args.bench_args) or 0)


# ---- export ----------------------------------------------------------------------------------------------------------
def cmd_export_gguf(args) -> int:
    from .export import export_gguf, export_random_gguf

    if args.preset and not args.random:
        raise CLIError("--preset has no weights: add --random for a file of random weights in the preset's shapes")
    want = 1 if args.preset else 2
    if len(args.paths) != want:
        usage = "--preset NAME --random OUT.gguf" if args.preset else "DIR OUT.gguf"
        raise CLIError(f"export-gguf {usage}: expected {want} path(s), found {len(args.paths)}")
    out = args.paths[-1]
    progress = not args.quiet
    if args.random:
        model_dir = None if args.preset else args.paths[0]
        if model_dir is not None and not Path(model_dir).is_dir():
            raise CLIError(f"{model_dir}: not a directory")
        report = export_random_gguf(out, args.preset, model_dir, args.type, args.seed, args.fuse_gate_up, progress)
    else:
        if not Path(args.paths[0]).is_dir():
            raise CLIError(f"{args.paths[0]}: not a directory")
        report = export_gguf(args.paths[0], out, args.type, args.fuse_gate_up, progress)
    print(report.summary())
    return 0


# ---- parser ------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deltaserve", description="Exact inference for Qwen3.5 / Qwen3.6 hybrid models.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="generate text (one prompt, or an interactive chat)",
                         description="Stream a reply to --prompt, or chat interactively. Without --model, uses a "
                         "built-in tiny synthetic checkpoint (random weights) created once in the cache dir.")
    run.add_argument("--model", help="checkpoint directory (default: the built-in tiny-moe synthetic one)")
    run.add_argument("--prompt", help="one prompt ('-': read it from stdin); without it, an interactive chat on stdin")
    run.add_argument("--prompt-file", metavar="PATH", help="read the one prompt from a UTF-8 text file")
    run.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    run.add_argument("--temperature", type=float, help="0 = greedy (default: generation_config.json, else 1.0; "
                     "as LLM.generate without SamplingParams)")
    run.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (default: generation_config.json)")
    run.add_argument("--top-k", type=int, help="keep the k most likely tokens, 0 = off (default: generation_config)")
    run.add_argument("--seed", type=int, help="sampling seed (default: drawn from the engine's seeded RNG)")
    run.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    run.add_argument("--dtype", default="auto",
                     help="auto | float32 | bfloat16 | float16 (default auto: bfloat16 on CUDA, float32 on the CPU)")
    run.add_argument("--threads", type=int, help="CPU threads (default: 1 for the built-in model, else torch's)")
    run.add_argument("--max-model-len", type=int, help="context length (default min(model's, 8192))")
    run.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode (default: graphs on CUDA)")
    run.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                     help="attention K/V cache: auto = the activation dtype, fp8 = e4m3 with a scale per token and head")
    run.add_argument("--moe-kernels", default="mma", choices=["mma", "cuda"],
                     help="GPU kernels of q4 MoE blocks: mma (tensor cores, default) or cuda (batch-1-only serving)")
    run.add_argument("--speculative-tokens", type=int, default=0, choices=range(0, 5), metavar="K",
                     help="draft K = 1..4 tokens a step with the checkpoint's MTP head (the same reply; default 0)")
    run.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, no chat template")
    run.add_argument("--image", action="append", default=[], metavar="PATH",
                     help="an image for the prompt (or the chat's first turn); repeat for several (docs/vision.md)")
    run.add_argument("--no-thinking", action="store_true", help="chat template with enable_thinking=False")
    add_parallel_flags(run)
    run.set_defaults(func=cmd_run)

    mk = sub.add_parser("make-checkpoint", help="write a synthetic checkpoint (published layout, random weights)")
    mk.add_argument("out", help="output directory")
    mk.add_argument("--preset", required=True, help="tiny-moe | tiny-dense | tiny-next | qwen3.5-0.8b | qwen3.6-35b-a3b "
                    "(qwen3.5-122b-a10b, qwen3.5-397b-a17b: with --config-only)")
    mk.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    mk.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="tensor dtype (default bf16)")
    mk.add_argument("--config-only", action="store_true", help="config and tokenizer files only, no weights")
    mk.add_argument("--quant", choices=["q4", "q8"], help="write an MLX affine-quantised checkpoint instead")
    mk.add_argument("--expert-layout", choices=["fused", "per_expert"], help="MoE expert tensors (default: published)")
    mk.set_defaults(func=cmd_make_checkpoint)

    info = sub.add_parser("info", help="describe a checkpoint: architecture, parameters, bits per weight, memory")
    info.add_argument("dir", nargs="?", help="checkpoint directory (config.json is enough)")
    info.add_argument("--preset", help="describe a preset's shapes instead (e.g. qwen3.5-397b-a17b)")
    info.add_argument("--quant", choices=["q4", "q8", "fp8"], help="with --preset: in this release format")
    info.add_argument("--tensor-parallel-size", type=int, default=1, help="one rank's share and cache budget")
    info.add_argument("--enable-expert-parallel", action="store_true", help="experts partitioned over the ranks")
    info.add_argument("--plan", action="store_true", help="also print the kernel plan a GPU deployment would fix")
    info.add_argument("--max-num-seqs", type=int, default=1, help="the deployment's streams (--plan; default 1)")
    info.add_argument("--speculative-tokens", type=int, default=0, choices=range(0, 5), metavar="K",
                      help="the deployment's drafts a step (--plan; default 0)")
    info.add_argument("--decode-gemv", default="auto", choices=["auto", "head", "mma", "wide", "cuda"],
                      help="--plan: the decode GEMV family (auto: from --max-num-seqs and --speculative-tokens)")
    info.add_argument("--moe-kernels", default="mma", choices=["mma", "cuda"], help="--plan: the MoE family")
    info.set_defaults(func=cmd_info)

    q = sub.add_parser("quantize", help="quantise a checkpoint to MLX affine int4/int8")
    q.add_argument("input", help="input checkpoint directory")
    q.add_argument("output", help="output directory (new or empty)")
    q.add_argument("--bits", type=int, required=True, choices=[4, 8], help="bits per weight")
    q.add_argument("--group-size", type=int, default=64, choices=[32, 64, 128], help="quantisation group (default 64)")
    q.set_defaults(func=cmd_quantize)

    ex = sub.add_parser("export-gguf", help="write a llama.cpp GGUF file (qwen35moe / qwen35)",
                        description="Export a checkpoint (DIR OUT.gguf) or random weights of a preset's shapes "
                        "(--preset NAME --random OUT.gguf) as a llama.cpp GGUF file.")
    ex.add_argument("paths", nargs="+", metavar="PATH", help="DIR OUT.gguf, or only OUT.gguf with --preset")
    ex.add_argument("--type", default="f16", choices=["f32", "f16", "q8_0", "q4_k_m"], help="weight type (default f16)")
    ex.add_argument("--preset", help="synthetic preset whose shapes to write (needs --random), e.g. qwen3.6-35b-a3b")
    ex.add_argument("--random", action="store_true", help="random but valid weights instead of the checkpoint's")
    ex.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    ex.add_argument("--fuse-gate-up", action="store_true", help="experts as one ffn_gate_up_exps tensor")
    ex.add_argument("--quiet", action="store_true", help="no progress bar")
    ex.set_defaults(func=cmd_export_gguf)

    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat page at /)",
                         description="Serve the model over an OpenAI-compatible HTTP API (docs/server.md). Without "
                         "--model, the built-in tiny synthetic checkpoint (random weights).")
    from .server.args import add_serve_arguments

    add_serve_arguments(srv)
    add_parallel_flags(srv)
    srv.set_defaults(func=cmd_serve)

    # Listed for --help only: main() hands everything after `bench` to deltaserve.bench.main untouched.
    bench = sub.add_parser("bench", help="GPU benchmarks (needs the GPU benchmark module)", add_help=False)
    bench.set_defaults(func=cmd_bench)
    bs = sub.add_parser("bench-serve", help="load generator for OpenAI-compatible servers (deltaserve, llama-server)",
                        add_help=False)
    bs.set_defaults(func=cmd_bench_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv and argv[0] == "bench":  # everything after `bench` belongs to deltaserve.bench.main
        args = argparse.Namespace(func=cmd_bench, bench_args=argv[1:])
    elif argv and argv[0] == "bench-serve":  # and after `bench-serve` to deltaserve.bench.serve
        args = argparse.Namespace(func=cmd_bench_serve, bench_args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except (CLIError, ValueError, OSError) as e:  # ConfigError / CheckpointError / SamplingParamsError are ValueErrors
        print(f"deltaserve: error: {e}", file=sys.stderr)
        return 2
    except KeyError as e:  # lookups by name (presets, formats) raise KeyError with a readable message
        print(f"deltaserve: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
