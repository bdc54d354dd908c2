"""The server on the GPU fast path (bf16, CUDA graphs, the engine thread driving the device): 32 concurrent streamed
requests through HTTP get exactly the tokens `LLM.generate` gives each alone, greedy and seeded, and every KV block
and state slot is free afterwards.

Run on the H200: `pytest -m gpu tests/gpu/test_server_gpu.py` (about a minute).
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch

from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.engine.tokenizer import TokenizerInfo
from deltaserve.weights.loader import load_checkpoint
from model_helpers import bf16_exact_moe_checkpoint

pytestmark = pytest.mark.gpu
ENGINE = dict(max_num_seqs=16, max_model_len=256, max_num_batched_tokens=128, block_size=16, cuda_graphs=True)


def word_tokenizer(vocab: int) -> TokenizerInfo:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return TokenizerInfo(tok)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    d = tmp_path_factory.mktemp("ckpt")
    bf16_exact_moe_checkpoint(d)
    return d


def _llm(ckpt) -> LLM:
    model = load_checkpoint(ckpt, device="cuda", dtype=torch.bfloat16, progress=False).model
    return LLM.from_model(model, word_tokenizer(model.config.vocab_size), **ENGINE)


def test_32_concurrent_streams_equal_each_alone_on_the_gpu(ckpt):
    import openai

    from deltaserve.server.app import build_app
    from deltaserve.server.launch import build_state
    from deltaserve.server.serving import ServerConfig
    from server_helpers import ServerThread

    rng = random.Random(0)
    requests = []
    for i in range(32):
        prompt = [rng.randrange(32) for _ in range(rng.randrange(3, 150))]
        sampling = dict(temperature=0.8, top_p=0.9, seed=500 + i) if i % 2 else dict(temperature=0)
        requests.append((prompt, sampling))
    oracle = _llm(ckpt)  # its own copy of the weights: the server's engine thread never shares a model
    solo = [oracle.generate([p], SamplingParams(max_tokens=24, ignore_eos=True, **s))[0].token_ids
            for p, s in requests]
    del oracle
    torch.cuda.empty_cache()

    llm = _llm(ckpt)
    state = build_state(llm, ServerConfig(["gpu"]), max_queued_requests=None)
    server = ServerThread(build_app(state)).start()

    async def run_all():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300) as c:
            async def one(prompt, sampling):
                ids = []
                stream = await c.completions.create(model="gpu", prompt=prompt, max_tokens=24, stream=True,
                                                    extra_body={"ignore_eos": True, "return_token_ids": True},
                                                    **sampling)
                async for chunk in stream:
                    for ch in chunk.choices:
                        ids += ch.model_extra.get("token_ids") or []
                return ids

            return await asyncio.gather(*(one(p, s) for p, s in requests))

    try:
        got = asyncio.run(run_all())
        for i, (ids, ref) in enumerate(zip(got, solo)):
            assert ids == ref, f"request {i} ({requests[i][1]})"
        s = llm.engine.scheduler
        deadline = time.time() + 10
        while state.engine.num_unfinished or s.blocks.num_free != s.blocks.num_blocks:
            assert time.time() < deadline, "blocks still held after every request finished"
            time.sleep(0.05)
        assert s.slots.num_free == s.slots.num_slots and state.engine.is_alive
    finally:
        server.stop()
        state.engine.shutdown()
