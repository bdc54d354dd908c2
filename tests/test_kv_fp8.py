"""The fp8 K/V cache (kernels/attention/kv_fp8.py, EngineConfig.kv_cache_dtype="fp8") on the reference path (fp32,
CPU): the format's meaning, its exactness properties (chunked == whole, batched == alone, through the engine too),
its distance from the full-precision cache, its memory, and its errors. The Triton writers and readers are checked
under the interpreter (tests/test_triton_interpret.py, kv_fp8_* cases) and on the GPU (tests/gpu/test_kv_fp8_gpu.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from engine_helpers import drain, random_prompt, tiny_model
from model_helpers import Session, greedy, make_hf_model, ours_from_state_dict, prompt, rel_err
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.kernels.attention import reference as attn_ref
from deltaserve.kernels.attention.kv_fp8 import FP8, dequantize_rows, quantize_rows
from deltaserve.model.cache import cache_spec, parse_kv_cache_dtype

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import kv_fp8_cases  # noqa: E402  (tests/gpu: the format check the interpreter and GPU cases share)


@pytest.fixture(scope="module")
def model():
    return ours_from_state_dict(make_hf_model(moe=True, seed=11))


def test_format():
    kv_fp8_cases.check_format("cpu")
    x8, sc = quantize_rows(torch.tensor([[448.0 * 3, -3.0, 0.0, 1e-9]]))
    assert float(sc[0]) == 3.0 and x8.float().tolist() == [[448.0, -1.0, 0.0, 0.0]]
    assert torch.equal(dequantize_rows(x8, sc), torch.tensor([[1344.0, -3.0, 0.0, 0.0]]))


def test_reference_write_and_read_are_the_format():
    """write_kv into an fp8 cache stores quantize_rows of each (token, head) row; gather_kv reads x8 * scale."""
    kc = torch.zeros(3, 4, 2, 8, dtype=FP8)
    vc = torch.zeros_like(kc)
    ks, vs = torch.ones(3, 4, 2), torch.ones(3, 4, 2)
    k, v = torch.randn(5, 2, 8) * 7, torch.randn(5, 2, 8)
    slots = torch.tensor([0, 5, 6, 11, 3])
    attn_ref.write_kv(kc, vc, slots, k, v, ks, vs)
    k8, ksc = quantize_rows(k)
    assert torch.equal(kc.view(12, 2, 8)[slots].view(torch.uint8), k8.view(torch.uint8))
    assert torch.equal(ks.view(12, 2)[slots], ksc)
    table = torch.tensor([1, 0, 2])  # positions 0..3 in block 1, 4..7 in block 0
    got = attn_ref.gather_kv(kc, table, 6, ks)
    want = dequantize_rows(kc.view(12, 2, 8)[[4, 5, 6, 7, 0, 1]], ks.view(12, 2)[[4, 5, 6, 7, 0, 1]])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="needs k_scale"):
        attn_ref.write_kv(kc, vc, slots, k, v, None, vs)


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_chunked_prefill_equals_whole(model, chunk):
    """Each cached row is quantised from its own values, and every query reads every key from the cache: where a
    chunk boundary falls changes nothing beyond the fp32 reference's own summation order."""
    p = prompt(150)
    _, whole = greedy(model, p, 0, kv_dtype=FP8)
    _, chunked = greedy(model, p, 0, prefill_chunk=chunk, kv_dtype=FP8)
    assert rel_err(chunked, whole) < 1e-5


def test_batch_of_different_lengths_equals_alone(model):
    prompts = {0: prompt(5, 3), 1: prompt(70, 4), 2: prompt(1, 5), 3: prompt(33, 6)}
    alone = {s: greedy(model, p, 6, kv_dtype=FP8)[0] for s, p in prompts.items()}
    sess = Session(model, kv_dtype=FP8)
    ctx = {s: 0 for s in prompts}
    logits = sess.step(dict(prompts), ctx)
    toks = {s: [int(logits[i].argmax())] for i, s in enumerate(sorted(prompts))}
    for _ in range(5):
        logits = sess.step({s: [toks[s][-1]] for s in prompts}, ctx)
        for i, s in enumerate(sorted(prompts)):
            toks[s].append(int(logits[i].argmax()))
    assert toks == alone


def test_close_to_the_full_precision_cache(model):
    """fp8 keys and values move the logits by well under 1% of their range on this random model (6.6e-4); the
    cache is really fp8 (the logits differ)."""
    p = prompt(120, seed=7)
    _, full = greedy(model, p, 0)
    _, fp8 = greedy(model, p, 0, kv_dtype=FP8)
    err = rel_err(fp8, full)
    assert 0 < err < 0.01, err
    agree = (fp8.argmax(-1) == full.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree


def test_engine_batched_equals_alone_and_cache_is_fp8():
    m = tiny_model(moe=True, seed=3)
    cfg = dict(num_blocks=128, max_model_len=256, kv_cache_dtype="fp8")
    prompts = [random_prompt(n, seed=n) for n in (3, 17, 40, 5)]
    params = [SamplingParams(temperature=0, max_tokens=10) for _ in prompts]
    engine = LLMEngine(m, None, [], EngineConfig(max_num_batched_tokens=32, **cfg))
    assert all(t.dtype == FP8 for t in engine.cache.k.values()) and engine.cache.k_scale
    together = drain(engine, prompts, params)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        assert drain(LLMEngine(m, None, [], EngineConfig(**cfg)), [p], [sp]) == [together[i]], f"prompt {i}"


def test_memory_and_errors(model):
    cfg = model.config
    full = cache_spec(cfg, 16, torch.bfloat16)
    half = cache_spec(cfg, 16, torch.bfloat16, FP8)
    assert half.bytes_per_block * 2 * cfg.head_dim == full.bytes_per_block * (cfg.head_dim + 4)
    assert half.bytes_per_state_slot == full.bytes_per_state_slot  # the DeltaNet state is not touched
    m = tiny_model(moe=True, seed=3)
    budget = dict(max_model_len=256, max_num_seqs=8, cache_memory_bytes=400_000)
    n_auto = LLMEngine(m, None, [], EngineConfig(**budget)).num_blocks
    n_fp8 = LLMEngine(m, None, [], EngineConfig(kv_cache_dtype="fp8", **budget)).num_blocks
    assert n_fp8 > 2 * n_auto  # fp32 model: 4 bytes an element against 1 + a scale
    with pytest.raises(ValueError, match="kv_cache_dtype 'int4' is not supported"):
        parse_kv_cache_dtype("int4")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLMEngine(m, None, [], EngineConfig(num_blocks=8, kv_cache_dtype="e5m2"))
    llm = LLM.from_model(m, num_blocks=64, max_model_len=128, kv_cache_dtype="fp8")
    assert llm.logits(random_prompt(12, seed=1)).isfinite().all()
