"""The vision path on the GPU (bf16, the fast path): the tower against the fp32 CPU reference, and requests with
images giving the same bits alone, batched, chunked (image tokens split over chunks) and through the decode graphs.

Run on the H200: `pytest -m gpu tests/gpu/test_vision_gpu.py` (about a minute, mostly Triton compiles).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.multimodal import ImageSupport
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.weights.loader import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent.parent))
from model_helpers import rel_err  # noqa: E402
from vision_helpers import IMAGE_TOKEN, engine_prompt_logits, hf_vision_model, random_image, write_checkpoint  # noqa: E402

pytestmark = pytest.mark.gpu
IDS = [11, 12, IMAGE_TOKEN, 13, 14, 15, IMAGE_TOKEN, 16]
IMAGES = [random_image(40, 56, 20), random_image(72, 32, 21)]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    hf = hf_vision_model(True, seed=5)
    with torch.no_grad():  # bf16-exact weights (A_log stays fp32, as released)
        for name, p in hf.named_parameters():
            if not name.endswith("A_log"):
                p.copy_(p.bfloat16().float())
    path = write_checkpoint(hf, tmp_path_factory.mktemp("ckpt"))
    gpu = load_checkpoint(path, device="cuda", dtype=torch.bfloat16, progress=False, vision=True)
    cpu = load_checkpoint(path, dtype=torch.float32, progress=False, vision=True)
    return gpu, cpu


def _engine(ckpt, chunk=512, graphs=False):
    support = ImageSupport.for_model(ckpt.vision, ckpt.config, ckpt.path)
    # blocks of 16 (the CUDA default is 64): chunks of 16 cut the image's placeholder run mid-way
    cfg = EngineConfig(block_size=16, num_blocks=96, max_num_batched_tokens=chunk, cuda_graphs=graphs)
    return LLMEngine(ckpt.model, None, [], cfg, support)


def _tokens(engine, requests):
    rids = [engine.add_request(ids, GREEDY, images=images) for ids, images in requests]
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    return [done[r] for r in rids]


def test_tower_bf16_cuda_against_fp32_cpu(ckpts):
    gpu, cpu = ckpts
    support = ImageSupport.for_model(cpu.vision, cpu.config, cpu.path)
    processed = support.process(IMAGES)
    args = ([p.pixel_values for p in processed], [p.grid for p in processed])
    ref = support.encode(*args)
    got = ImageSupport.for_model(gpu.vision, gpu.config, gpu.path).encode(*args)
    assert got.is_cuda and got.dtype == torch.bfloat16
    assert rel_err(got.float().cpu(), ref) < 3e-2


def test_same_bits_alone_batched_chunked_graphs(ckpts):
    gpu, _ = ckpts
    whole, _ = engine_prompt_logits(_engine(gpu), IDS, IMAGES)
    chunked, _ = engine_prompt_logits(_engine(gpu, chunk=16), IDS, IMAGES)
    assert torch.equal(whole, chunked)
    ref = _tokens(_engine(gpu), [(IDS, IMAGES)])[0]
    other = ([30, IMAGE_TOKEN, 31], [random_image(48, 48, 22)])
    assert _tokens(_engine(gpu), [([21, 22, 23], None), (IDS, IMAGES), other])[1] == ref
    assert _tokens(_engine(gpu, chunk=16), [(IDS, IMAGES), other])[0] == ref
    engine = _engine(gpu, graphs=True)
    assert _tokens(engine, [(IDS, IMAGES), other])[0] == ref
    assert engine.runner.graph_steps > 0
