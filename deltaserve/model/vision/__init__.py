"""The vision side of Qwen3.5 / 3.6: the encoder, its per-image index tables, image pre-processing and the
multimodal (3-D) RoPE positions of a prompt with images."""

from .encoder import VisionTower

__all__ = ["VisionTower"]
