"""Structured output through the engine on a tiny random model, whose free output is gibberish, so the constraint does
all the work: replies parse and validate, constrained and free rows share batches with the same tokens as alone, the
reasoning stays free until </think>, forced tool calls parse, a dead end ends cleanly, bad specs fail at add_request
with nothing running lost, and a request waits for its grammar outside the scheduler."""

from __future__ import annotations

import json
import re
import threading

import pytest

from engine_helpers import ScriptedModel, tiny_model
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams, SamplingParamsError
from deltaserve.engine.structured import GRAMMAR_DEAD_END
from deltaserve.engine.tokenizer import TokenizerInfo
from deltaserve.structured import StructuredOutputsParams as SO
from deltaserve.structured.openai_request import request_structured_outputs
from deltaserve.synthetic.chat_template import chat_template
from deltaserve.synthetic.presets import TINY_BPE_SIZE, TINY_VOCAB
from deltaserve.synthetic.tokenizer import train_bpe

jsonschema = pytest.importorskip("jsonschema")
xgr = pytest.importorskip("xgrammar")

TOK = train_bpe(TINY_BPE_SIZE)
ENDOFTEXT, IM_END = TOK.token_to_id("<|endoftext|>"), TOK.token_to_id("<|im_end|>")
THINK_END = TOK.token_to_id("</think>")
INFO = TokenizerInfo(TOK, chat_template(), {"eos_token": "<|im_end|>"}, [IM_END, ENDOFTEXT])

SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["user", "note"], "properties": {
        "user": {"type": "object", "additionalProperties": False, "required": ["id", "active", "role"], "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999}, "active": {"type": "boolean"},
            "role": {"enum": ["admin", "guest"]}}},
        "note": {"type": ["string", "null"], "maxLength": 6}}},
    "enums": {"type": "object", "required": ["color", "size", "n"], "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]},
        "n": {"const": 3}}},
    "bounded_array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
                      "maxItems": 4},
    "numbers": {"type": "object", "required": ["x", "n", "k"], "properties": {
        "x": {"type": "number", "minimum": -1.5, "maximum": 2.5}, "n": {"type": "integer", "exclusiveMinimum": 0,
                                                                     "maximum": 100},
        "k": {"type": "integer", "multipleOf": 5}}},
    "patterns": {"type": "object", "required": ["code", "word", "day"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "word": {"type": "string", "minLength": 2,
                                                                            "maxLength": 5},
        "day": {"type": "string", "format": "date"}}},
    "refs": {"$defs": {"pt": {"type": "object", "required": ["x", "y"], "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}}}, "type": "object", "required": ["a", "b"],
        "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"anyOf": [{"$ref": "#/$defs/pt"}, {"type": "null"}]}}},
    "objects_in_array": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
        "type": "object", "required": ["k", "v"], "properties": {"k": {"enum": ["p", "q"]}, "v": {"type": "boolean"}}}},
}
PAIRS = 'root ::= pair ("," pair){0,2}\npair ::= key "=" value\nkey ::= [a-z]{1,4}\nvalue ::= [0-9]{1,3} | "true" | "false"'
PAIRS_RE = r"[a-z]{1,4}=([0-9]{1,3}|true|false)(,[a-z]{1,4}=([0-9]{1,3}|true|false)){0,2}"


@pytest.fixture(scope="module")
def model():
    return tiny_model(vocab_size=TINY_VOCAB, eos_token_id=IM_END)


@pytest.fixture(scope="module")
def llm(model):
    return LLM.from_model(model, INFO, max_num_seqs=16)


def compact(schema) -> SO:
    return SO(json=schema, disable_any_whitespace=True)


def test_json_schema_replies_parse_and_validate(llm):
    prompts, params, names = [], [], []
    for name, schema in SCHEMAS.items():
        for prompt, temperature in (("Hello", 0.0), ("The capital", 1.0)):
            prompts.append(prompt)
            params.append(SamplingParams(temperature=temperature, seed=7, max_tokens=120,
                                         structured_outputs=compact(schema)))
            names.append(name)
    for name, out in zip(names, llm.generate(prompts, params)):
        assert out.finish_reason == "stop" and out.stop_reason is None, (name, out.text)
        assert out.token_ids[-1] in (IM_END, ENDOFTEXT)  # the grammar allowed the end exactly where it is complete
        jsonschema.validate(json.loads(out.text), SCHEMAS[name])


def test_any_whitespace_replies_stay_inside_the_language(llm):
    """With whitespace free, a cut reply is still a prefix the grammar accepts; a finished one validates."""
    schema = SCHEMAS["nested"]
    outs = llm.generate(["a", "b", "c"], [SamplingParams(temperature=t, seed=3, max_tokens=40,
                                                         structured_outputs=SO(json=schema)) for t in (0, 1, 1.5)])
    compiled = llm.engine.structured.compiler.submit(SO(json=schema)).result()
    for out in outs:
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(t) for t in out.token_ids), out.text
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
        else:
            assert out.finish_reason == "length" and len(out.token_ids) == 40


def test_regex_choice_json_object_and_ebnf(llm):
    cases = [
        (SO(regex=r"\+?[0-9]{2} [0-9]{3}-[0-9]{4}"), lambda t: re.fullmatch(r"\+?[0-9]{2} [0-9]{3}-[0-9]{4}", t)),
        (SO(regex=r"[a-z]{3,6}@[a-z]{2,4}\.(com|org)"), lambda t: re.fullmatch(r"[a-z]{3,6}@[a-z]{2,4}\.(com|org)", t)),
        (SO(choice=["yes", "no", "it \"depends\"\n"]), lambda t: t in ("yes", "no", "it \"depends\"\n")),
        (SO(json_object=True, disable_any_whitespace=True), lambda t: isinstance(json.loads(t), dict)),
        (SO(grammar=PAIRS), lambda t: re.fullmatch(PAIRS_RE, t)),
    ]
    params = [SamplingParams(temperature=temp, seed=seed, max_tokens=60, structured_outputs=so)
              for so, _ in cases for temp, seed in ((0, 0), (1.0, 1), (1.0, 2))]
    outs = llm.generate(["x"] * len(params), params)
    for i, out in enumerate(outs):
        if cases[i // 3][0].json_object and out.finish_reason == "length":
            continue  # any JSON object may run long; its prefix is checked by the whitespace test's property
        assert out.finish_reason == "stop" and cases[i // 3][1](out.text), (cases[i // 3][0], out.text)


def test_constrained_and_free_rows_get_the_same_tokens_batched_as_alone(model, llm):
    prompts = ["Hello", "The capital of", [5, 6, 7, 8, 9] * 7, "x", "Numbers: 1.5 GB/s", "Recipe: mix"]
    params = []
    for temperature in (0.0, 0.8):
        params += [
            SamplingParams(temperature=temperature, seed=11, max_tokens=24, structured_outputs=compact(SCHEMAS["refs"])),
            SamplingParams(temperature=temperature, seed=12, max_tokens=24),
            SamplingParams(temperature=temperature, seed=13, max_tokens=24, structured_outputs=SO(regex="[a-f]{30}")),
            SamplingParams(temperature=temperature, seed=14, max_tokens=24, top_k=5, top_p=0.9),
            SamplingParams(temperature=temperature, seed=15, max_tokens=24, structured_outputs=SO(grammar=PAIRS)),
            SamplingParams(temperature=temperature, seed=16, max_tokens=24, repetition_penalty=1.3,
                           structured_outputs=SO(json=SCHEMAS["numbers"])),
        ]
    all_prompts = prompts * 2
    alone = [llm.generate([p], [sp])[0].token_ids for p, sp in zip(all_prompts, params)]
    # a small token budget: staggered admissions, prefill chunks beside decodes, varying batch sizes
    busy = LLM.from_model(model, INFO, max_num_seqs=5, max_num_batched_tokens=16)
    together = [o.token_ids for o in busy.generate(all_prompts, params)]
    assert together == alone


def scripted_llm(script: list[int], prompt_len: int) -> LLM:
    return LLM.from_model(ScriptedModel(script, prompt_len, vocab=TINY_VOCAB), INFO, num_blocks=64, max_model_len=256)


def test_the_reasoning_is_free_and_the_answer_constrained_after_think():
    """A model that writes non-digits, </think>, then more non-digits: with after_think the reasoning is kept as
    written and the answer after </think> is forced to the regex; without it the constraint starts at once."""
    reasoning = TOK.encode("Let me think: the answer").ids
    script = reasoning + [THINK_END] + TOK.encode("Paris, of course").ids
    prompt = TOK.encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n").ids
    llm = scripted_llm(script, len(prompt))
    gated = SamplingParams(temperature=0, max_tokens=40, structured_outputs=SO(regex="[0-9]{3}", after_think=True))
    out = llm.generate([prompt], gated)[0]
    assert out.token_ids[:len(reasoning) + 1] == reasoning + [THINK_END]
    assert re.fullmatch(r"Let me think: the answer</think>[0-9]{3}", out.text)
    assert out.finish_reason == "stop" and out.token_ids[-1] in (IM_END, ENDOFTEXT)
    plain = llm.generate([prompt], gated.clone(structured_outputs=SO(regex="[0-9]{3}")))[0]
    assert re.fullmatch("[0-9]{3}", plain.text) and plain.finish_reason == "stop"


def test_chat_sets_the_gate_from_its_rendered_prompt():
    messages = [{"role": "user", "content": "q"}]
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=SO(regex="[0-9]{3}"))
    for thinking in (True, False):
        prompt = TOK.encode(LLM.render_chat(_bare(), messages, thinking)).ids
        script = TOK.encode("free text").ids + [THINK_END] + TOK.encode("more").ids
        out = scripted_llm(script, len(prompt)).chat(messages, params, enable_thinking=thinking)[0]
        expected = r"free text</think>[0-9]{3}" if thinking else r"[0-9]{3}"
        assert re.fullmatch(expected, out.text), (thinking, out.text)


def _bare():
    """An object with just what LLM.render_chat reads (the tokenizer info), to render without a model."""
    return type("Bare", (), {"tokenizer_info": INFO})()


def parse_calls(text: str) -> list[tuple[str, dict]]:
    """(name, arguments) of each Qwen XML tool call; string values as written, others as JSON (the template's form)."""
    calls = re.findall(r"<tool_call>\n<function=([^>\n]+)>\n(.*?)\n</function>\n</tool_call>", text, re.S)
    assert "\n".join(f"<tool_call>\n<function={n}>\n{b}\n</function>\n</tool_call>" for n, b in calls) == text
    out = []
    for name, body in calls:
        args = {}
        for key, value in re.findall(r"<parameter=([^>\n]+)>(.*?)</parameter>", body, re.S):
            value = value.strip()
            try:
                args[key] = json.loads(value)
            except json.JSONDecodeError:
                args[key] = value
        out.append((name, args))
    return out


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]{2,8}$"}, "days": {"type": "integer", "minimum": 1,
                                                                              "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "days", "unit"]}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {"type": "object", "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23}, "loud": {"type": "boolean"},
        "days": {"type": "array", "items": {"enum": ["mon", "tue"]}, "maxItems": 2}},
        "required": ["hour", "loud"]}}},
]


@pytest.mark.parametrize("tool_choice, parallel", [
    ("required", True), ("required", False), ({"type": "function", "function": {"name": "set_alarm"}}, True)])
def test_forced_tool_calls_parse_and_validate(llm, tool_choice, parallel):
    body = {"tools": TOOLS, "tool_choice": tool_choice, "parallel_tool_calls": parallel}
    so = request_structured_outputs(body).clone(structural_tag=json.dumps(_tight(body)))
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    conversations = [[{"role": "user", "content": text}] for text in ("Wake me up", "Weather?", "Hi")]
    params = [SamplingParams(temperature=0 if seed == 0 else 1.0, seed=seed, max_tokens=250, structured_outputs=so)
              for seed in range(3)]
    many = parallel and tool_choice == "required"
    for out in llm.chat(conversations, params, tools=TOOLS, enable_thinking=False):
        text = out.text
        if out.finish_reason == "length" and many:  # greedy gibberish may call again and again: the whole calls
            text = text[:text.rindex("</tool_call>") + len("</tool_call>")]
        else:
            assert out.finish_reason == "stop", out.text
        calls = parse_calls(text)
        assert calls and (many or len(calls) == 1)
        for name, args in calls:
            assert name in (["set_alarm"] if isinstance(tool_choice, dict) else schemas)
            jsonschema.validate(args, schemas[name])


def _tight(body: dict) -> dict:
    """The request's tool-call grammar with whitespace runs capped at one character (the template's own layout),
    so the gibberish model cannot spend its tokens on blank space."""
    from deltaserve.structured.tool_calls import function_tools, tool_call_tag

    tools = function_tools(body["tools"])
    choice = body["tool_choice"]
    names = list(tools) if choice == "required" else [choice["function"]["name"]]
    return tool_call_tag(tools, names, body["parallel_tool_calls"] and choice == "required", max_whitespace=1)


def test_a_dead_end_ends_the_request_and_spares_the_batch(llm):
    """A grammar that allows nothing after "a": the row's mask is empty, its next token is refused and dropped, and
    the request ends as stop / grammar_dead_end; the other rows finish as they would alone."""
    dead = SO(grammar='root ::= "a" [^\\x00-\\U0010FFFF]')
    params = [SamplingParams(temperature=0, max_tokens=20, structured_outputs=dead),
              SamplingParams(temperature=1.0, seed=5, max_tokens=20, structured_outputs=dead),
              SamplingParams(temperature=1.0, seed=6, max_tokens=20)]
    outs = llm.generate(["q", "q", "q"], params)
    for out in outs[:2]:
        assert (out.text, out.finish_reason, out.stop_reason) == ("a", "stop", GRAMMAR_DEAD_END)
        assert out.token_ids == TOK.encode("a").ids
    assert outs[2].token_ids == llm.generate(["q"], params[2])[0].token_ids and len(outs[2].token_ids) == 20


def test_a_completed_grammar_ends_the_request_even_with_ignore_eos(llm):
    out = llm.generate(["q"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                             structured_outputs=SO(regex="[0-9]{3}")))[0]
    assert re.fullmatch("[0-9]{3}", out.text) and out.finish_reason == "stop" and len(out.token_ids) <= 4


def test_bad_specs_fail_at_add_request_and_nothing_running_is_lost(llm):
    engine = llm.engine
    free = engine.add_request(TOK.encode("Hello").ids, SamplingParams(temperature=0, max_tokens=6))
    engine.step()
    for so, message in [(SO(json={"type": "strng"}), 'structured_outputs.json: Unsupported type "strng"'),
                        (SO(regex="(ab"), "structured_outputs.regex: .*parenthesis is not closed"),
                        (SO(grammar="root ::= nope"), 'structured_outputs.grammar: .*Rule "nope" is not defined'),
                        (SO(json={"type": "array", "uniqueItems": True}), "'uniqueItems': true at #")]:
        with pytest.raises(SamplingParamsError, match=message):
            engine.add_request(TOK.encode("x").ids, SamplingParams(structured_outputs=so))
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert list(done) == [free] and len(done[free].token_ids) == 6
    assert engine.scheduler.blocks.num_free == engine.num_blocks


def test_structured_output_needs_a_tokenizer(model):
    bare = LLMEngine(model, None, [IM_END], EngineConfig(num_blocks=8))
    with pytest.raises(SamplingParamsError, match="needs a tokenizer"):
        bare.add_request([1, 2, 3], SamplingParams(structured_outputs=SO(regex="a")))


def test_a_request_waits_for_its_grammar_outside_the_scheduler(model):
    """While its grammar compiles the request is held (not admitted, no cache); free requests run meanwhile; once
    compiled it runs; a failed compile ends it as abort with the reason."""
    llm = LLM.from_model(model, INFO, max_num_seqs=4)
    engine = llm.engine
    compiler = engine.structured.compiler
    gate = threading.Event()
    real = compiler._compile
    compiler._compile = lambda grammar: (gate.wait(30), real(grammar))[1]
    held = engine.add_request(TOK.encode("q").ids, SamplingParams(temperature=0, max_tokens=8,
                                                                  structured_outputs=SO(regex="[0-9]{4}")))
    free = engine.add_request(TOK.encode("w").ids, SamplingParams(temperature=0, max_tokens=3))
    seen = []
    while engine.has_unfinished() and len(seen) < 3:
        seen += [o.request_id for o in engine.step()]
    assert set(seen) == {free} and engine.structured.holding
    assert engine.requests[held].block_table == [] and engine.requests[held].state_slot == -1
    dropped = engine.add_request(TOK.encode("q").ids, SamplingParams(structured_outputs=SO(regex="[0-9]{5}")))
    engine.abort(dropped)  # aborted while held: never reaches the scheduler
    gate.set()
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert re.fullmatch("[0-9]{4}", outs[held].text) and outs[held].finish_reason == "stop"
    assert dropped not in outs and not engine.structured.holding and not engine.scheduler.has_unfinished()

    def fail(grammar):
        raise RuntimeError("out of memory")

    compiler._compile = fail
    rid = engine.add_request(TOK.encode("q").ids, SamplingParams(structured_outputs=SO(regex="[a-z]{9}")))
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert outs[rid].finish_reason == "abort" and "grammar compile failed: out of memory" in outs[rid].stop_reason
    assert engine.scheduler.blocks.num_free == engine.num_blocks
