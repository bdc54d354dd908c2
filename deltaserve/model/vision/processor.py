"""Image pre-processing for the Qwen3.5 / 3.6 vision tower (spec 3.10; transformers' Qwen2-VL image processor, PIL
backend, gives the same pixel_values and image_grid_thw: tests/test_vision_oracle.py).

  1. smart resize: height and width become multiples of factor = patch * merge (32 published), as close to the
     original aspect as possible, with min_pixels <= h * w <= max_pixels (bicubic, PIL);
  2. rescale to [0, 1] (x * 1/255 in fp64, then fp32) and normalise (x - mean) / std per channel (fp32);
  3. the image is one temporal group: its frame duplicated temporal_patch_size (2) times;
  4. patches in merge-window order, one row of C * T * P * P values each, in (C, T, P, P) order.
Output: pixel_values [h/P * w/P, C*T*P*P] fp32 and the grid (1, h/P, w/P); the language model sees
h/P * w/P / merge^2 image tokens.

Settings come from the checkpoint's preprocessor_config.json (`size.shortest_edge` / `size.longest_edge` or
`min_pixels` / `max_pixels`, patch_size, temporal_patch_size, merge_size, image_mean, image_std, rescale_factor),
else the published values; overrides as vLLM's `mm_processor_kwargs` (min_pixels, max_pixels).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import VisionConfig
from .images import DEFAULT_MAX_INPUT_PIXELS, ImageInputError, describe, load_image

MAX_ASPECT_RATIO = 200  # transformers' smart_resize refuses longer/shorter side beyond this


@dataclass(frozen=True)
class ImageProcessorConfig:
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536  # size.shortest_edge (a pixel count, despite the name)
    max_pixels: int = 16777216  # size.longest_edge
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    max_input_pixels: int = DEFAULT_MAX_INPUT_PIXELS  # larger inputs are refused before decoding

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def with_overrides(self, overrides: dict | None) -> "ImageProcessorConfig":
        allowed = ("min_pixels", "max_pixels", "max_input_pixels")
        overrides = dict(overrides or {})
        bad = sorted(set(overrides) - set(allowed))
        if bad:
            raise ValueError(f"mm_processor_kwargs: unknown key(s) {bad}; supported: {', '.join(allowed)}")
        for k, v in overrides.items():
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"mm_processor_kwargs[{k!r}] must be a positive integer, found {v!r}")
        cfg = replace(self, **overrides)
        cfg.validate("mm_processor_kwargs")
        return cfg

    def validate(self, source: str) -> None:
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"{source}: min_pixels {self.min_pixels} exceeds max_pixels {self.max_pixels}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or not all(s > 0 for s in self.image_std):
            raise ValueError(f"{source}: image_mean / image_std must be 3 values (std positive)")

    @classmethod
    def from_checkpoint(cls, path: str | Path | None, vision: VisionConfig) -> "ImageProcessorConfig":
        """preprocessor_config.json of the checkpoint directory when present, else the published defaults; patch,
        temporal patch and merge sizes default to the vision config's."""
        base = cls(vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
        file = Path(path) / "preprocessor_config.json" if path is not None else None
        if file is None or not file.exists():
            return base
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: not valid JSON ({e})") from None
        size = data.get("size") or {}
        cfg = replace(
            base,
            patch_size=int(data.get("patch_size", base.patch_size)),
            temporal_patch_size=int(data.get("temporal_patch_size", base.temporal_patch_size)),
            merge_size=int(data.get("merge_size", base.merge_size)),
            min_pixels=int(data.get("min_pixels") or size.get("shortest_edge") or base.min_pixels),
            max_pixels=int(data.get("max_pixels") or size.get("longest_edge") or base.max_pixels),
            image_mean=tuple(float(v) for v in data.get("image_mean", base.image_mean)),
            image_std=tuple(float(v) for v in data.get("image_std", base.image_std)),
            rescale_factor=float(data.get("rescale_factor", base.rescale_factor)),
        )
        cfg.validate(str(file))
        if (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size) != (
                vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size):
            raise ValueError(f"{file}: patch/temporal/merge sizes ({cfg.patch_size}, {cfg.temporal_patch_size}, "
                             f"{cfg.merge_size}) differ from config.json's vision_config")
        return cfg


@dataclass
class ProcessedImage:
    pixel_values: torch.Tensor  # [h * w, C*T*P*P] fp32, merge-window order
    grid: tuple[int, int, int]  # (t, h, w) in patches
    num_tokens: int  # language-model tokens: t * h * w / merge^2
    size: tuple[int, int]  # (width, height) after resizing


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width): multiples of factor, about the same aspect, within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageInputError(f"aspect ratio {max(height, width) / min(height, width):.1f} of a {width}x{height} "
                              f"image exceeds {MAX_ASPECT_RATIO}")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


class ImageProcessor:
    def __init__(self, config: ImageProcessorConfig):
        self.config = config

    def __call__(self, source: Any) -> ProcessedImage:
        from PIL import Image

        cfg = self.config
        image = load_image(source, cfg.max_input_pixels)
        try:
            h, w = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
        except ImageInputError as e:
            raise ImageInputError(f"image {describe(source)}: {e}") from None
        if (w, h) != image.size:
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)  # [C, H, W] uint8
        x = (pixels.double() * cfg.rescale_factor).float()
        mean = torch.tensor(cfg.image_mean, dtype=torch.float32)[:, None, None]
        std = torch.tensor(cfg.image_std, dtype=torch.float32)[:, None, None]
        x = (x - mean) / std
        return self.patchify(x)

    def patchify(self, x: torch.Tensor) -> ProcessedImage:
        """[C, H, W] fp32 (H, W multiples of patch * merge) -> merge-window-ordered patch rows."""
        cfg = self.config
        P, m, T = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
        C, H, W = x.shape
        gh, gw = H // P, W // P
        p = x.reshape(C, gh // m, m, P, gw // m, m, P).permute(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
        p = p.unsqueeze(5).expand(*p.shape[:5], T, P, P)  # the frame repeated T times: (C, T, P, P) per patch
        rows = p.reshape(gh * gw, C * T * P * P).contiguous()
        return ProcessedImage(rows, (1, gh, gw), gh * gw // (m * m), (W, H))
