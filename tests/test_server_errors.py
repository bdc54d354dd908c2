"""Bad input never harms the server: each bad request gets the OpenAI error object with the right status (no trace
in the body), and a good request right after it succeeds. Also the API key, the body limit and the waiting limit."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server_helpers import MODEL_NAME, Served, tiny_checkpoint

MSG = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def chat(**kw):
    return dict({"model": MODEL_NAME, "messages": MSG, "max_tokens": 2}, **kw)


def comp(**kw):
    return dict({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}, **kw)


# (name, method, path, body (dict, or raw bytes), status, param, code)
CASES = [
    ("malformed JSON", "POST", CHAT, b'{"messages": [', 400, None, "invalid_json"),
    ("not an object", "POST", CHAT, b"[1, 2]", 400, None, "invalid_json"),
    ("invalid UTF-8", "POST", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None,
     "invalid_utf8"),
    ("wrong type", "POST", CHAT, chat(temperature="hot"), 400, "temperature", "float_type"),
    ("string for an int", "POST", COMP, comp(max_tokens="16"), 400, "max_tokens", "int_type"),
    ("unknown model", "POST", CHAT, chat(model="gpt-4"), 404, "model", "model_not_found"),
    ("unknown field", "POST", CHAT, chat(temprature=0.5), 400, "temprature", "extra_forbidden"),
    ("missing messages", "POST", CHAT, {"model": MODEL_NAME}, 400, "messages", "missing"),
    ("empty messages", "POST", CHAT, chat(messages=[]), 400, "messages", "too_short"),
    ("bad role", "POST", CHAT, chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role",
     "literal_error"),
    ("n zero", "POST", CHAT, chat(n=0), 400, "n", "greater_than_equal"),
    ("n too large", "POST", COMP, comp(n=17), 400, "n", "less_than_equal"),
    ("max_tokens zero", "POST", COMP, comp(max_tokens=0), 400, "max_tokens", "greater_than_equal"),
    ("max_tokens past the context", "POST", COMP, comp(max_tokens=600), 400, "max_tokens",
     "context_length_exceeded"),
    ("negative temperature", "POST", CHAT, chat(temperature=-0.5), 400, "temperature", "greater_than_equal"),
    ("top_p zero", "POST", CHAT, chat(top_p=0), 400, "top_p", "greater_than"),
    ("top_p above one", "POST", COMP, comp(top_p=1.5), 400, "top_p", "less_than_equal"),
    ("prompt past max_model_len", "POST", COMP, comp(prompt=[7] * 600), 400, "prompt", "context_length_exceeded"),
    ("chat past max_model_len", "POST", CHAT, chat(messages=[{"role": "user", "content": "word " * 600}]), 400,
     "messages", "context_length_exceeded"),
    ("token id out of range", "POST", COMP, comp(prompt=[1, 10**6]), 400, "prompt", "invalid_value"),
    ("empty prompt", "POST", COMP, comp(prompt=""), 400, "prompt", "invalid_value"),
    ("empty stop string", "POST", COMP, comp(stop=[""]), 400, "stop", "value_error"),
    ("top_logprobs past the limit", "POST", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs",
     "less_than_equal"),
    ("top_logprobs without logprobs", "POST", CHAT, chat(top_logprobs=2), 400, "top_logprobs", "unsupported"),
    ("chat logprobs as a number", "POST", CHAT, chat(logprobs=3), 400, "logprobs", "bool_type"),
    ("forced call of an unknown tool", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                                         tool_choice={"type": "function", "function": {"name": "g"}}),
     400, "tool_choice", "invalid_structured_output"),
    ("bad response_format", "POST", CHAT, chat(response_format={"type": "xml"}), 400, "response_format",
     "invalid_structured_output"),
    ("two constraints", "POST", COMP, comp(guided_regex="a+", guided_choice=["a"]), 400, "guided_choice",
     "invalid_structured_output"),
    ("image on a text-only model", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]), 400, None, "invalid_request"),
    ("image from a server file", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}]), 400, "messages", "invalid_image"),
    ("image over http", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image", "url": "https://example.com/a.png"}]}]), 400, "messages", "invalid_image"),
    ("video part", "POST", CHAT, chat(messages=[{"role": "user", "content": [{"type": "video_url",
                                                                             "video_url": {"url": "x"}}]}]), 400,
     "messages", "invalid_messages"),
    ("tool call arguments not JSON", "POST", CHAT, chat(messages=MSG + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]), 400,
     "messages[1].tool_calls[0].function.arguments", "invalid_json"),
    ("reserved template kwarg", "POST", CHAT, chat(chat_template_kwargs={"messages": []}), 400,
     "chat_template_kwargs", None),
    ("stream_options without stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400,
     "stream_options", "unsupported"),
    ("detokenize out of range", "POST", "/detokenize", {"tokens": [-1]}, 400, "tokens", None),
    ("tokenize both", "POST", "/tokenize", {"prompt": "a", "messages": MSG}, 400, "prompt", None),
    ("unknown route", "GET", "/v1/nothing", None, 404, None, None),
    ("wrong method", "GET", CHAT, None, 405, None, None),
    ("body over the limit", "POST", COMP, comp(prompt="x" * (70 * 1024)), 413, None, "request_too_large"),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ckpt):
    s = Served(ckpt, max_model_len=512, max_num_seqs=4, max_request_bytes=64 * 1024)
    yield s
    s.stop()


def send(url, method, path, body, headers=None):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    return httpx.request(method, url + path, content=body, timeout=30,
                         headers=dict({"Content-Type": "application/json"}, **(headers or {})))


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and "Traceback" not in r.text
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def assert_serving(url):
    r = send(url, "POST", COMP, comp(temperature=0))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_then_good_request(served, case):
    _, method, path, body, status, param, code = case
    err = assert_error(send(served.url, method, path, body), status, param, code)
    if param:
        assert param.split("[")[0].split(".")[0] in err["message"]  # the message names the field
    assert_serving(served.url)
    assert served.idle_and_free()


def test_error_messages_are_specific(served):
    err = assert_error(send(served.url, "POST", CHAT, chat(top_p=1.5)), 400)
    assert err["message"] == "top_p: Input should be less than or equal to 1 (found 1.5)"
    err = assert_error(send(served.url, "POST", COMP, comp(prompt=[7] * 600)), 400)
    assert "600 tokens" in err["message"] and "512" in err["message"]


def test_the_openai_client_sees_typed_errors(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSG)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=-1)


def test_api_key(ckpt):
    s = Served(ckpt, api_key="s3cret", max_model_len=256, max_num_seqs=2)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            for path, body in ((COMP, comp()), (CHAT, chat()), ("/tokenize", {"prompt": "a"})):
                r = send(s.url, "POST", path, body, headers)
                assert_error(r, 401, code="invalid_api_key")
                assert r.headers["www-authenticate"] == "Bearer"
            assert_error(httpx.get(s.url + "/v1/models", headers=headers), 401)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices[0].text is not None
        assert httpx.get(s.url + "/health").status_code == 200  # open, like /metrics and the chat page
        assert httpx.get(s.url + "/metrics").status_code == 200 and httpx.get(s.url + "/").status_code == 200
    finally:
        s.stop()


def test_a_full_queue_answers_503_and_recovers(ckpt):
    s = Served(ckpt, max_model_len=256, max_num_seqs=1, max_queued_requests=1)
    long = comp(max_tokens=200, temperature=0, ignore_eos=True, stream=True)
    try:
        with httpx.Client(timeout=30) as c1, httpx.Client(timeout=30) as c2:
            with c1.stream("POST", s.url + COMP, json=long) as r1, c2.stream("POST", s.url + COMP, json=long) as r2:
                assert r1.status_code == r2.status_code == 200  # one running, one waiting
                err = assert_error(send(s.url, "POST", COMP, comp()), 503, code="queue_full")
                assert "retry" in err["message"]
                assert "deltaserve:num_rejected_requests_total{model_name=\"tiny\"} 1.0" in \
                    httpx.get(s.url + "/metrics").text
        assert s.idle_and_free()  # both streams closed mid-way: aborted
        assert_serving(s.url)
    finally:
        s.stop()


def test_a_chunked_body_over_the_limit_is_cut_off(served):
    def body():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(80):
            yield b"x" * 1024  # no Content-Length: the limit is counted as the body arrives
        yield b'"}'

    r = httpx.post(served.url + COMP, content=body(), headers={"Content-Type": "application/json"}, timeout=30)
    assert_error(r, 413, code="request_too_large")
    assert_serving(served.url)
