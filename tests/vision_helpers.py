"""Helpers for the image tests: a transformers Qwen3.5 model with a vision tower written as a checkpoint, test
images, and an engine run that returns all-position logits of a prompt with images."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from model_helpers import make_hf_model

IMAGE_TOKEN = 7  # inside the tiny vocabulary (the published 248056 is beyond it)
# patch 4, merge 2: sides are multiples of 8; small pixel bounds keep the prompts short
PREPROCESSOR = {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3, "rescale_factor": 1 / 255, "size": {"shortest_edge": 256, "longest_edge": 2304}}


def hf_vision_model(moe: bool, seed: int = 0):
    hf = make_hf_model(moe, seed=seed)
    hf.config.image_token_id = IMAGE_TOKEN
    hf.model.config.image_token_id = IMAGE_TOKEN
    with torch.no_grad():  # visible LayerNorms and biases (transformers initialises them to 1 / 0)
        for name, p in hf.model.visual.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def write_checkpoint(hf, directory: Path) -> Path:
    """The transformers model's weights in the published layout (config.json, model.safetensors) plus the
    preprocessor_config.json above."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf.config.to_dict()))
    (directory / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return directory


def hf_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": 256, "longest_edge": 2304})


def random_image(h: int, w: int, seed: int, mode: str = "RGB"):
    from PIL import Image

    rng = np.random.default_rng(seed)
    # smooth-ish content (a gradient plus noise), so resizing is not pure noise
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 127 // max(h + w, 1))], -1)
    img = np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(img).convert(mode)


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@torch.no_grad()
def engine_prompt_logits(engine, ids, images) -> tuple[torch.Tensor, list[int]]:
    """(all-position logits [L, V] of the expanded prompt, the expanded ids) through the engine."""
    from deltaserve.engine.sampling_params import SamplingParams

    rid = engine.add_request(ids, SamplingParams(max_tokens=1), logits_only=True, images=images)
    prompt_ids = engine.requests[rid].prompt_token_ids
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return out.prompt_logits, prompt_ids
    raise RuntimeError("no output")
