"""`deltaserve bench-serve` (or `python -m deltaserve.bench.serve`): a serving load generator, vLLM benchmark_serving
style, for any OpenAI-compatible server: deltaserve's own, llama.cpp's `llama-server`, vLLM.

  deltaserve bench-serve --base-url http://127.0.0.1:8000 --input-len 512 --output-len 128 \\
      --num-prompts 256 --max-concurrency 64 --model-label qwen3.6-35b-a3b --quant-label q4g64

Every request is a streamed POST /v1/completions of random token ids (`prompt` as a token array, so every engine sees
exactly --input-len tokens, no tokenizer in the loop) with `max_tokens` = --output-len, `ignore_eos` and greedy
sampling, so every engine generates exactly the same number of tokens. Arrivals: all at once (`--request-rate inf`)
or Poisson at a rate, either way at most --max-concurrency in flight. `--max-duration` stops sending new requests
after that many seconds (a time-boxed run reports what completed).

Reported: request throughput, output tok/s (generated tokens / wall time), total tok/s (prompt + output), TTFT
(request sent -> first text chunk), ITL (gaps between text chunks), TPOT ((latency - TTFT) / (tokens - 1)), each
median and p99. One JSON line is appended under --results in the bench record format (bench/records.py; test
"serve", n = output length, depth = input length, batch = concurrency) with the latencies as extra keys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

from . import records


@dataclass
class Result:
    ok: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="deltaserve bench-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--model", help="`model` sent with each request (default: the first of GET /v1/models)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default 100)")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens per request (default 512)")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (default 128)")
    p.add_argument("--max-concurrency", type=int, default=1, help="requests in flight at most (default 1)")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrivals per second (default inf: all at once, bounded by --max-concurrency)")
    p.add_argument("--max-duration", type=float, help="stop sending new requests after this many seconds")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first (default 1)")
    p.add_argument("--token-range", default="0,1000",
                   help="prompt token ids are drawn from [LO, HI) (default 0,1000: ordinary tokens of every preset)")
    p.add_argument("--seed", type=int, default=0, help="prompts and arrival times (default 0)")
    p.add_argument("--timeout", type=float, default=3600, help="per-request timeout in seconds")
    p.add_argument("--engine-label", help="record's engine (default: from /v1/models owned_by: deltaserve, llama.cpp)")
    p.add_argument("--model-label", help="record's model (default: the served model name)")
    p.add_argument("--quant-label", default="", help="record's quant, e.g. q4g64 or q4_k_m")
    p.add_argument("--gpu", help="record's gpu (default: nvidia-smi's first GPU name, else 'cpu')")
    p.add_argument("--notes", default="", help="appended to the record's notes")
    p.add_argument("--results", default="bench/results", help="directory for the JSON-line record")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    for name in ("num_prompts", "input_len", "output_len", "max_concurrency"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def make_prompts(n: int, length: int, token_range: str, seed: int) -> list[list[int]]:
    lo, hi = (int(v) for v in token_range.split(","))
    rng = random.Random(seed)
    return [[rng.randrange(lo, hi) for _ in range(length)] for _ in range(n)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def gpu_name(flag: str | None) -> str:
    if flag:
        return flag
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
        name = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        name = ""
    return name or "cpu"


async def one_request(client, url: str, body: dict, headers: dict) -> Result:
    res = Result(prompt_tokens=len(body["prompt"]))
    start = last = time.perf_counter()
    chunks = 0
    usage = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"])[:200]
                    return res
                usage = chunk.get("usage") or usage
                if "timings" in chunk and usage is None:  # llama-server's own counters
                    usage = {"completion_tokens": chunk["timings"].get("predicted_n")}
                text = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
                if not text:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last, chunks = now, chunks + 1
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency = time.perf_counter() - start
    res.output_tokens = int((usage or {}).get("completion_tokens") or chunks)
    res.ok = chunks > 0
    return res


async def run(args, prompts: list[list[int]], model: str) -> tuple[list[Result], float]:
    import httpx

    url = args.base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency + 4, max_keepalive_connections=args.max_concurrency)

    def body(prompt):
        return {"model": model, "prompt": prompt, "max_tokens": args.output_len, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        warm = make_prompts(args.warmup, args.input_len, args.token_range, args.seed + 1)
        for w in await asyncio.gather(*(one_request(client, url, body(p), headers) for p in warm)):
            if not w.ok:
                raise RuntimeError(f"warm-up request failed: {w.error}")
        gate = asyncio.Semaphore(args.max_concurrency)
        rng = random.Random(args.seed)
        tasks: list[asyncio.Task] = []
        start = time.perf_counter()

        def timed_out() -> bool:
            return args.max_duration is not None and time.perf_counter() - start > args.max_duration

        async def limited(prompt) -> Result | None:
            async with gate:
                if timed_out():  # the time box closed while this one waited for a slot: never sent
                    return None
                return await one_request(client, url, body(prompt), headers)

        for prompt in prompts:
            if timed_out():
                break
            tasks.append(asyncio.ensure_future(limited(prompt)))
            if math.isfinite(args.request_rate):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = [r for r in await asyncio.gather(*tasks) if r is not None]
        return results, time.perf_counter() - start


def summarize(results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    itl = [g for r in ok for g in r.itl]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    ms = 1000.0
    return {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": round(wall, 3),
        "request_throughput": round(len(ok) / wall, 3) if wall else 0.0,
        "output_tok_s": round(out_tokens / wall, 2) if wall else 0.0,
        "total_tok_s": round((in_tokens + out_tokens) / wall, 2) if wall else 0.0,
        "ttft_ms_p50": round(percentile([r.ttft for r in ok], 50) * ms, 2),
        "ttft_ms_p99": round(percentile([r.ttft for r in ok], 99) * ms, 2),
        "itl_ms_p50": round(percentile(itl, 50) * ms, 2), "itl_ms_p99": round(percentile(itl, 99) * ms, 2),
        "tpot_ms_p50": round(percentile(tpot, 50) * ms, 2),
        "e2e_ms_p50": round(percentile([r.latency for r in ok], 50) * ms, 2),
        "output_tokens": out_tokens,
        "errors": sorted({r.error for r in results if not r.ok})[:3],
    }


def served_model(args) -> tuple[str, str]:
    """(model name, owner) from GET /v1/models."""
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    r = httpx.get(args.base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    first = r.json()["data"][0]
    return first["id"], str(first.get("owned_by", ""))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    name, owner = served_model(args)
    model = args.model or name
    engine = args.engine_label or {"deltaserve": "deltaserve", "llamacpp": "llama.cpp"}.get(owner, owner or "unknown")
    prompts = make_prompts(args.num_prompts, args.input_len, args.token_range, args.seed)
    results, wall = asyncio.run(run(args, prompts, model))
    s = summarize(results, wall)
    arrivals = ("all at once" if not math.isfinite(args.request_rate) else f"Poisson {args.request_rate}/s")
    print(f"# {engine} {model}: {s['completed']} of {len(results)} requests ({args.input_len} in / {args.output_len}"
          f" out, concurrency {args.max_concurrency}, {arrivals}) in {s['duration_s']:.1f} s")
    print(f"  request throughput {s['request_throughput']:.2f} req/s | output {s['output_tok_s']:.1f} tok/s | "
          f"total {s['total_tok_s']:.1f} tok/s")
    print(f"  TTFT p50 {s['ttft_ms_p50']:.1f} ms p99 {s['ttft_ms_p99']:.1f} ms | ITL p50 {s['itl_ms_p50']:.2f} ms "
          f"p99 {s['itl_ms_p99']:.2f} ms | TPOT p50 {s['tpot_ms_p50']:.2f} ms")
    if s["errors"]:
        print(f"  errors: {s['errors']}")
    gpu = gpu_name(args.gpu)
    notes = (f"engine path (HTTP server, streamed /v1/completions); {arrivals}, max concurrency "
             f"{args.max_concurrency}; {len(results)} requests sent"
             + (f" (time box {args.max_duration:g} s)" if args.max_duration is not None else "")
             + (f"; {args.notes}" if args.notes else ""))
    rec = records.make_record(engine, gpu, args.model_label or model, args.quant_label, "serve", args.output_len,
                              args.input_len, args.max_concurrency, s["output_tok_s"], 0.0, 1, notes=notes)
    rec.update({k: v for k, v in s.items() if k != "errors"})
    rec["request_rate"] = None if not math.isfinite(args.request_rate) else args.request_rate
    print(json.dumps(rec))
    if not args.no_record:
        path = records.append_records([rec], args.results, gpu)
        print(f"# record appended to {path}")
    return 0 if s["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
