"""Images in requests: the engine's side of the vision tower (spec 3.10, 3.11).

At add_request (CPU, before anything is scheduled): each image is decoded and pre-processed
(model.vision.processor), the prompt's one `<|image_pad|>` per image is expanded to the image's token count and
the prompt's 3-D RoPE positions and rope_delta are computed (model.vision.mrope). A bad image is refused there with
an ImageInputError and nothing else is affected. The request carries the result as `Request.mm` (RequestImages).

In a step, one hook (`apply_to_batch`, called where the runner builds the ForwardBatch) gives the model:
- positions [3, T] whenever a multimodal request is in the batch (its prompt rows from RequestImages.positions,
  later rows at cache index + rope_delta on every axis; text requests' rows are their cache index three times);
- the image features of the chunk's image tokens as an embedding override (ForwardBatch.embeds_rows / embeds).
The features are computed once, by the request's first chunk, for all its images in one encoder call of their own
(so a request's features never depend on which other requests share the step), and dropped once its last image
token has been prefilled. An image's tokens may be split across chunks: each chunk takes its rows of the features.
Decode steps only need the position offset (`decode_positions`); the bucketed decode graphs take it as their
positions. Prefill chunks of multimodal requests run eagerly (no prefill graph: they carry an embedding override).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..model.forward_batch import ForwardBatch
from ..model.vision.grid import Grid
from ..model.vision.images import ImageInputError
from ..model.vision.mrope import expand_placeholders, mrope_positions
from ..model.vision.processor import ImageProcessor, ImageProcessorConfig, ProcessedImage

__all__ = ["ImageInputError", "ImageSupport", "RequestImages", "apply_to_batch", "content_hash", "decode_positions",
           "has_images"]


@dataclass
class RequestImages:
    """A request's images: pixels, grids, where their tokens sit in the prompt, its 3-D positions."""

    pixel_values: list[torch.Tensor]  # per image [patches, C*T*P*P] fp32 (host)
    grids: list[Grid]
    spans: list[tuple[int, int]]  # prompt rows [start, end) of each image's tokens
    positions: torch.Tensor  # [3, prompt_len] int64 (host)
    rope_delta: int  # a row at cache index i >= prompt_len has position i + rope_delta on every axis
    encoder: Callable[[list[torch.Tensor], list[Grid]], torch.Tensor] = field(repr=False, default=None)
    features: torch.Tensor | None = field(default=None, repr=False)  # [image tokens, H] while prefilling
    encoded: bool = False

    @property
    def num_image_tokens(self) -> int:
        return sum(hi - lo for lo, hi in self.spans)

    def chunk_positions(self, start: int, end: int) -> torch.Tensor:
        """[3, end - start] positions of cache rows [start, end)."""
        p = self.positions.shape[1]
        parts = []
        if start < p:
            parts.append(self.positions[:, start:min(end, p)])
        if end > p:
            parts.append(torch.arange(max(start, p), end).add(self.rope_delta).expand(3, -1))
        return torch.cat(parts, dim=1)

    def chunk_features(self, start: int, end: int) -> tuple[list[int], torch.Tensor | None]:
        """(rows of [start, end) that are image tokens, relative to start; their features), encoding first if
        needed. The features are released after the chunk that reaches the last image token."""
        rows, picks, offset = [], [], 0
        for lo, hi in self.spans:
            a, b = max(lo, start), min(hi, end)
            if a < b:
                rows.extend(range(a - start, b - start))
                picks.append((offset + a - lo, offset + b - lo))
            offset += hi - lo
        if not rows:
            return [], None
        feats = self._features()
        out = torch.cat([feats[a:b] for a, b in picks]) if len(picks) > 1 else feats[picks[0][0]:picks[0][1]]
        if end >= self.spans[-1][1]:
            self.features = None  # every image token is in the cache now
        return rows, out

    def _features(self) -> torch.Tensor:
        if self.features is None:
            if self.encoded:
                raise RuntimeError("image features requested again after the request's images were prefilled")
            self.features = self.encoder(self.pixel_values, self.grids)
            self.encoded = True
            if self.features.shape[0] != self.num_image_tokens:
                raise RuntimeError(f"vision tower gave {self.features.shape[0]} features for "
                                   f"{self.num_image_tokens} image tokens")
        return self.features


def content_hash(mm: RequestImages) -> bytes:
    """A digest of the request's images (their pre-processed pixels and grids, in order): the prefix cache mixes it
    into the request's block hashes, so a prompt's KV is shared only with requests holding the same images."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for pixels, grid in zip(mm.pixel_values, mm.grids):
        h.update(repr(tuple(grid)).encode())
        h.update(pixels.contiguous().numpy().tobytes())
    return b"img:" + h.digest()


class ImageSupport:
    """What an engine needs for images: the vision tower, the processor, the placeholder id and the per-prompt
    limit (vLLM's limit_mm_per_prompt["image"])."""

    def __init__(self, vision: torch.nn.Module, processor: ImageProcessor, image_token_id: int,
                 max_images: int | None = None):
        self.vision, self.processor = vision, processor
        self.image_token_id, self.max_images = image_token_id, max_images
        self.merge = vision.config.spatial_merge_size

    @classmethod
    def for_model(cls, vision, model_config, checkpoint_dir=None, mm_processor_kwargs: dict | None = None,
                  max_images: int | None = None) -> "ImageSupport":
        vcfg = vision.config
        proc = ImageProcessorConfig.from_checkpoint(checkpoint_dir, vcfg).with_overrides(mm_processor_kwargs)
        if model_config.image_token_id is None:
            raise ValueError("config.json has no image_token_id: the model cannot take images")
        if vcfg.out_hidden_size != model_config.hidden_size:
            raise ValueError(f"vision_config.out_hidden_size {vcfg.out_hidden_size} differs from the text "
                             f"hidden_size {model_config.hidden_size}")
        return cls(vision, ImageProcessor(proc), model_config.image_token_id, max_images)

    def process(self, images: Sequence[Any]) -> list[ProcessedImage]:
        """Every image decoded and pre-processed, or an ImageInputError naming the first bad one (by index)."""
        if self.max_images is not None and len(images) > self.max_images:
            raise ValueError(f"{len(images)} images in one prompt; the limit is {self.max_images} "
                             "(limit_mm_per_prompt)")
        out = []
        for i, image in enumerate(images):
            if isinstance(image, ProcessedImage):
                out.append(image)
                continue
            try:
                out.append(self.processor(image))
            except ImageInputError as e:
                raise ImageInputError(f"images[{i}]: {e}") from None
        return out

    def prepare(self, prompt_token_ids: Sequence[int], images: Sequence[Any]) -> tuple[list[int], RequestImages]:
        """(the prompt with placeholders expanded, the request's RequestImages)."""
        processed = self.process(images)
        ids, spans = expand_placeholders(prompt_token_ids, self.image_token_id, [p.num_tokens for p in processed])
        grids = [p.grid for p in processed]
        positions, delta = mrope_positions(len(ids), spans, grids, self.merge)
        return ids, RequestImages([p.pixel_values for p in processed], grids, spans, positions, delta, self.encode)

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], grids: list[Grid]) -> torch.Tensor:
        """Features [image tokens, out_hidden] of one request's images, on the tower's device."""
        return self.vision(torch.cat(pixel_values), grids)


# ---- the runner's hook -----------------------------------------------------------------------------------------


def has_images(seqs) -> bool:
    """Does any scheduled sequence belong to a request with images?"""
    return any(getattr(s.request, "mm", None) is not None for s in seqs)


def decode_positions(seqs) -> list[int] | None:
    """Positions of one-token steps (cache index + rope_delta), or None when no request has images."""
    if not has_images(seqs):
        return None
    return [s.start + (s.request.mm.rope_delta if s.request.mm is not None else 0) for s in seqs]


def apply_to_batch(batch: ForwardBatch, seqs) -> None:
    """Give the batch the multimodal requests' 3-D positions and image features (a no-op for text-only steps).
    seqs: the scheduler's ScheduledSeq list, in the batch's sequence order."""
    if not has_images(seqs):
        return
    pos, rows, feats, flat = [], [], [], 0
    for s in seqs:
        start, end = s.start, s.start + s.num_new_tokens
        mm = s.request.mm
        if mm is None:
            pos.append(torch.arange(start, end).expand(3, -1))
        else:
            pos.append(mm.chunk_positions(start, end))
            r, f = mm.chunk_features(start, end)
            if r:
                rows.extend(flat + i for i in r)
                feats.append(f)
        flat += s.num_new_tokens
    dev = batch.input_ids.device
    batch.positions = torch.cat(pos, dim=1).to(dev)
    if rows:
        batch.embeds_rows = torch.tensor(rows, dtype=torch.int64, device=dev)
        batch.embeds = torch.cat(feats).to(dev) if len(feats) > 1 else feats[0].to(dev)


# ---- chat messages with image parts ----------------------------------------------------------------------------

VIDEO_PART_TYPES = ("video", "video_url", "input_video")
AUDIO_PART_TYPES = ("audio", "audio_url", "input_audio")


def image_of_part(part: dict, where: str) -> Any | None:
    """The image a content part carries, None for a non-image part; video and audio parts are refused.

    Image parts: {"type": "image", "image" | "url" | "path": ...} (transformers / Qwen style; the value a PIL image,
    a path, bytes or a data: URL), {"type": "image_url", "image_url": {"url": "data:..."} or "data:..."} (OpenAI),
    {"type": "image_pil", "image_pil": PIL image} (vLLM)."""
    kind = part.get("type")
    if kind in VIDEO_PART_TYPES or (kind is None and "video" in part):
        raise ValueError(f"{where}: video input is not supported (images only; see docs/vision.md)")
    if kind in AUDIO_PART_TYPES:
        raise ValueError(f"{where}: audio input is not supported")
    if kind == "image" or (kind is None and "image" in part):
        for key in ("image", "url", "path"):
            if part.get(key) is not None:
                return part[key]
        raise ValueError(f"{where}: an image part needs one of 'image', 'url' or 'path'")
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
        if not isinstance(url, str):
            raise ValueError(f"{where}: 'image_url' must be {{'url': 'data:...'}} or a URL string, found {value!r}")
        return url
    if kind == "image_pil":
        if part.get("image_pil") is None:
            raise ValueError(f"{where}: an image_pil part needs 'image_pil'")
        return part["image_pil"]
    return None


def split_images(messages: Sequence[dict]) -> tuple[list[dict], list[Any]]:
    """(messages whose image parts are {"type": "image"} only, the images in prompt order).

    Chat templates render {"type": "image"} as `<|vision_start|><|image_pad|><|vision_end|>`; the images then go
    to the engine (add_request(images=...)) in the same order as their placeholders."""
    out, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, (list, tuple)):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise ValueError(f"messages[{i}].content[{j}] must be a dict part, found {type(part).__name__}")
            image = image_of_part(part, f"messages[{i}].content[{j}]")
            if image is None:
                parts.append(part)
            else:
                images.append(image)
                parts.append({"type": "image"})
        out.append({**message, "content": parts})
    return out, images


def chat_prompt_and_images(messages: Sequence[dict], chat_template: str, special_tokens: dict | None = None,
                           tools: Sequence[dict] | None = None, add_generation_prompt: bool = True,
                           **template_kwargs) -> tuple[str, list[Any]]:
    """OpenAI / transformers chat messages (image parts included) -> (prompt text, images): what a server passes
    to `LLMEngine.add_request(tokenizer.encode(prompt), params, images=images)`. Video parts are refused."""
    from .chat import render_chat

    plain, images = split_images(messages)
    text = render_chat(chat_template, plain, tools, add_generation_prompt, special_tokens, **template_kwargs)
    return text, images
