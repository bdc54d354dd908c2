"""`deltaserve bench --structured-output`'s measuring loop on CPU with the tiny model: both modes run every request's
n tokens (the bench schema cannot finish early), the constrained replies stay inside the schema's language, and the
timed tokens are the ones after each request's first."""

from __future__ import annotations

import json

import pytest

from engine_helpers import tiny_model
from deltaserve.bench.structured import BENCH_SCHEMA, bench_params, compare, engine_decode_rate
from deltaserve.bench.main import parse_args
from deltaserve.engine.llm import LLM
from deltaserve.engine.tokenizer import TokenizerInfo
from deltaserve.synthetic.presets import TINY_BPE_SIZE, TINY_VOCAB
from deltaserve.synthetic.tokenizer import train_bpe

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def llm():
    tok = train_bpe(TINY_BPE_SIZE)
    im_end = tok.token_to_id("<|im_end|>")
    return LLM.from_model(tiny_model(vocab_size=TINY_VOCAB, eos_token_id=im_end), TokenizerInfo(tok), max_num_seqs=3)


def test_both_modes_time_every_token_after_the_first(llm):
    prompts = [[11, 12, 13], [14, 15], [16, 17, 18, 19]]
    for constrained in (False, True):
        rate, tokens = engine_decode_rate(llm, prompts, [bench_params(12, constrained)] * 3)
        assert tokens == 3 * 11 and rate > 0


def test_the_constrained_replies_follow_the_bench_schema(llm):
    outs = llm.generate([[5, 6], [7, 8, 9]], bench_params(40, True))
    compiled = llm.engine.structured.compiler.submit(bench_params(40, True).structured_outputs).result()
    for out in outs:
        assert len(out.token_ids) == 40 and out.text.startswith('[{"id": ')
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(t) for t in out.token_ids) and not matcher.is_completed()
    assert BENCH_SCHEMA["minItems"] == 64 and json.dumps(BENCH_SCHEMA)


def test_compare_alternates_the_modes_after_a_warm_up(llm):
    rates = compare(llm, batch=2, prompt_len=4, n=5, reps=2)
    assert set(rates) == {"free", "json"} and all(len(r) == 2 and min(r) > 0 for r in rates.values())


def test_the_flag_parses():
    args = parse_args(["--preset", "qwen3.6-35b-a3b", "--structured-output", "-b", "1,64", "-n", "128", "-p", "32"])
    assert args.structured_output and args.batch == [1, 64] and args.n_gen == [128]
