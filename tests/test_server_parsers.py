"""Reasoning and Qwen3-Coder tool-call parsing: the whole reply, and streaming at every split point (the pieces must
add up to the whole, however the text was chunked); argument values typed by the tools' JSON schemas."""

from __future__ import annotations

import json

import pytest

from deltaserve.server.reasoning import ReasoningParser, prompt_opens_reasoning, split_reasoning
from deltaserve.server.reply import ReplyDelta, ReplyParser, parse_reply
from deltaserve.server.tool_calls import ToolCallParser, convert_value, parse_call, tool_schemas

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"},
    "scale": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
    "note": {"type": ["null", "string"]}, "when": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}}}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "ping", "parameters": {}}}]


def call_block(name: str, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def stream_all(parser_factory, text: str, cuts: list[int]) -> ReplyDelta:
    """Feed text cut at `cuts` (sorted positions), then finish; the concatenated pieces."""
    p = parser_factory()
    total = ReplyDelta()
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        total.add(_as_delta(p.feed(text[a:b])))
    total.add(_as_delta(p.finish()))
    return total


def _as_delta(piece) -> ReplyDelta:
    if isinstance(piece, ReplyDelta):
        return piece
    a, b = piece
    if isinstance(b, list):  # ToolCallParser: (text, calls)
        return ReplyDelta("", a, b)
    return ReplyDelta(a, b)  # ReasoningParser: (reasoning, answer)


def _key(d: ReplyDelta):
    return d.reasoning, d.content, [(c.name, c.arguments) for c in d.tool_calls]


def every_split_matches(parser_factory, text: str, pairs: bool = True) -> ReplyDelta:
    whole = stream_all(parser_factory, text, [])
    for i in range(len(text) + 1):
        assert _key(stream_all(parser_factory, text, [i])) == _key(whole), (text, i)
    if pairs:
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1):
                assert _key(stream_all(parser_factory, text, [i, j])) == _key(whole), (text, i, j)
    # one character at a time, as a byte-level tokenizer may deliver it
    assert _key(stream_all(parser_factory, text, list(range(1, len(text))))) == _key(whole)
    return whole


# ---- reasoning ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, opened, reasoning, answer", [
    ("Let me think.\nStep 1.\n\n</think>\n\nThe answer is 4.", True, "Let me think.\nStep 1.", "The answer is 4."),
    ("still thinking when max_tokens hit\n", True, "still thinking when max_tokens hit\n", ""),
    ("</think>\n\nno reasoning", True, "", "no reasoning"),
    ("plain answer, thinking off", False, "", "plain answer, thinking off"),
    ("<think>\nself-opened\n</think>\n\nanswer", False, "self-opened", "answer"),
    ("  not <think> at the start", False, "", "  not <think> at the start"),
    ("a </thin", True, "a </thin", ""),
    ("r</think>x</think>y", True, "r", "x</think>y"),
    ("\n\n", False, "", "\n\n"),
])
def test_reasoning_split_whole_and_at_every_split_point(text, opened, reasoning, answer):
    assert split_reasoning(text, opened) == (reasoning, answer)
    whole = every_split_matches(lambda: ReasoningParser(opened), text)
    assert (whole.reasoning, whole.content) == (reasoning, answer)


def test_prompt_opens_reasoning_follows_the_generation_prompt():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert prompt_opens_reasoning("<think>old</think>\n<|im_start|>assistant\n<think>\n")


# ---- tool calls --------------------------------------------------------------------------------------------------
def test_a_call_with_every_schema_type():
    block = call_block("get_weather", city="Berlin", days="3", hot="false", scale="-2.5e1", opts='{"a": [1, 2]}',
                       tags='["x", 1]', note="null", when="12")
    call = parse_call(block[len("<tool_call>"):-len("</tool_call>")], tool_schemas(TOOLS))
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Berlin", "days": 3, "hot": False, "scale": -25.0,
                                          "opts": {"a": [1, 2]}, "tags": ["x", 1], "note": None, "when": 12}
    assert call.id.startswith("call_") and call.to_openai(2)["index"] == 2


@pytest.mark.parametrize("raw, schema, value", [
    ("42", {"type": "integer"}, 42), ("4.5", {"type": "integer"}, "4.5"), ("7", {"type": "number"}, 7),
    ("True", {"type": "boolean"}, True), ("yes", {"type": "boolean"}, "yes"), ("  padded ", {"type": "string"}, "  padded "),
    ("[1,2]", {"type": "object"}, "[1,2]"), ("not json", {"type": "array"}, "not json"), ("x", None, "x"),
    ("5", {"enum": [1, 5]}, 5), ("none", {"type": ["integer", "null"]}, None), ("3", {"properties": {}}, "3"),
    ("abc", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "abc"),
])
def test_values_follow_the_schema_or_stay_text(raw, schema, value):
    assert convert_value(raw, schema) == value


@pytest.mark.parametrize("block", [
    "<tool_call>\n<function=unknown_fn>\n</function>\n</tool_call>",  # not a declared tool
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n</function>\n</tool_call>",  # unclosed parameter
    "<tool_call>\nget_weather(city='Berlin')\n</tool_call>",  # not the XML form
    "<tool_call>\n<function=get_weather>\nstray <parameter=city>\nB\n</parameter>\n</function>\n</tool_call>",
])
def test_malformed_blocks_stay_text(block):
    text = "Before. " + block + " After."
    whole = every_split_matches(lambda: ToolCallParser(TOOLS), text, pairs=False)
    assert whole.tool_calls == [] and whole.content == text


def test_calls_amid_text_at_every_split_point():
    first = call_block("get_weather", city="Paris", days="2")
    second = call_block("ping")
    text = f"I will check.\n\n{first}\n{second}\n"
    whole = every_split_matches(lambda: ToolCallParser(TOOLS), text)
    assert whole.content == "I will check."
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("ping", {})]


def test_a_call_the_reply_never_closed_still_counts_but_half_a_call_is_text():
    unclosed = call_block("ping")[: -len("</tool_call>")]
    whole = every_split_matches(lambda: ToolCallParser(TOOLS), unclosed, pairs=False)
    assert [c.name for c in whole.tool_calls] == ["ping"] and whole.content == ""
    half = "ok <tool_call>\n<function=ping>\n<param"
    whole = every_split_matches(lambda: ToolCallParser(TOOLS), half, pairs=False)
    assert whole.tool_calls == [] and whole.content == half


def test_text_that_only_looks_like_a_tag_start_is_text():
    text = "a < b, <tool_x> and <tool_call is not closed"
    whole = every_split_matches(lambda: ToolCallParser(TOOLS), text, pairs=False)
    assert whole.content == text and whole.tool_calls == []


# ---- the whole reply ---------------------------------------------------------------------------------------------
def test_reply_reasoning_then_calls_at_every_split_point():
    call = call_block("get_weather", city="Oslo", hot="true")
    text = f"The user wants weather. {call_block('ping')} (inside reasoning: stays reasoning)\n</think>\n\n{call}"
    whole = every_split_matches(lambda: ReplyParser(True, TOOLS), text)
    assert whole.reasoning.startswith("The user wants weather. <tool_call>")
    assert whole.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [("get_weather", {"city": "Oslo",
                                                                                               "hot": True})]
    assert _key(parse_reply(text, True, TOOLS)) == _key(whole)


def test_reply_without_tools_never_parses_calls():
    text = call_block("ping")
    assert parse_reply(text, False, None).content == text
