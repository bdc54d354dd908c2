"""Stops, streaming and detokenisation, on a scripted fake model with a one-token-per-byte tokenizer."""

from __future__ import annotations

import pytest

from engine_helpers import ScriptedModel, byte_tokenizer
from deltaserve.engine.detokenizer import IncrementalDetokenizer
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams, SamplingParamsError
from deltaserve.engine.tokenizer import TokenizerInfo

TOK = byte_tokenizer()
IM_END, ENDOFTEXT = 258, 256
TEXT = "Hello, wörld! 世界 🙂 done"
PROMPT = TOK.encode("Q: hi").ids


def script(*extra: int) -> list[int]:
    return TOK.encode(TEXT).ids + list(extra)


def engine_for(tokens: list[int], **cfg) -> LLMEngine:
    model = ScriptedModel(tokens, len(PROMPT))
    return LLMEngine(model, TOK, [IM_END, ENDOFTEXT], EngineConfig(**dict(dict(num_blocks=64, max_model_len=256), **cfg)))


def stream(engine: LLMEngine, params: SamplingParams):
    """All outputs of one request; checks on the way that the streamed text only ever grows the final text."""
    engine.add_request(PROMPT, params)
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    final = outs[-1]
    assert final.finished and all(not o.finished for o in outs[:-1])
    assert "".join(o.new_text for o in outs) == final.text
    assert [t for o in outs for t in o.new_token_ids] == final.token_ids
    shown = ""
    for o in outs:
        shown += o.new_text
        assert final.text.startswith(shown) and o.text == shown
    return final


def test_detokenizer_never_emits_half_characters():
    text = "héllo 世界 🙂!"
    ids = TOK.encode(text).ids
    assert len(ids) == len(text.encode())  # one token per byte: multi-byte characters span tokens
    d = IncrementalDetokenizer(TOK, PROMPT)
    deltas = []
    for t in ids:
        d.add_token(t)
        deltas.append(d.take_delta(finished=False))
    assert "".join(deltas) == text
    assert not any("\ufffd" in x for x in deltas)
    assert deltas[ids.index(240)] == ""  # first byte of the emoji: nothing to show yet


def test_detokenizer_flushes_an_incomplete_character_at_the_end():
    d = IncrementalDetokenizer(TOK, PROMPT)
    for t in TOK.encode("ok 🙂").ids[:-2]:
        d.add_token(t)
    assert d.text == "ok "
    d.flush()
    assert d.text.startswith("ok ") and d.text.endswith("\ufffd")


def test_eos_stops_and_is_kept_in_token_ids_not_text():
    out = stream(engine_for(script(IM_END, 65, 66)), SamplingParams(temperature=0, max_tokens=100))
    assert out.text == TEXT and out.finish_reason == "stop" and out.stop_reason is None
    assert out.token_ids == script(IM_END)


def test_both_default_eos_ids_stop():
    out = stream(engine_for(script(ENDOFTEXT, 65)), SamplingParams(temperature=0, max_tokens=100))
    assert out.finish_reason == "stop" and out.token_ids[-1] == ENDOFTEXT


def test_ignore_eos_runs_to_max_tokens_and_skips_special_text():
    tokens = script(IM_END, 65, 66, 67)
    n = len(tokens) - 1
    out = stream(engine_for(tokens), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    assert out.finish_reason == "length" and out.token_ids == tokens[:n]
    assert out.text == TEXT + "AB"
    raw = stream(engine_for(tokens), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                                    skip_special_tokens=False))
    assert raw.text == TEXT + "<|im_end|>AB"


def test_stop_token_ids():
    tokens = script(IM_END)
    comma = TOK.encode(",").ids[0]
    out = stream(engine_for(tokens), SamplingParams(temperature=0, max_tokens=100, stop_token_ids=[comma]))
    assert out.text == "Hello" and out.token_ids == TOK.encode("Hello,").ids
    assert out.finish_reason == "stop" and out.stop_reason == comma


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_multibyte_tokens(include):
    params = SamplingParams(temperature=0, max_tokens=100, stop=["ö", "世界"], include_stop_str_in_output=include)
    out = stream(engine_for(script(IM_END)), params)
    assert out.text == ("Hello, wö" if include else "Hello, w")
    assert out.finish_reason == "stop" and out.stop_reason == "ö"
    assert out.token_ids == TOK.encode("Hello, wö").ids  # generation ends on the token that completes the match


def test_long_stop_string_is_held_back_while_streaming():
    params = SamplingParams(temperature=0, max_tokens=100, stop=["! 世界 🙂 dXne", "🙂 do"])
    out = stream(engine_for(script(IM_END)), params)
    assert out.text == "Hello, wörld! 世界 " and out.stop_reason == "🙂 do"


def test_max_tokens_gives_length():
    out = stream(engine_for(script(IM_END)), SamplingParams(temperature=0, max_tokens=5))
    assert out.text == "Hello" and out.finish_reason == "length" and len(out.token_ids) == 5


def test_context_length_caps_max_tokens():
    out = stream(engine_for(script(IM_END), max_model_len=len(PROMPT) + 4), SamplingParams(temperature=0, max_tokens=50))
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_llm_generate_stream_matches_generate_for_several_prompts():
    llm = LLM.from_model(ScriptedModel(script(IM_END), len(PROMPT)), TokenizerInfo(TOK, eos_token_ids=[IM_END]),
                         num_blocks=64, max_model_len=256)
    prompts = [PROMPT, PROMPT]
    params = [SamplingParams(temperature=0, max_tokens=100), SamplingParams(temperature=0, max_tokens=100, stop=["!"])]
    final = llm.generate(prompts, params)
    assert [o.text for o in final] == [TEXT, "Hello, wörld"]
    texts = {}
    for o in llm.generate_stream(prompts, params):
        texts[o.request_id] = texts.get(o.request_id, "") + o.new_text
    assert sorted(texts.values()) == sorted(o.text for o in final)


def test_abandoned_stream_gives_its_memory_back():
    llm = LLM.from_model(ScriptedModel(script(IM_END), len(PROMPT)), TokenizerInfo(TOK, eos_token_ids=[IM_END]),
                         num_blocks=64, max_model_len=256)
    gen = llm.generate_stream([PROMPT], SamplingParams(temperature=0, max_tokens=100))
    next(gen)
    gen.close()
    assert not llm.engine.has_unfinished() and llm.engine.scheduler.blocks.num_free == 64
    assert llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=100))[0].text == TEXT


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(seed=-1), "seed"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(stop=[""]), r"stop\[0\]"),
        (dict(stop_token_ids=[-4]), r"stop_token_ids\[0\]"),
        (dict(ignore_eos="yes"), "ignore_eos"),
    ],
)
def test_sampling_params_errors_name_the_field(kwargs, field):
    with pytest.raises(SamplingParamsError, match=rf"SamplingParams\.{field}"):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_normalisation():
    p = SamplingParams(stop="x", top_k=-1)
    assert p.stop == ["x"] and p.top_k == 0 and p.temperature == 1.0 and p.max_tokens == 16
    assert SamplingParams(temperature=0).greedy
