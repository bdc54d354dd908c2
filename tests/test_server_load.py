"""Through HTTP under load: concurrent streams give exactly what `LLM.generate` gives each request alone (greedy and
seeded); 64 concurrent clients all get correct answers and leave every KV block, state slot and per-request record
free with flat RSS; a client that disconnects mid-stream (or before a non-streamed answer) frees its request."""

from __future__ import annotations

import asyncio
import gc
import random

import httpx
import openai
import pytest

from server_helpers import MODEL_NAME, Served, rss_bytes, tiny_checkpoint
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams

ENGINE = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64)  # chunked, mixed steps
PER_CLIENT = 2  # requests per client and round of the load test
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ckpt):
    s = Served(ckpt, forcing=False, **ENGINE)  # the checkpoint's own LLM: prefix cache on, vision tower loaded
    yield s
    s.stop()


@pytest.fixture(scope="module")
def served_wide(ckpt):
    s = Served(ckpt, forcing=False, max_model_len=256, max_num_seqs=32, max_num_batched_tokens=256)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oracle(ckpt):
    return LLM(ckpt, **ENGINE)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


async def stream_tokens(client: openai.AsyncOpenAI, chat: bool, prompt, kw: dict) -> list[int]:
    ids: list[int] = []
    if chat:
        stream = await client.chat.completions.create(model=MODEL_NAME, messages=prompt, stream=True, **kw)
    else:
        stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, stream=True, **kw)
    async for chunk in stream:
        for c in chunk.choices:
            ids += c.model_extra.get("token_ids") or []
    return ids


def test_32_concurrent_streams_equal_each_alone(served, oracle):
    rng = random.Random(0)
    requests = []
    for i in range(32):
        seeded = i % 2 == 1
        sampling = dict(temperature=0.9, top_p=0.95, top_k=30, seed=1000 + i) if seeded else dict(temperature=0)
        if i % 4 == 3:  # a chat request: the checkpoint's template
            messages = [{"role": "user", "content": f"question number {i}?"}]
            ref_prompt = oracle.encode(oracle.render_chat(messages), add_special_tokens=False)
            requests.append((True, messages, ref_prompt, sampling))
        else:
            prompt = [rng.randrange(1000) for _ in range(rng.randrange(3, 90))]
            requests.append((False, prompt, prompt, sampling))
    max_tokens = 8

    async def run_all():
        client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=120)
        async with client:
            return await asyncio.gather(*(stream_tokens(client, chat, p, dict(
                max_tokens=max_tokens, extra_body={"return_token_ids": True, **{k: v for k, v in s.items()
                                                                               if k == "top_k"}},
                **{k: v for k, v in s.items() if k != "top_k"})) for chat, p, _, s in requests))

    got = asyncio.run(run_all())
    for i, ((chat, _, ref_prompt, s), ids) in enumerate(zip(requests, got)):
        solo = oracle.generate([ref_prompt], SamplingParams(max_tokens=max_tokens, **s))[0]
        assert ids == solo.token_ids, f"request {i} ({'chat' if chat else 'completion'}, {s})"
    assert served.idle_and_free()


def test_64_clients_complete_correctly_and_free_everything(served_wide, oracle):
    served = served_wide
    prompts = [f"client prompt {k}: tell me about the sea" for k in range(8)]
    expected = {p: oracle.generate([p], SamplingParams(temperature=0, max_tokens=4))[0].text for p in prompts}
    chat_expected = {}
    for p in prompts[:4]:
        out = oracle.chat([{"role": "user", "content": p}], SamplingParams(temperature=0, max_tokens=4),
                          enable_thinking=False)[0]
        chat_expected[p] = out.text

    async def one_client(client, c: int) -> int:
        ok = 0
        for r in range(PER_CLIENT):
            p = prompts[(c + r) % len(prompts)]
            stream = (c + r) % 2 == 0
            if p in chat_expected and c % 3 == 0:
                kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": p}], max_tokens=4, temperature=0,
                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                if stream:
                    text = ""
                    async for chunk in await client.chat.completions.create(stream=True, **kw):
                        text += "".join(ch.delta.content or "" for ch in chunk.choices)
                else:
                    text = (await client.chat.completions.create(**kw)).choices[0].message.content
                ok += text == chat_expected[p]
            else:
                kw = dict(model=MODEL_NAME, prompt=p, max_tokens=4, temperature=0)
                if stream:
                    text = ""
                    async for chunk in await client.completions.create(stream=True, **kw):
                        text += "".join(ch.text for ch in chunk.choices)
                else:
                    text = (await client.completions.create(**kw)).choices[0].text
                ok += text == expected[p]
        return ok

    async def round_of_64():
        client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=300)
        async with client:
            return sum(await asyncio.gather(*(one_client(client, c) for c in range(64))))

    assert asyncio.run(round_of_64()) == 64 * PER_CLIENT  # warms every allocator up
    assert served.idle_and_free()
    gc.collect()
    rss_warm = rss_bytes()
    for _ in range(2):
        assert asyncio.run(round_of_64()) == 64 * PER_CLIENT
        assert served.idle_and_free()
    gc.collect()
    grown = rss_bytes() - rss_warm
    assert grown < 32 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over {2 * 64 * PER_CLIENT} more requests"
    engine = served.llm.engine
    assert engine.requests == {} and engine.detokenizers == {}
    assert served.state.metrics._submitted == {} and served.state.metrics._last_token == {}


def test_a_client_gone_mid_stream_frees_its_request(served):
    aborted = metric(served.url, "deltaserve:num_aborted_requests_total")
    generated = metric(served.url, "deltaserve:generation_tokens_total")
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "go on"}], "max_tokens": 200,
            "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", served.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            events = 0
            for line in r.iter_lines():
                events += line.startswith("data: ")
                if events == 4:
                    break  # closing the response drops the connection
    assert served.idle_and_free(timeout=5)
    assert metric(served.url, "deltaserve:num_aborted_requests_total") == aborted + 1
    assert 0 < metric(served.url, "deltaserve:generation_tokens_total") - generated < 200


def test_a_client_gone_before_a_non_streamed_answer_frees_its_request(served):
    aborted = metric(served.url, "deltaserve:num_aborted_requests_total")
    body = {"model": MODEL_NAME, "prompt": "go on", "max_tokens": 240, "ignore_eos": True, "temperature": 0}
    assert httpx.post(served.url + "/v1/completions", json=dict(body, max_tokens=1)).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    assert served.idle_and_free(timeout=5)
    assert metric(served.url, "deltaserve:num_aborted_requests_total") == aborted + 1


def test_a_repeated_conversation_is_served_from_the_prefix_cache(served, oracle):
    system = "You are a careful assistant. " * 12  # past the cache's 64-token seams
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": False}}
    hits = metric(served.url, "deltaserve:prefix_cache_hits_total")
    first = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60).json()
    second = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]  # resumed == computed
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 64 <= cached < second["usage"]["prompt_tokens"] and cached % 64 == 0
    assert metric(served.url, "deltaserve:prefix_cache_hits_total") - hits >= cached
    assert metric(served.url, "deltaserve:prefix_cache_queries_total") > 0
    assert served.idle_and_free()


def test_image_chat_equals_llm_chat(served, oracle, tmp_path):
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is this?"}]}]
    ref = oracle.chat(messages, SamplingParams(temperature=0, max_tokens=6), enable_thinking=False)[0]
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=60)
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6, temperature=0,
                                       extra_body={"return_token_ids": True, **NO_THINKING})
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)  # the image's placeholder tokens counted
    (tmp_path / "red.png").write_bytes(buf.getvalue())  # a file under --allowed-local-media-path: the same image
    messages[0]["content"][0] = {"type": "image", "path": str(tmp_path / "red.png")}
    served.state.config.allowed_local_media_path = str(tmp_path)
    try:
        r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6, temperature=0,
                                           extra_body={"return_token_ids": True, **NO_THINKING})
    finally:
        served.state.config.allowed_local_media_path = None
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids
    assert served.idle_and_free()
