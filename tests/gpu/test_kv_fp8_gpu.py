"""The fp8 K/V cache on CUDA (kernels/attention/kv_fp8.py): the writers' bytes against the format, the readers
against fp64 over the dequantised cache and batch invariant, at the 35B-A3B's attention shapes (Hq 16, Hkv 2,
D 256; toy shapes in the interpreter dry run); and the tiny model end to end with an fp8 cache: GPU bf16 against
the CPU fp32 reference path with the same fp8 cache (teacher-forced top-1), a sequence alone == among others, and
chunked prefill == whole, bit for bit."""

from __future__ import annotations

import importlib

import pytest
import torch

import kv_fp8_cases as fc
from deltaserve.kernels import launch_table
from deltaserve.kernels.attention.kv_fp8 import FP8

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mods(dev):
    return {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("attn", "attention.triton_paged"), ("qkprep", "attention.triton_qk_prep"), ("norm", "triton_norm"))}


def test_format(dev):
    fc.check_format(dev)


def test_write_kv(mods, dev, small):
    dims = dict(hq=4, hkv=2, d=32, bs=8) if small else dict(hq=16, hkv=2, d=256, bs=16)
    fc.check_write_kv(mods, dev, ctx=[0, 13, 5], seqs=[7, 3, 1], **dims)


def test_qk_prep(mods, dev, small):
    dims = dict(hq=4, hkv=2, d=32, rd=16) if small else dict(hq=16, hkv=2, d=256, rd=64)
    fc.check_qk_prep(mods, dev, 5 if small else 37, **dims)


@pytest.mark.parametrize("warps", [None, 4])  # None: the library's (8); 4: the shape it replaced, kept in the sweep
def test_attention(mods, dev, small, warps):
    with launch_table.override({} if warps is None else {"attention.decode_warps_fp8": warps}):
        if small:
            fc.check_attention(mods, dev, ctx=[0, 13, 5, 150], seqs=[7, 3, 1, 20], hq=4, hkv=2, d=32, bs=8)
        else:
            fc.check_attention(mods, dev, ctx=[0, 300, 1000, 4000], seqs=[50, 1, 130, 64], hq=16, hkv=2, d=256,
                               bs=16)


def test_errors(mods, dev):
    fc.check_errors(mods, dev)


def test_model_end_to_end(tmp_path, dev):
    """The tiny MoE model (bf16-exact weights) with fp8 caches: the GPU fast path's teacher-forced logits against
    the CPU fp32 reference path's (each quantising its own K/V rows) to the bf16 tests' top-1 bound; decode alone
    == among 1, 3, 15, 63 others and graph == eager, bit for bit, as for the bf16 cache."""
    if dev != "cuda":
        pytest.skip("end to end on the GPU only")
    from test_model_fast_path import BS, assert_top1_agreement, check_batch_invariance, check_graph_equals_eager

    from deltaserve.model import ForwardBatch
    from deltaserve.weights.loader import load_checkpoint
    from model_helpers import bf16_exact_moe_checkpoint

    cpu = bf16_exact_moe_checkpoint(tmp_path)
    gpu = load_checkpoint(tmp_path, device="cuda", dtype=torch.bfloat16, progress=False).model

    def logits(model, prompt, device, dtype):
        blocks = -(-len(prompt) // BS) + 1
        cache = model.make_cache(blocks, BS, 1, dtype, device, kv_dtype=FP8)
        fb = ForwardBatch.build([prompt], [0], [list(range(blocks))], [0], BS, device=device, logits="all")
        with torch.no_grad():
            return model(fb, cache).float().cpu()

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 32, (200,), generator=gen).tolist() for _ in range(4)]
    got = torch.cat([logits(gpu, p, "cuda", torch.bfloat16) for p in prompts])
    want = torch.cat([logits(cpu, p, "cpu", torch.float32) for p in prompts])
    assert_top1_agreement(got, want, "fp8 K/V cache")
    check_batch_invariance(gpu, kv_dtype=FP8)
    check_graph_equals_eager(gpu, kv_dtype=FP8)
