"""Public API on a synthetic tiny-moe checkpoint: generate, generate_stream, chat (template oracle: transformers),
logits, stops from generation_config, errors."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

import deltaserve
from deltaserve import LLM, RequestOutput, SamplingParams
from deltaserve.synthetic import make_checkpoint

torch.set_num_threads(1)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-moe"), "tiny-moe", seed=0, dtype="fp32", progress=False)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, max_model_len=512, max_num_seqs=4)


def test_public_names():
    assert sorted(deltaserve.__all__) == ["CompletionOutput", "LLM", "RequestOutput", "SamplingParams"]
    with pytest.raises(AttributeError):
        deltaserve.Scheduler  # noqa: B018


def test_generate_accepts_text_lists_and_token_lists(llm):
    greedy = SamplingParams(temperature=0, max_tokens=8)
    one = llm.generate("Hello there", greedy)
    assert len(one) == 1 and isinstance(one[0], RequestOutput)
    o = one[0]
    assert o.prompt == "Hello there" and o.prompt_token_ids == llm.encode("Hello there")
    assert o.finish_reason in ("stop", "length") and o.finished and len(o.token_ids) <= 8
    both = llm.generate(["The sea", "Hello there"], greedy)
    assert [x.prompt for x in both] == ["The sea", "Hello there"]
    assert both[1].token_ids == o.token_ids and both[1].text == o.text
    as_ids = llm.generate([llm.encode("The sea")], greedy)
    assert as_ids[0].token_ids == both[0].token_ids and as_ids[0].prompt is None
    assert llm.get_tokenizer().decode(o.token_ids, skip_special_tokens=True).startswith(o.text)


def test_per_prompt_sampling_params(llm):
    ps = [SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0.8, seed=3, max_tokens=6)]
    outs = llm.generate(["a", "b"], ps)
    assert len(outs[0].token_ids) <= 3 and len(outs[1].token_ids) <= 6
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], ps)


def test_generate_stream_deltas_add_up_to_generate(llm):
    sp = SamplingParams(temperature=0.7, seed=11, max_tokens=12)
    final = llm.generate(["Once upon"], sp)[0]
    text, ids = "", []
    for out in llm.generate_stream(["Once upon"], sp):
        text += out.new_text
        ids += out.new_token_ids
    assert (text, ids) == (final.text, final.token_ids) and out.finished


def test_logits_shape_dtype_and_agreement_with_greedy(llm):
    ids = llm.encode("The capital of France")
    logits = llm.logits(ids)
    assert logits.shape == (len(ids), llm.engine.vocab_size) and logits.dtype == torch.float32
    first = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))[0].token_ids[0]
    assert int(logits[-1].argmax()) == first
    torch.testing.assert_close(llm.logits(ids[:3]), logits[:3], rtol=1e-4, atol=1e-4)  # causal (fp32: chunked vs recurrent form)


def test_default_stop_ids_come_from_generation_config_and_tokenizer(llm, ckpt):
    gen = json.loads((ckpt / "generation_config.json").read_text())
    tok = llm.get_tokenizer()
    assert isinstance(tok, Tokenizer)
    expected = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert expected <= llm.engine.eos_token_ids
    assert set(gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]) <= llm.engine.eos_token_ids


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_matches_transformers(llm, ckpt, thinking):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(ckpt))
    for tools in (None, TOOLS):
        ours = llm.render_chat(MESSAGES, enable_thinking=thinking, tools=tools)
        theirs = hf.apply_chat_template(MESSAGES, tools=tools, tokenize=False, add_generation_prompt=True,
                                        enable_thinking=thinking)
        assert ours == theirs
        assert llm.encode(ours, add_special_tokens=False) == hf.encode(theirs, add_special_tokens=False)
    suffix = "<|im_start|>assistant\n<think>\n" if thinking else "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert ours.endswith(suffix)


def test_chat_generates_from_the_rendered_prompt(llm):
    sp = SamplingParams(temperature=0, max_tokens=6)
    outs = llm.chat([MESSAGES, MESSAGES[1:]], sp, enable_thinking=False)
    assert len(outs) == 2 and outs[0].prompt == llm.render_chat(MESSAGES, enable_thinking=False)
    direct = llm.generate([llm.encode(outs[0].prompt, add_special_tokens=False)], sp)[0]
    assert direct.token_ids == outs[0].token_ids
    single = llm.chat(MESSAGES, sp, enable_thinking=False)
    assert single[0].token_ids == outs[0].token_ids


def test_chat_rejects_malformed_messages(llm):
    with pytest.raises(ValueError, match=r"messages\[1\] has no string 'role'"):
        llm.chat([{"role": "user", "content": "x"}, {"content": "y"}])


def test_bf16_load_generates(ckpt):
    llm = LLM(ckpt, dtype="bfloat16", max_model_len=128, max_num_seqs=2)
    assert next(llm.engine.model.parameters()).dtype == torch.bfloat16
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=4))[0]
    assert len(out.token_ids) >= 1


def test_bad_model_dir_and_dtype_errors(tmp_path, ckpt):
    with pytest.raises(ValueError, match="no config.json"):
        LLM(tmp_path)
    (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(ValueError, match="no tokenizer.json"):
        LLM(tmp_path)
    with pytest.raises(ValueError, match="dtype 'int3'"):
        LLM(ckpt, dtype="int3")
