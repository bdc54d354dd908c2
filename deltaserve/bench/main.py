"""`deltaserve bench`: prefill and decode timed separately, llama-bench style (bench/README.md: the method).

  deltaserve bench --preset qwen3.6-35b-a3b --quant q4 -p 512 -n 128 -d 0,512,4096 -b 1,8,64 -r 5

Prefill (pp N @ d): B sequences with d tokens already cached each process N new tokens in one forward call;
tokens/s = B*N / time. Decode (tg N @ d): B sequences at depth d generate N tokens one step at a time (greedy, CUDA
graph replay); tokens/s = B*N / time. One warm-up run, then R repetitions; median and standard deviation.

Depth is laid down synthetically: the KV blocks of the first d positions and the DeltaNet state slots are filled with
random values instead of running a d-token prefill first. The timed phase reads exactly the same bytes either way
(attention reads d cached tokens, the recurrent state has a fixed size), and it keeps a 32K-deep, 64-stream run
inside the device budget. Records say so in their notes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ..engine.cuda_graph import DecodeGraph
from ..model import ForwardBatch, ModelConfig
from ..model.cache import parse_kv_cache_dtype
from ..utils import tuning
from . import records, roofline
from .random_model import build_random_model

BLOCK_SIZE = 64


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="deltaserve bench", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory")
    src.add_argument("--preset", help="synthetic preset (weights generated on the device), e.g. qwen3.6-35b-a3b")
    p.add_argument("--quant", default="q4", choices=["q4", "q8", "bf16"], help="weight format for --preset")
    p.add_argument("-p", "--n-prompt", type=_ints, default=[512], help="prefill tokens (comma list)")
    p.add_argument("-n", "--n-gen", type=_ints, default=[128], help="decode tokens (comma list; 0: no decode test)")
    p.add_argument("-d", "--depth", type=_ints, default=[0], help="context depths (comma list)")
    p.add_argument("-b", "--batch", type=_ints, default=[1], help="streams (comma list)")
    p.add_argument("-r", "--reps", type=int, default=5)
    p.add_argument("--no-graph", action="store_true",
                   help="decode (and B=1 prefill) eagerly instead of CUDA-graph replay")
    p.add_argument("--profile", action="store_true", help="break one decode step down by kernel class (at the first -d depth and -b batch)")
    p.add_argument("--profile-graph", action="store_true",
                   help="profile the captured decode graph's replays: each kernel's in-graph and critical time")
    p.add_argument("--profile-prefill", action="store_true",
                   help="profile one prefill of the first -b prompts of the first -p length (host vs GPU time, "
                   "syncs, top kernels and ops)")
    p.add_argument("--profile-prefill-graph", action="store_true",
                   help="profile the captured prefill graph of the first -b prompts of the first -p length: each "
                   "kernel's in-graph and critical time")
    p.add_argument("--profile-top", type=int, default=24,
                   help="kernels listed by the graph profiles (--profile-graph, --profile-prefill-graph)")
    p.add_argument("--engine", action="store_true",
                   help="decode through the engine (LLMEngine.step: what LLM.generate and the server run) next to "
                        "the graph replay, per -b and -d (deltaserve/bench/engine_bench.py)")
    p.add_argument("--sampling", default="greedy,default",
                   help="--engine: comma list of greedy (temperature 0) and default (SamplingParams(): temperature 1)")
    p.add_argument("--mixed", action="store_true",
                   help="--engine: the first -b streams decode while prompts arrive (--mixed-rate, --mixed-prompt), "
                        "against the same streams alone")
    p.add_argument("--mixed-rate", type=float, default=1.0, help="--mixed: prompt arrivals per second (Poisson)")
    p.add_argument("--mixed-prompt", type=_ints, default=[512, 4096], help="--mixed: MIN,MAX prompt tokens")
    p.add_argument("--mixed-seconds", type=float, default=20.0, help="--mixed: seconds of each run")
    p.add_argument("--prefix", type=_ints, default=[],
                   help="--engine: cached-prefix time to first token for these prefix lengths (P cached + 64 new "
                        "tokens) against cold, through the engine's prefix cache")
    p.add_argument("--speculative-tokens", type=_ints, default=[],
                   help="--engine: also decode with these k drafts a step from the MTP head, at each --acceptance "
                        "(SIMULATED: drafts replaced by the reply's recorded tokens; deltaserve/bench/spec_bench.py)")
    p.add_argument("--acceptance", type=lambda t: [float(x) for x in t.split(",") if x], default=[0.6, 0.8, 1.0],
                   help="--speculative-tokens: simulated per-draft acceptance rates (comma list)")
    p.add_argument("--results", default="bench/results", help="directory for the JSON-line records")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--decode-gemv", default="auto", choices=["auto", "mma", "cuda", "wide", "head"],
                   help="decode GEMV mode of the q4 linears; auto: each -b measured as a deployment for that many "
                        "streams (model/plan.py decode_gemv_for_rows: head below 4 rows, mma from 4), as an engine "
                        "with max_num_seqs = B picks it")
    p.add_argument("--moe-kernels", default="mma", choices=["mma", "cuda"],
                   help="kernel family of the q4 MoE blocks: mma (tensor cores, every token count) or cuda "
                        "(CUDA-core decode kernels: batch-1-only serving)")
    p.add_argument("--structured-output", action="store_true",
                   help="decode tok/s through the engine loop with every row constrained by a mid-size JSON schema "
                        "vs unconstrained (bench/structured.py; first -p as the prompt length, each -n and -b)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                   help="K/V cache of the attention layers: auto = bf16, fp8 = e4m3 with a scale per (token, head) row "
                        "(records get quant '<weights>-kvfp8')")
    return p.parse_args(argv)


def load_model(args):
    if args.preset:
        from ..synthetic.presets import get_preset

        config = ModelConfig.from_dict(get_preset(args.preset).config)
        mtp = config.mtp_num_hidden_layers if getattr(args, "speculative_tokens", None) else 0  # the draft head
        model = build_random_model(config, args.quant, args.device, mtp_layers=mtp)
        return model, config, args.preset, {"q4": "q4g64", "q8": "q8g64"}.get(args.quant, args.quant)
    from ..weights.loader import load_checkpoint

    loaded = load_checkpoint(args.model, device=args.device, dtype=torch.bfloat16,
                             mtp=True if getattr(args, "speculative_tokens", None) else False)
    quant = "bf16"
    if loaded.config.quantization:
        quant = f"q{loaded.config.quantization.get('bits')}g{loaded.config.quantization.get('group_size')}"
    return loaded.model, loaded.config, str(args.model), quant


class Streams:
    """B sequences with fixed block tables over one cache, depth laid down synthetically."""

    def __init__(self, model, config: ModelConfig, batch: int, max_len: int, kv_dtype: torch.dtype | None = None):
        self.model, self.batch = model, batch
        self.blocks_per_seq = -(-max_len // BLOCK_SIZE)
        self.cache = model.make_cache(batch * self.blocks_per_seq, BLOCK_SIZE, batch, torch.bfloat16,
                                      kv_dtype=kv_dtype)
        dev = self.cache.k[config.full_attention_layers[0]].device if config.full_attention_layers else "cuda"
        self.tables = torch.arange(batch * self.blocks_per_seq, dtype=torch.int32, device=dev).view(batch, -1)
        gen = torch.Generator(device=dev).manual_seed(1)
        for pool in list(self.cache.k.values()) + list(self.cache.v.values()):
            if pool.element_size() == 1:  # fp8 codes: random finite ones (0x7f / 0xff are NaN), either sign
                codes = pool.view(torch.uint8)
                codes.random_(0, 0x7F, generator=gen)
                codes.bitwise_or_(torch.randint(0, 2, codes.shape, dtype=torch.uint8, device=dev, generator=gen) << 7)
            else:
                pool.normal_(generator=gen)
        for pool in list(self.cache.k_scale.values()) + list(self.cache.v_scale.values()):
            pool.fill_(1 / 128)  # codes up to 448: values up to 3.5
        for pool in self.cache.ssm.values():
            pool.normal_(generator=gen).mul_(0.1)
        for pool in self.cache.conv.values():
            pool.normal_(generator=gen)
        self.vocab = config.vocab_size

    def prefill_batch(self, n: int, depth: int) -> ForwardBatch:
        tables = self.tables.tolist()
        ids = torch.randint(0, self.vocab, (self.batch, n)).tolist()
        return ForwardBatch.build(ids, [depth] * self.batch, tables, list(range(self.batch)), BLOCK_SIZE,
                                  device=self.tables.device)


def _time(fn, reps: int) -> list[float]:
    fn()  # warm-up: compilation, allocation
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def bench_prefill(streams: Streams, n: int, depth: int, reps: int, graph: bool) -> list[float]:
    """B sequences of n new tokens each after `depth` cached ones: through the engine's PrefillGraph (graph: as the
    engine runs one request's full chunk, or B requests' equal chunks that make its step size) or one eager forward."""
    fb = streams.prefill_batch(n, depth)
    if graph:
        from ..engine.cuda_graph import PrefillGraph, capturable

        b = streams.batch
        can_capture = capturable(streams.model)  # elsewhere (CPU tests) its replay runs the forward eagerly
        g = PrefillGraph(streams.model, streams.cache, n, streams.tables.shape[1], batch=b)
        flat = fb.input_ids.tolist()
        tokens = [flat[i * n:(i + 1) * n] for i in range(b)]
        tables = streams.tables.tolist()

        def run_graph():
            g.load_batch(tokens, [depth] * b, tables, list(range(b)))
            if g.graph is None and can_capture:
                g.capture()
            g.replay()

        return _time(run_graph, reps)

    @torch.no_grad()
    def run():
        streams.model(fb, streams.cache)

    return _time(run, reps)


def bench_decode(streams: Streams, n: int, depth: int, reps: int, graph: bool) -> list[float]:
    b = streams.batch
    dg = DecodeGraph(streams.model, streams.cache, b, streams.tables.shape[1], greedy_feedback=True)
    dev = streams.tables.device
    start = torch.full((b,), depth, dtype=torch.int64, device=dev)
    ids = torch.randint(0, streams.vocab, (b,), device=dev)
    slots = torch.arange(b, device=dev)
    dg.load(ids, start, start, streams.tables, slots)
    if graph:
        dg.capture()

    def run():
        dg.load(ids, start, start, streams.tables, slots)
        for _ in range(n):
            dg.replay()

    return _time(run, reps)


def _stats(times: list[float], tokens: int) -> tuple[float, float]:
    rates = [tokens / t for t in times]
    return statistics.median(rates), (statistics.stdev(rates) if len(rates) > 1 else 0.0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["vision"]:  # `deltaserve bench vision ...`: TTFT with images, encoder images/s (bench/vision.py)
        from .vision import main as vision_main

        return vision_main(argv[1:])
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("deltaserve bench: needs a CUDA device", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    model, config, name, quant = load_model(args)
    torch.cuda.synchronize()
    weight_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(f"# {name} {quant}: weights {weight_gib:.2f} GiB on {gpu}, built in {time.perf_counter() - t0:.1f}s",
          flush=True)
    fmt = roofline.WeightFormat.of(args.quant if args.preset else None)
    kv_dtype = parse_kv_cache_dtype(args.kv_cache_dtype)
    kv_bytes = 2.0 if kv_dtype is None else 1.0 + 4.0 / config.head_dim  # per cached K or V element
    if kv_dtype is not None:
        quant += "-kvfp8"
    recs = []
    max_len = max(args.depth) + max(max(args.n_prompt), max(args.n_gen)) + 8
    note = "depth laid down synthetically (random KV/state)"
    knobs = sorted(f"{k}={v}" for k, v in tuning.set_in_environment().items())
    if knobs:
        note += "; " + " ".join(knobs)  # debugging switches and experiments (utils/tuning.py) travel with the numbers
    def keep(rec: dict) -> None:
        # appended as soon as measured: a run cut short by a device time limit keeps what it finished
        recs.append(rec)
        keep.last = rec
        if not args.no_record:
            records.append_records([rec], args.results, gpu)

    from ..model import fast
    from ..model.plan import resolve_plan

    def deployment(b: int) -> str:
        """The kernel plan of a deployment for b streams (fixed on the model before its runs), as the records' note."""
        plan = resolve_plan(args.decode_gemv, args.moe_kernels, max_num_seqs=b)
        fast.set_plan(model, plan)
        why = f"a deployment for {b} stream{'s' * (b != 1)}" if args.decode_gemv == "auto" else "--decode-gemv"
        return f"; plan {plan.describe()} ({why})"

    if args.structured_output:
        from .structured import run as run_structured

        run_structured(args, model, name, quant, gpu, keep)
        print(records.format_table(recs))
        return 0
    if args.engine:
        run_engine_bench(args, model, config, name, quant, gpu, keep, deployment)
        print(records.format_table(recs))
        return 0
    for b in args.batch:
        gemv_note = deployment(b)
        streams = Streams(model, config, b, max_len, kv_dtype)
        for d in args.depth:
            for n in args.n_prompt:
                graphed = not args.no_graph
                times = bench_prefill(streams, n, d, args.reps, graphed)
                tps, sd = _stats(times, n * b)
                keep(records.make_record("deltaserve", gpu, name, quant, "pp", n, d, b, tps, sd, args.reps,
                                         notes=note + ("; prefill cuda graph (PrefillGraph)" if graphed else
                                                       "; prefill eager")))
                print(records.format_table(recs[-1:]).splitlines()[-1], flush=True)
            for n in args.n_gen:
                if n == 0:  # -n 0: prefill only
                    continue
                times = bench_decode(streams, n, d, args.reps, not args.no_graph)
                tps, sd = _stats(times, n * b)
                step_bytes = roofline.decode_step_bytes(config, fmt, b, d + n // 2, kv_cache_bytes=kv_bytes)
                gbps, pct = roofline.roofline(b / tps if tps else float("inf"), step_bytes,
                                              roofline.copy_ceiling(gpu))
                keep(records.make_record("deltaserve", gpu, name, quant, "tg", n, d, b, tps, sd, args.reps,
                                         gbps, pct, notes=note + ("; eager" if args.no_graph else "; cuda graph")
                                         + gemv_note))
                print(records.format_table(recs[-1:]).splitlines()[-1], flush=True)
        del streams
        torch.cuda.empty_cache()
    print(records.format_table(recs))
    if args.profile or args.profile_graph:
        deployment(args.batch[0])  # the profiled batch's deployment
    if args.profile:
        from .profile import profile_decode

        print(profile_decode(model, config, max(args.depth[0], 1), batch=args.batch[0]))
    if args.profile_graph:
        from .profile import profile_decode_graph

        print(profile_decode_graph(model, config, max(args.depth[0], 1), batch=args.batch[0], top=args.profile_top))
    if args.profile_prefill:
        from .profile import profile_prefill

        print(profile_prefill(model, config, args.n_prompt[0], batch=args.batch[0]))
    if args.profile_prefill_graph:
        from .profile import profile_prefill_graph

        deployment(args.batch[0])  # the profiled prompts' deployment
        print(profile_prefill_graph(model, config, args.n_prompt[0], batch=args.batch[0], top=args.profile_top))
    if not args.no_record:
        print(f"# {len(recs)} records appended under {args.results}")
    from ..model.fast import decode_copy_bytes

    copies = decode_copy_bytes(model) / 2**30
    # counted again now: the tensor-core MoE released the MLX experts once it had repacked them
    held = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(f"# peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB; weights now {held:.2f} GiB (at load "
          f"{weight_gib:.2f}) + {copies:.2f} GiB of tensor-core repacked weights = {held + copies:.2f} GiB")
    return 0


def run_engine_bench(args, model, config, name, quant, gpu, keep, deployment) -> None:
    """--engine: per -b and -d, the graph replay, then the engine with each --sampling; --mixed after."""
    from . import engine_bench as eb

    tokenizer = None
    if args.preset:
        from ..synthetic.presets import get_preset
        from ..synthetic.tokenizer import train_bpe

        tokenizer = train_bpe(get_preset(args.preset).bpe_size)  # the preset's tokenizer: detokenisation included
    n = args.n_gen[0]
    samplings = [s for s in args.sampling.split(",") if s]
    for b in args.batch:
        gemv = deployment(b)
        for d in args.depth:
            streams = Streams(model, config, b, d + n + 8)
            replay, _ = _stats(bench_decode(streams, n, d, args.reps, True), n * b)
            del streams
            torch.cuda.empty_cache()
            keep(records.make_record("deltaserve", gpu, name, quant, "tg", n, d, b, replay, 0.0, args.reps,
                                     notes="depth laid down synthetically; cuda graph replay (the --engine baseline)"
                                     + gemv))
            print(records.format_table([keep.last]).splitlines()[-1], flush=True)
            for sampling in samplings:
                runs = []
                for _ in range(max(1, args.reps // 2)):
                    engine = eb.make_engine(model, tokenizer, b, d + n + 8, decode_gemv=args.decode_gemv,
                                            moe_kernels=args.moe_kernels)
                    runs.append(eb.decode_run(engine, b, d, n, sampling, config.vocab_size))
                    del engine
                    torch.cuda.empty_cache()
                best = max(runs, key=lambda r: r["tok_s"])
                rates = [r["tok_s"] for r in runs]
                keep(records.make_record(
                    "deltaserve", gpu, name, quant, "tg-engine", n, d, b, statistics.median(rates),
                    statistics.stdev(rates) if len(rates) > 1 else 0.0, len(runs),
                    notes=f"through LLMEngine.step (LLM.generate's loop), sampling {sampling}, detokenised; host "
                          f"{best['host_ms']:.3f} ms/step; {statistics.median(rates) / replay:.3f} of the graph "
                          f"replay ({replay:.1f} tok/s, same run); depth laid down synthetically" + gemv))
                print(records.format_table([keep.last]).splitlines()[-1], flush=True)
    if args.speculative_tokens:
        run_spec_bench(args, model, config, name, quant, gpu, keep, tokenizer, samplings)
    for p in args.prefix:
        deployment(1)
        r = eb.prefix_run(model, tokenizer, p, 64, config.vocab_size)
        ratio = r["cold_ms"] / r["cached_ms"]
        keep(records.make_record(
            "deltaserve", gpu, name, quant, "pp-cached", 64, p, 1, 64 / (r["cached_ms"] / 1e3), 0.0, 1,
            notes=f"engine: time to first token of {p} cached + 64 new tokens {r['cached_ms']:.2f} ms against "
                  f"{r['cold_ms']:.2f} ms cold (a prefix never seen): {ratio:.1f}x; tokens equal to the same request "
                  f"without the cache: {r['same_tokens']}; a DeltaNet snapshot {r['snapshot_mib']:.1f} MiB, copied in "
                  f"{r['snapshot_ms']:.3f} ms"))
        print(records.format_table([keep.last]).splitlines()[-1], f"cold/cached {ratio:.1f}x", flush=True)
    if args.mixed:
        b, d = args.batch[0], args.depth[0]
        deployment(b + 8)
        lo, hi = args.mixed_prompt[0], args.mixed_prompt[-1]
        alone = eb.mixed_run(model, tokenizer, b, d, args.mixed_seconds, 0.0, (lo, hi), config.vocab_size)
        mixed = eb.mixed_run(model, tokenizer, b, d, args.mixed_seconds, args.mixed_rate, (lo, hi), config.vocab_size)
        ratio = mixed["tok_s"] / alone["tok_s"]
        keep(records.make_record(
            "deltaserve", gpu, name, quant, "tg-mixed", 0, d, b, mixed["tok_s"], 0.0, 1,
            notes=f"{b} streams decoding through the engine while {mixed['arrivals']} prompts of {lo}-{hi} tokens "
                  f"arrived ({args.mixed_rate}/s, 8 tokens each) over {args.mixed_seconds:.0f} s; alone "
                  f"{alone['tok_s']:.1f} tok/s; ratio {ratio:.3f}; sampling default; {mixed['prefill_graphs']} "
                  f"prefill graphs captured beforehand in {mixed['warm_s']:.1f} s"))
        print(records.format_table([keep.last]).splitlines()[-1], flush=True)


def run_spec_bench(args, model, config, name, quant, gpu, keep, tokenizer, samplings) -> None:
    """--speculative-tokens: per -b, -d and --sampling, the engine with drafting off (the speed reference), then
    with each k at each simulated acceptance (bench/spec_bench.py). A drafting engine may run another kernel plan than
    drafting off (its verify rows size it: spec_bench.plan_for); its replies are checked against drafting off under
    its own plan, also timed and recorded."""
    from . import engine_bench as eb
    from . import spec_bench as sb

    n = args.n_gen[0]
    opts = dict(decode_gemv=args.decode_gemv, moe_kernels=args.moe_kernels)
    for b in args.batch:
        for d in args.depth:
            for sampling in samplings:
                offs = {}  # kernel plan -> drafting off's run under it

                def off_run(plan, note: str):
                    if plan not in offs:
                        engine = eb.make_engine(model, tokenizer, b, sb.max_len(d, n), caching=False,
                                                decode_gemv=plan.decode_gemv, moe_kernels=plan.moe)
                        offs[plan] = eb.decode_run(engine, b, d, n, sampling, config.vocab_size)
                        del engine
                        torch.cuda.empty_cache()
                        keep(records.make_record(
                            "deltaserve", gpu, name, quant, "tg-engine", n, d, b, offs[plan]["tok_s"], 0.0, 1,
                            notes=f"drafting off ({note}), sampling {sampling}; depth laid down synthetically; "
                                  f"plan {plan.describe()}"))
                        print(records.format_table([keep.last]).splitlines()[-1], flush=True)
                    return offs[plan]

                base_plan = sb.plan_for(b, 0, **opts)
                base = off_run(base_plan, "the --speculative-tokens baseline")
                for k in args.speculative_tokens:
                    plan = sb.plan_for(b, k, **opts)
                    same = off_run(plan, f"the replies k={k} must equal: the drafting engine's plan")
                    for a in args.acceptance:
                        r = sb.spec_run(model, tokenizer, b, d, n, sampling, config.vocab_size, k, a, same["outputs"],
                                        **opts)
                        keep(records.make_record(
                            "deltaserve", gpu, name, quant, f"tg-spec{k}", n, d, b, r["tok_s"], 0.0, 1,
                            notes=f"SIMULATED ACCEPTANCE a={a}: MTP drafts (its compute run) replaced by the reply's "
                                  f"recorded tokens with probability a; k={k}; mean acceptance length "
                                  f"{r['mean_acceptance_length']:.2f}; replies equal drafting off under the same "
                                  f"plan: {r['exact']}; {r['tok_s'] / base['tok_s']:.3f} of drafting off "
                                  f"({base['tok_s']:.1f} tok/s, same run, plan {base_plan.describe()}); sampling "
                                  f"{sampling}; host {r['host_ms']:.3f} ms/step; drafting steps {r['graph_steps']} "
                                  f"through graphs ({r['followed_steps']} launched from the previous one's "
                                  f"read-back), {r['eager_steps']} eager; plan {r['plan'].describe()}"))
                        print(records.format_table([keep.last]).splitlines()[-1], flush=True)
