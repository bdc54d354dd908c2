"""The vision path against transformers (CPU, fp32): processor outputs equal, vision features and logits of prompts
with one and two images of different sizes within 1e-4 relative, greedy tokens equal; MoE and dense."""

from __future__ import annotations

import pytest
import torch

from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.multimodal import ImageSupport
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.model.vision.processor import ImageProcessor, ImageProcessorConfig
from deltaserve.weights.loader import load_checkpoint
from model_helpers import rel_err
from vision_helpers import (IMAGE_TOKEN, engine_prompt_logits, hf_processor, hf_vision_model, png_bytes,
                            random_image, write_checkpoint)

TOL = 1e-4


@pytest.fixture(scope="module", params=[True, False], ids=["moe", "dense"])
def setup(request, tmp_path_factory):
    hf = hf_vision_model(request.param)
    ckpt = load_checkpoint(write_checkpoint(hf, tmp_path_factory.mktemp("ckpt")), dtype=torch.float32,
                           progress=False, vision=True)
    support = ImageSupport.for_model(ckpt.vision, ckpt.config, ckpt.path)
    return hf, ckpt, support


def _engine(ckpt, support, **kw):
    return LLMEngine(ckpt.model, None, [], EngineConfig(num_blocks=64, cuda_graphs=False, **kw), support)


def test_processor_matches_transformers():
    """pixel_values and image_grid_thw equal to transformers' Qwen2-VL processor (PIL backend), bit for bit, for
    up- and down-scaled images, odd sizes, a tall one, RGBA and grey inputs."""
    ours = ImageProcessor(ImageProcessorConfig(4, 2, 2, 256, 2304))
    ref = hf_processor()
    images = [random_image(37, 53, 0), random_image(90, 20, 1), random_image(8, 8, 2), random_image(120, 150, 3),
              random_image(33, 47, 4, "RGBA"), random_image(40, 24, 5, "L")]
    out = ref(images, return_tensors="pt")
    mine = [ours(im) for im in images]
    assert [list(m.grid) for m in mine] == out["image_grid_thw"].tolist()
    assert torch.equal(torch.cat([m.pixel_values for m in mine]), out["pixel_values"])


def test_vision_features_match_transformers(setup):
    hf, ckpt, support = setup
    images = [random_image(40, 56, 0), random_image(72, 24, 1)]
    ref_in = hf_processor()(images, return_tensors="pt")
    with torch.no_grad():
        ref = hf.model.visual(ref_in["pixel_values"], grid_thw=ref_in["image_grid_thw"]).pooler_output
    processed = support.process(images)
    got = support.encode([p.pixel_values for p in processed], [p.grid for p in processed])
    assert got.shape == ref.shape and rel_err(got, ref) < TOL


def _prompt(n_images: int) -> list[int]:
    ids = [11, 12, 13, IMAGE_TOKEN, 14, 15]
    if n_images == 2:
        ids += [16, IMAGE_TOKEN, 17, 18, 19]
    return ids + [20, 21]


def _hf_inputs(ids: list[int], images):
    proc = hf_processor()(images, return_tensors="pt")
    merge = 4
    counts = (proc["image_grid_thw"].prod(-1) // merge).tolist()
    expanded, k = [], 0
    for t in ids:
        if t == IMAGE_TOKEN:
            expanded += [IMAGE_TOKEN] * counts[k]
            k += 1
        else:
            expanded.append(t)
    input_ids = torch.tensor([expanded])
    return dict(input_ids=input_ids, pixel_values=proc["pixel_values"], image_grid_thw=proc["image_grid_thw"],
                mm_token_type_ids=(input_ids == IMAGE_TOKEN).int())


@pytest.mark.parametrize("n_images", [1, 2])
def test_logits_and_greedy_match_transformers(setup, n_images):
    hf, ckpt, support = setup
    images = [random_image(40, 56, 10), random_image(64, 24, 11)][:n_images]
    ids = _prompt(n_images)
    hf_in = _hf_inputs(ids, images)
    with torch.no_grad():
        ref = hf(**hf_in).logits[0]
    got, expanded = engine_prompt_logits(_engine(ckpt, support), ids, [png_bytes(im) for im in images])
    assert expanded == hf_in["input_ids"][0].tolist()
    assert rel_err(got, ref) < TOL

    with torch.no_grad():
        ref_tokens = hf.generate(**hf_in, max_new_tokens=6, do_sample=False)[0, len(expanded):].tolist()
    engine = _engine(ckpt, support)
    engine.add_request(ids, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), images=images)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    assert outs[0].token_ids == ref_tokens
