"""Structured output without a model: the params' checks, the OpenAI/vLLM request translation, the tool-call grammar
against the chat template's own tool-call text, the schema keywords refused, the compile cache."""

from __future__ import annotations

import json

import pytest

from deltaserve.engine.chat import render_chat
from deltaserve.engine.sampling_params import SamplingParams, SamplingParamsError
from deltaserve.structured import GuidedDecodingParams, StructuredOutputsError, StructuredOutputsParams
from deltaserve.structured.compiler import GrammarCompiler, parse, token_strings
from deltaserve.structured.openai_request import request_structured_outputs
from deltaserve.structured.params import opens_reasoning
from deltaserve.synthetic.chat_template import chat_template
from deltaserve.synthetic.presets import TINY_BPE_SIZE, TINY_VOCAB
from deltaserve.synthetic.tokenizer import train_bpe

xgr = pytest.importorskip("xgrammar")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "unit": {"enum": ["celsius", "fahrenheit"]}, "hourly": {"type": "boolean"}},
    "required": ["city", "days"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object", "properties": {
        "lang": {"type": "string"}}}}, "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]


@pytest.fixture(scope="module")
def compiler():
    tok = train_bpe(TINY_BPE_SIZE)
    return GrammarCompiler(tok, TINY_VOCAB, [tok.token_to_id("<|im_end|>")])


def accepts(compiler, params: StructuredOutputsParams, text: str) -> bool:
    """Does the grammar take `text` whole and then stand complete?"""
    m = xgr.GrammarMatcher(compiler.submit(params).result())
    return m.accept_string(text) and m.is_completed()


def rendered_calls(calls: list[dict]) -> str:
    """The assistant's reply text as the checkpoint's chat template writes these tool calls."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    text = render_chat(chat_template(), msgs, TOOLS, add_generation_prompt=False)
    return text[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"): -len("<|im_end|>\n")]


# ---- params ----------------------------------------------------------------------------------------------------
def test_exactly_one_constraint_and_field_types():
    with pytest.raises(StructuredOutputsError, match="exactly one of .* found none"):
        StructuredOutputsParams()
    with pytest.raises(StructuredOutputsError, match="found json and regex"):
        StructuredOutputsParams(json={"type": "string"}, regex="a+")
    with pytest.raises(StructuredOutputsError, match="choice must be a non-empty list"):
        StructuredOutputsParams(choice="yes")
    with pytest.raises(StructuredOutputsError, match="choice entries must be non-empty strings"):
        StructuredOutputsParams(choice=["yes", 3])
    with pytest.raises(StructuredOutputsError, match="regex must be a non-empty str"):
        StructuredOutputsParams(regex=5)
    with pytest.raises(StructuredOutputsError, match="after_think must be a bool"):
        StructuredOutputsParams(regex="a", after_think="yes")
    p = StructuredOutputsParams(json={"type": "object", "properties": {"b": {}, "a": {}}})
    assert p.kind == "json" and p.json == '{"type": "object", "properties": {"b": {}, "a": {}}}'  # order kept


def test_sampling_params_field_old_name_and_dict_form():
    so = StructuredOutputsParams(regex="[0-9]+")
    assert SamplingParams(structured_outputs=so).structured_outputs is so
    old = SamplingParams(guided_decoding=GuidedDecodingParams(choice=["a", "b"]))
    assert old.structured_outputs.choice == ["a", "b"] and old.guided_decoding is None
    assert SamplingParams(structured_outputs={"regex": "x"}).structured_outputs.regex == "x"
    assert old.clone(temperature=0).structured_outputs.choice == ["a", "b"]
    with pytest.raises(SamplingParamsError, match="not both"):
        SamplingParams(structured_outputs=so, guided_decoding=StructuredOutputsParams(regex="y"))
    with pytest.raises(SamplingParamsError, match="unknown field.*jsn"):
        SamplingParams(structured_outputs={"jsn": {}})
    with pytest.raises(SamplingParamsError, match="must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs="{}")


def test_opens_reasoning_follows_the_generation_prompt():
    on = render_chat(chat_template(), [{"role": "user", "content": "hi"}], enable_thinking=True)
    off = render_chat(chat_template(), [{"role": "user", "content": "hi"}], enable_thinking=False)
    assert opens_reasoning(on) and not opens_reasoning(off) and not opens_reasoning("plain text")


# ---- bad specs: each refused at parse time with the reason -------------------------------------------------------
@pytest.mark.parametrize("params, message", [
    (dict(json='{"type": "object",'), "json is not valid JSON"),
    (dict(json="[1, 2]"), "must be a JSON schema"),
    (dict(json={"type": "strng"}), 'Unsupported type "strng"'),
    (dict(json={"type": "object", "required": "name"}), "required must be an array"),
    (dict(json={"type": "integer", "minimum": 5, "maximum": 1}), "minimum greater than maximum"),
    (dict(json={"type": "string", "minLength": 5, "maxLength": 2}), "minLength 5 is greater than maxLength 2"),
    (dict(json={"type": "array", "minItems": 3, "maxItems": 1}), "minItems is greater than maxItems"),
    (dict(json={"enum": []}), "enum array must not be empty"),
    (dict(json={"type": "string", "pattern": "[a-"}), "Unclosed '\\['"),
    (dict(json={"$ref": "#/$defs/missing"}), "Cannot find field '\\$defs'"),
    (dict(json={"properties": {"a": {"not": {"type": "string"}}}}), "'not' at #/properties/a"),
    (dict(json={"items": {"type": "integer"}, "uniqueItems": True}), "'uniqueItems': true at #"),
    (dict(json={"allOf": [{"type": "object"}, {"required": ["a"]}]}), "'allOf' with 2 schemas"),
    (dict(json={"type": "number", "multipleOf": 0.5}), "'multipleOf' on a non-integer"),
    (dict(json={"$defs": {"x": {"if": {}, "then": {}}}, "$ref": "#/$defs/x"}), "'if' at #/\\$defs/x"),
    (dict(regex="[a-"), "Regex parsing error at position 4"),
    (dict(regex="(ab"), "parenthesis is not closed"),
    (dict(grammar='root ::= "a" | '), "EBNF parser error at line 1"),
    (dict(grammar="root ::= foo"), 'Rule "foo" is not defined'),
    (dict(grammar='start ::= "a"'), 'root rule with name "root" is not found'),
    (dict(structural_tag="{"), "structural_tag is not valid JSON"),
])
def test_bad_specs_are_refused_with_the_reason(params, message):
    with pytest.raises(StructuredOutputsError, match=message) as info:
        parse(StructuredOutputsParams(**params))
    assert "/project/cpp" not in str(info.value) and "structured_outputs." in str(info.value)


def test_accepted_keywords_still_parse():
    for schema in ({"type": "integer", "multipleOf": 3}, {"oneOf": [{"type": "integer"}, {"type": "string"}]},
                   {"allOf": [{"type": "object"}]}, {"type": "object", "properties": {"not": {"type": "integer"}}},
                   {"type": ["string", "null"], "format": "email"}):
        parse(StructuredOutputsParams(json=schema))


# ---- vocabulary and compile cache ------------------------------------------------------------------------------
def test_vocabulary_hides_special_tokens_and_padding_keeps_plain_added_tokens():
    tok = train_bpe(TINY_BPE_SIZE)
    strings = token_strings(tok, TINY_VOCAB)
    assert len(strings) == TINY_VOCAB and strings[TINY_BPE_SIZE:][:3] == ["", "", ""]  # endoftext, im_start, im_end
    assert strings[tok.token_to_id("<tool_call>")] == "<tool_call>"
    assert strings[tok.token_to_id("</think>")] == "</think>"
    assert strings[tok.get_vocab_size():] == [""] * (TINY_VOCAB - tok.get_vocab_size())
    assert strings[tok.token_to_id("Ġthe")] == "Ġthe"


def test_a_repeated_spec_compiles_once(compiler):
    before = compiler.compiled
    a = compiler.submit(StructuredOutputsParams(regex="[0-9]{4}x"))
    b = compiler.submit(StructuredOutputsParams(regex="[0-9]{4}x", after_think=True))  # same grammar
    assert a is b and a.result() is not None
    c = compiler.submit(StructuredOutputsParams(regex="[0-9]{4}x", disable_any_whitespace=True))
    c.result()
    assert compiler.compiled == before + 2


def test_the_cache_keeps_the_most_recent(compiler):
    small = GrammarCompiler(compiler.tokenizer, compiler.vocab_size, compiler.stop_token_ids, cache_size=2)
    first = small.submit(StructuredOutputsParams(regex="a"))
    small.submit(StructuredOutputsParams(regex="b"))
    small.submit(StructuredOutputsParams(regex="a"))  # a is now the most recent
    small.submit(StructuredOutputsParams(regex="c")).result()  # evicts b (one worker: a and b are done too)
    assert small.submit(StructuredOutputsParams(regex="a")) is first and small.compiled == 3
    small.submit(StructuredOutputsParams(regex="b")).result()
    assert small.compiled == 4


# ---- OpenAI / vLLM fields ----------------------------------------------------------------------------------------
def test_response_format_translation():
    assert request_structured_outputs({"response_format": {"type": "text"}}) is None
    assert request_structured_outputs({}) is None
    assert request_structured_outputs({"response_format": {"type": "json_object"}}).json_object is True
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = request_structured_outputs({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema, "strict": True}}}, enable_thinking=True)
    assert json.loads(p.json) == schema and p.after_think
    with pytest.raises(StructuredOutputsError, match="json_schema.schema must be a JSON schema") as e:
        request_structured_outputs({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})
    assert e.value.param == "response_format"
    with pytest.raises(StructuredOutputsError, match="response_format.type must be") as e:
        request_structured_outputs({"response_format": {"type": "yaml"}})


def test_vllm_extra_fields_translation():
    assert request_structured_outputs({"guided_json": '{"type": "integer"}'}).json == '{"type": "integer"}'
    assert request_structured_outputs({"guided_regex": "a+"}).regex == "a+"
    assert request_structured_outputs({"guided_choice": ["x", "y"]}).choice == ["x", "y"]
    assert request_structured_outputs({"guided_grammar": 'root ::= "a"'}).grammar == 'root ::= "a"'
    p = request_structured_outputs({"structured_outputs": {"regex": "b+", "disable_any_whitespace": True}})
    assert p.regex == "b+" and p.disable_any_whitespace and not p.after_think
    with pytest.raises(StructuredOutputsError, match="guided_json and guided_regex both") as e:
        request_structured_outputs({"guided_json": {}, "guided_regex": "a"})
    assert e.value.param == "guided_regex"
    with pytest.raises(StructuredOutputsError, match="guided_json is not valid JSON"):
        request_structured_outputs({"guided_json": "{"})
    with pytest.raises(StructuredOutputsError, match="guided_choice: structured_outputs.choice must be"):
        request_structured_outputs({"guided_choice": []})
    with pytest.raises(StructuredOutputsError, match="guided_whitespace_pattern is not supported"):
        request_structured_outputs({"guided_regex": "a", "guided_whitespace_pattern": " *"})
    with pytest.raises(StructuredOutputsError, match="response_format and structured_outputs both") as e:
        request_structured_outputs({"response_format": {"type": "json_object"}, "guided_regex": "a"})
    assert e.value.param == "structured_outputs"


def test_tool_choice_translation_and_errors():
    assert request_structured_outputs({"tools": TOOLS, "tool_choice": "auto"}) is None
    assert request_structured_outputs({"tools": TOOLS, "tool_choice": "none"}) is None
    assert request_structured_outputs({"tools": TOOLS}) is None
    tag = json.loads(request_structured_outputs({"tools": TOOLS, "tool_choice": "required"}).structural_tag)
    assert [t["begin"] for t in tag["format"]["tags"]] == ["<tool_call>\n<function=get_weather>\n",
                                                          "<tool_call>\n<function=search>\n"]
    assert tag["format"]["at_least_one"] and not tag["format"]["stop_after_first"]
    named = {"type": "function", "function": {"name": "search"}}
    tag = json.loads(request_structured_outputs({"tools": TOOLS, "tool_choice": named}).structural_tag)
    assert [t["begin"] for t in tag["format"]["tags"]] == ["<tool_call>\n<function=search>\n"]
    assert tag["format"]["stop_after_first"]
    cases = [
        ({"tool_choice": "required"}, "needs tools", "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope', which is not",
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice must be", "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}], "tool_choice": "required"},
         "name must match", "tools"),
        ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "appears twice", "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
          "tool_choice": "required"}, "of type 'object'", "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"not": {}}}}}}], "tool_choice": "required"},
         "tools\\[0\\].function.parameters: the keyword 'not'", "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format and tool_choice both", "tool_choice"),
    ]
    for body, message, param in cases:
        with pytest.raises(StructuredOutputsError, match=message) as e:
            request_structured_outputs(body)
        assert e.value.param == param


# ---- the tool-call grammar against the chat template's text -------------------------------------------------------
def test_tool_call_grammar_accepts_the_templates_calls_and_nothing_else(compiler):
    required = request_structured_outputs({"tools": TOOLS, "tool_choice": "required"})
    single = request_structured_outputs({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    named = request_structured_outputs({"tools": TOOLS, "tool_choice": {"type": "function",
                                                                        "function": {"name": "search"}}})
    weather = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "celsius"}}}
    search = {"function": {"name": "search", "arguments": {"query": "gated delta\n  rule", "filters": {"lang": "en"}}}}
    one, two = rendered_calls([weather]), rendered_calls([weather, search])
    assert one.startswith("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>")
    assert accepts(compiler, required, one) and accepts(compiler, required, two)
    assert accepts(compiler, single, one) and not accepts(compiler, single, two)
    assert accepts(compiler, named, rendered_calls([search])) and not accepts(compiler, named, one)
    bad = [
        "I will call it. " + one,  # text before the call
        one.replace("get_weather", "get_wether"),  # an unknown function
        rendered_calls([{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]),  # days missing
        rendered_calls([{"function": {"name": "get_weather", "arguments": {"city": "P", "days": 9}}}]),  # > maximum
        rendered_calls([{"function": {"name": "get_weather", "arguments": {"city": "P", "days": 2, "unit": "K"}}}]),
        rendered_calls([{"function": {"name": "get_weather", "arguments": {"city": "P", "days": 2, "x": 1}}}]),
        "",
    ]
    for text in bad:
        assert not accepts(compiler, required, text), text
