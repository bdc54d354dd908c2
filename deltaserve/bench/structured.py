"""`deltaserve bench --structured-output`: decode tok/s through the engine loop with every row constrained by a
mid-size JSON schema, against the same requests unconstrained, in one run (issue 60's target: at most 5% slower).

  deltaserve bench --preset qwen3.6-35b-a3b --quant q4 --structured-output -b 1,64 -p 32 -n 128 -r 3

Unlike the kernel-level decode timing of `deltaserve bench` (a captured greedy step replayed), this goes through
LLMEngine.step: schedule, the decode graph, the host-side sampling inputs, the grammar masks (filled by xgrammar on the
host while the forward runs), sampling and the token append that advances each matcher. Both modes run the same
path, so the difference is the structured output's cost. Greedy, ignore_eos, n tokens per request; the timed part
starts once every request has its first token (prefill excluded) and counts the tokens produced after that.

Random weights write gibberish, so the schema makes the masks non-trivial on its own: an array of at least 64
objects with integers, bounded numbers, enums, pattern strings, a nested object and a bounded string array, compact
JSON (no free whitespace); it cannot complete within any n the bench uses, so every row runs its n tokens. The
tokenizer is the synthetic one at the preset's full vocabulary size (with a checkpoint, its own).
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from ..engine.llm import LLM
from ..engine.sampling_params import SamplingParams
from ..engine.tokenizer import TokenizerInfo
from ..structured import StructuredOutputsParams

ITEM = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "name", "email", "status", "score", "tags", "address"],
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 100000},
        "name": {"type": "string", "maxLength": 16},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org|net)$"},
        "status": {"enum": ["active", "inactive", "pending", "banned"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"], "properties": {
            "city": {"type": "string", "maxLength": 12}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
    },
}
BENCH_SCHEMA = {"type": "array", "items": ITEM, "minItems": 64}


def bench_params(n: int, constrained: bool) -> SamplingParams:
    so = StructuredOutputsParams(json=BENCH_SCHEMA, disable_any_whitespace=True) if constrained else None
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, structured_outputs=so)


def engine_decode_rate(llm: LLM, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> tuple[float, int]:
    """(decode tokens/s, tokens timed): the requests run through llm.engine; the clock starts once every request has
    its first token and stops when the last one finishes."""
    engine = llm.engine
    ids = {engine.add_request(list(p), sp) for p, sp in zip(prompts, params)}
    started: set[str] = set()
    while started != ids:  # prefill (and the grammars' compiles)
        started |= {o.request_id for o in engine.step() if o.new_token_ids}
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    sync()
    return tokens / (time.perf_counter() - t0), tokens


def compare(llm: LLM, batch: int, prompt_len: int, n: int, reps: int, seed: int = 0) -> dict[str, list[float]]:
    """tok/s per repetition for "free" and "json" (alternating, after one warm-up of each: graph captures, the
    grammar's compile); every request of a run has its own random prompt of prompt_len ordinary tokens."""
    vocab = llm.get_tokenizer().get_vocab_size(with_added_tokens=False)
    gen = torch.Generator().manual_seed(seed)
    rates: dict[str, list[float]] = {"free": [], "json": []}
    for rep in range(reps + 1):
        for mode in rates:
            prompts = torch.randint(0, vocab, (batch, prompt_len), generator=gen).tolist()
            rate, _ = engine_decode_rate(llm, prompts, [bench_params(n, mode == "json")] * batch)
            if rep:
                rates[mode].append(rate)
    return rates


def tokenizer_for(args) -> TokenizerInfo:
    if args.preset:
        from ..synthetic.presets import get_preset
        from ..synthetic.tokenizer import train_bpe

        return TokenizerInfo(train_bpe(get_preset(args.preset).bpe_size), eos_token_ids=[])
    from ..engine.tokenizer import load_tokenizer

    return load_tokenizer(args.model)


def run(args, model, name: str, quant: str, gpu: str, keep) -> None:
    """The --structured-output mode of `deltaserve bench`: per -b, one engine; per -n, free vs json; records kept."""
    from . import records

    tok = tokenizer_for(args)
    for b in args.batch:
        for n in args.n_gen:
            p = args.n_prompt[0]
            llm = LLM.from_model(model, tok, block_size=64, max_num_seqs=b, max_model_len=p + n + 16,
                                 max_num_batched_tokens=max(512, p), kv_cache_dtype=args.kv_cache_dtype,
                                 decode_gemv=args.decode_gemv)
            rates = compare(llm, b, p, n, args.reps)
            med = {m: statistics.median(r) for m, r in rates.items()}
            for mode, r in rates.items():
                what = ("every row constrained by deltaserve/bench/structured.BENCH_SCHEMA (xgrammar, compact JSON)"
                        if mode == "json" else "unconstrained")
                sd = statistics.stdev(r) if len(r) > 1 else 0.0
                keep(records.make_record("deltaserve", gpu, name, quant, "tg", n, p, b, med[mode], sd, args.reps,
                                         notes=f"engine loop (LLMEngine.step, greedy, ignore_eos), {what}"))
            print(f"# structured output, B={b} tg{n} after a {p}-token prompt: free {med['free']:.1f} tok/s, json "
                  f"{med['json']:.1f} tok/s ({100 * (1 - med['json'] / med['free']):+.1f}% slower)", flush=True)
            del llm
            torch.cuda.empty_cache()
