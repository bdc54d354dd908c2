"""The server through the official `openai` client on every endpoint, streamed and not, against the in-process `LLM`
as the oracle; reasoning and tool calls on forced replies (the real engine, tokenizer and detokenizer; the text
comes from ForcedTextModel); tokenize / detokenize, models, health, metrics."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server_helpers import MODEL_NAME, Served, tiny_checkpoint
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.server.reasoning import split_reasoning

ENGINE = dict(max_model_len=512, max_num_seqs=8)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                           "metric": {"type": "boolean"}}}}}
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nMünchen\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
ARGS = {"city": "München", "days": 3, "metric": True}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
PING_CALL = "<tool_call>\n<function=ping>\n</function>\n</tool_call>"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ckpt):
    s = Served(ckpt, enable_prefix_caching=False, **ENGINE)  # forcing (ForcedTextModel) needs it off
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oracle(ckpt):
    return LLM(ckpt, **ENGINE)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(autouse=True)
def no_forcing(served):
    served.force(None)
    yield
    served.force(None)
    assert served.idle_and_free(), "a request still holds cache after the test"


def stream_chat(client, **kw):
    """Accumulate a streamed chat reply: reasoning, content, tool calls (by index), finish reason, usage, chunks."""
    acc = {"reasoning": "", "content": "", "calls": {}, "finish": None, "usage": None, "chunks": 0, "roles": 0}
    for chunk in client.chat.completions.create(model=MODEL_NAME, stream=True, **kw):
        acc["chunks"] += 1
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            acc["usage"] = chunk.usage
        for c in chunk.choices:
            d = c.delta
            acc["roles"] += d.role == "assistant"
            acc["reasoning"] += getattr(d, "reasoning_content", None) or ""
            acc["content"] += d.content or ""
            for t in d.tool_calls or []:
                slot = acc["calls"].setdefault(t.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += t.id or ""
                slot["name"] += t.function.name or ""
                slot["arguments"] += t.function.arguments or ""
            if c.finish_reason:
                acc["finish"] = c.finish_reason
    return acc


# ---- plain generation against the oracle ---------------------------------------------------------------------------
def test_models_and_health(served, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME] and models.data[0].owned_by == "deltaserve"
    assert httpx.get(served.url + "/health").status_code == 200


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_matches_llm_chat_streamed_and_not(client, oracle, thinking):
    ref = oracle.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12), enable_thinking=thinking)[0]
    reasoning, content = split_reasoning(ref.text, thinking)
    kw = dict(messages=MESSAGES, max_tokens=12, temperature=0,
              extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    r = client.chat.completions.create(model=MODEL_NAME, **kw)
    msg = r.choices[0].message
    assert (getattr(msg, "reasoning_content", None) or "", msg.content) == (reasoning, content)
    assert r.choices[0].finish_reason == ref.finish_reason and r.object == "chat.completion"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_token_ids), len(ref.token_ids))
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    s = stream_chat(client, stream_options={"include_usage": True}, **kw)
    assert (s["reasoning"], s["content"], s["finish"]) == (reasoning, content, ref.finish_reason)
    assert s["roles"] == 1 and s["usage"].completion_tokens == len(ref.token_ids)


def test_chat_token_ids_and_seeded_n(client, oracle):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=6, temperature=0.8,
                                       top_p=0.9, seed=7, n=3, extra_body={"return_token_ids": True, "top_k": 40})
    assert [c.index for c in r.choices] == [0, 1, 2]
    prompt = oracle.render_chat(MESSAGES)
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=7, max_tokens=6, n=3)
    ref = oracle.generate([oracle.encode(prompt, False)], sp)[0].outputs  # LLM.generate's n samples, same seeds
    assert [c.model_extra["token_ids"] for c in r.choices] == [o.token_ids for o in ref]
    assert len({tuple(o.token_ids) for o in ref}) > 1
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)


def test_completions_streamed_and_not(client, oracle):
    sp = SamplingParams(temperature=0.7, seed=3, max_tokens=8)
    ref = oracle.generate(["Once upon a time", [5, 6, 7, 8]], sp)
    r = client.completions.create(model=MODEL_NAME, prompt=["Once upon a time", "x"], max_tokens=8,
                                  temperature=0.7, seed=3, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and r.object == "text_completion"
    assert r.choices[0].text == ref[0].text and r.choices[0].finish_reason == ref[0].finish_reason
    assert r.usage.prompt_tokens == len(oracle.encode("Once upon a time")) + len(oracle.encode("x"))
    text, finish, usage = "", None, None
    for chunk in client.completions.create(model=MODEL_NAME, prompt=[5, 6, 7, 8], max_tokens=8, temperature=0.7,
                                           seed=3, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    assert (text, finish) == (ref[1].text, ref[1].finish_reason)
    assert usage.prompt_tokens == 4 and usage.completion_tokens == len(ref[1].token_ids)
    echo = client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3, temperature=0, echo=True)
    assert echo.choices[0].text.startswith("Hi")


def test_stop_strings_ignore_eos_and_length(served, client):
    served.force("Hello world. STOP here")
    kw = dict(messages=MESSAGES, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    r = client.chat.completions.create(model=MODEL_NAME, stop=["STOP"], **kw)
    assert r.choices[0].message.content == "Hello world. " and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == "STOP"
    s = stream_chat(client, stop="STOP", **kw)
    assert (s["content"], s["finish"]) == ("Hello world. ", "stop")
    r = client.chat.completions.create(model=MODEL_NAME, max_tokens=3, **kw)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    # the forced script ends in <|im_end|>: ignore_eos runs past it to max_tokens
    n = len(served.tokenizer.encode("Hello world. STOP here", add_special_tokens=False).ids)
    r = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=n + 4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == n + 4 and r.choices[0].finish_reason == "length"
    r = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=n + 4, temperature=0)
    assert r.usage.completion_tokens == n + 1 and r.choices[0].finish_reason == "stop"


# ---- reasoning and tool calls --------------------------------------------------------------------------------------
def test_reasoning_and_a_tool_call_streamed_and_not(served, client):
    served.force("The user wants the weather.\n</think>\n\n" + CALL)
    kw = dict(messages=[{"role": "user", "content": "Weather in Munich?"}], tools=[WEATHER], temperature=0)
    r = client.chat.completions.create(model=MODEL_NAME, **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == "The user wants the weather."
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == ARGS
    s = stream_chat(client, **kw)
    assert s["reasoning"] == "The user wants the weather." and s["content"] == "" and s["finish"] == "tool_calls"
    [streamed] = s["calls"].values()
    assert streamed["name"] == "get_weather" and json.loads(streamed["arguments"]) == ARGS


def test_text_around_calls_and_tool_choice_none(served, client):
    served.force("Let me look.\n\n" + CALL + "\n" + PING_CALL)
    kw = dict(messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER, PING], temperature=0,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    r = client.chat.completions.create(model=MODEL_NAME, **kw)
    assert r.choices[0].message.content == "Let me look."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls] == [
        ("get_weather", ARGS), ("ping", {})]
    s = stream_chat(client, **kw)
    assert sorted(s["calls"]) == [0, 1] and s["content"] == "Let me look."
    r = client.chat.completions.create(model=MODEL_NAME, tool_choice="none", **kw)
    assert r.choices[0].message.tool_calls is None and CALL in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_tool_results_go_back_into_the_prompt(served, client):
    messages = [{"role": "user", "content": "Weather in Munich?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    tok = httpx.post(served.url + "/tokenize", json={"messages": messages, "tools": [WEATHER]}).json()
    prompt = served.tokenizer.decode(tok["tokens"], skip_special_tokens=False)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert "<parameter=city>\nMünchen\n</parameter>" in prompt and prompt.endswith("<|im_start|>assistant\n<think>\n")
    served.force("It is sunny.\n</think>\n\nSunny, 21 C.")
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER], temperature=0)
    assert r.choices[0].message.content == "Sunny, 21 C." and r.usage.prompt_tokens == tok["count"]


# ---- the rest --------------------------------------------------------------------------------------------------------
def test_tokenize_and_detokenize(served):
    r = httpx.post(served.url + "/tokenize", json={"prompt": "Hello there", "model": MODEL_NAME}).json()
    assert r["tokens"] == served.tokenizer.encode("Hello there").ids and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 512
    d = httpx.post(served.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert d == {"prompt": "Hello there"}


def test_metrics_count_what_was_served(served, client):
    before = httpx.get(served.url + "/metrics").text
    client.completions.create(model=MODEL_NAME, prompt="count me", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    after = httpx.get(served.url + "/metrics").text

    def value(text, name):
        line = next(l for l in text.splitlines() if l.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    gen = "deltaserve:generation_tokens_total"
    assert value(after, gen) - value(before, gen) == 5
    assert value(after, "deltaserve:time_to_first_token_seconds_count") == \
        value(before, "deltaserve:time_to_first_token_seconds_count") + 1
    assert value(after, "deltaserve:inter_token_latency_seconds_count") - \
        value(before, "deltaserve:inter_token_latency_seconds_count") == 4
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "state_slot_usage_perc",
                 "prompt_tokens_total", "e2e_request_latency_seconds_count", "request_queue_time_seconds_count",
                 "num_aborted_requests_total", "request_success_total"):
        assert f"deltaserve:{name}" in after


# ---- structured output (deltaserve/structured: the reply constrained while it is sampled) -----------------------
SWITCH = {"type": "function", "function": {"name": "set_switch", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}, "room": {"type": "string", "enum": ["hall", "attic"]}},
    "required": ["on", "room"]}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


SWITCH_CALL = ("<tool_call>\n<function=set_switch>\n<parameter=on>\ntrue\n</parameter>\n<parameter=room>\nattic\n"
               "</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls(served, client, stream):
    kw = dict(messages=[{"role": "user", "content": "Lights on in the attic"}], tools=[SWITCH, PING],
              temperature=0, extra_body=NO_THINKING, parallel_tool_calls=False)

    def ask(**more):
        if stream:
            s = stream_chat(client, **kw, **more)
            return ([(c["name"], json.loads(c["arguments"])) for c in s["calls"].values()], s["content"],
                    s["finish"])
        r = client.chat.completions.create(model=MODEL_NAME, **kw, **more)
        msg = r.choices[0].message
        return ([(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []],
                msg.content or "", r.choices[0].finish_reason)

    # the model's own reply under the constraint: a random model never starts a call by chance (this one spells
    # the tags character by character and then pads with whitespace, which the grammar allows: it rarely finishes)
    for choice, names in (("required", ("set_switch", "ping")),
                          ({"type": "function", "function": {"name": "set_switch"}}, ("set_switch",))):
        calls, content, finish = ask(tool_choice=choice, max_tokens=45)
        if finish == "tool_calls":
            assert content == "" and len(calls) == 1 and calls[0][0] in names
        else:
            assert finish == "length" and calls == []
            assert any(content.startswith(f"<tool_call>\n<function={n}>") for n in names), content
    # a complete call (forced text that the grammar allows) comes back parsed and typed
    served.force(SWITCH_CALL)
    calls, content, finish = ask(tool_choice={"type": "function", "function": {"name": "set_switch"}},
                                 max_tokens=100)
    assert (calls, content, finish) == ([("set_switch", {"on": True, "room": "attic"})], "", "tool_calls")


def test_json_and_choice_constraints(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": [1, 2, 3]}},
              "required": ["ok", "size"], "additionalProperties": False}
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=40,
                                       extra_body=dict(NO_THINKING, structured_outputs={
                                           "json": schema, "disable_any_whitespace": True}))
    assert r.choices[0].finish_reason == "stop"
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"ok", "size"} and isinstance(value["ok"], bool) and value["size"] in (1, 2, 3)
    r = client.completions.create(model=MODEL_NAME, prompt="Answer:", temperature=0.9, seed=1, max_tokens=10, n=3,
                                  extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert all(c.text in ("yes", "no", "maybe") and c.finish_reason == "stop" for c in r.choices)
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=60,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "r", "schema": {"type": "object", "properties": {
                                               "ok": {"type": "boolean"}}, "required": ["ok"],
                                               "additionalProperties": False}}},
                                       extra_body=NO_THINKING)
    if r.choices[0].finish_reason == "stop":  # whitespace between JSON tokens is allowed: it may run to the limit
        assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool)
    else:
        assert r.choices[0].message.content.lstrip().startswith("{")


# ---- log-probabilities -------------------------------------------------------------------------------------------
def test_chat_logprobs_streamed_and_not(client, oracle):
    kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, temperature=0.7, seed=5, logprobs=True,
              top_logprobs=3, extra_body=NO_THINKING)
    r = client.chat.completions.create(**kw)
    entries = r.choices[0].logprobs.content
    ref = oracle.chat(MESSAGES, SamplingParams(temperature=0.7, seed=5, max_tokens=6, logprobs=3),
                      enable_thinking=False)[0]
    assert len(entries) == len(ref.token_ids) == r.usage.completion_tokens
    for e, t, d in zip(entries, ref.token_ids, ref.logprobs):
        assert e.logprob == pytest.approx(d[t].logprob, abs=1e-5) and e.logprob <= 0
        assert len(e.top_logprobs) == 3
        assert [x.logprob for x in e.top_logprobs] == sorted((x.logprob for x in e.top_logprobs), reverse=True)
        assert e.top_logprobs[0].logprob >= e.logprob
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed += c.logprobs.content if c.logprobs is not None else []
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]


def test_completion_logprobs_streamed_and_not(client):
    kw = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2)
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(top) <= 2 and max(top.values()) == pytest.approx(v) for top, v in   # greedy: the top token
               zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    tokens, values = [], []
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs is not None:
                tokens += c.logprobs.tokens
                values += c.logprobs.token_logprobs
    assert (tokens, values) == (lp.tokens, lp.token_logprobs)
