"""Synthetic checkpoints in the exact published Qwen3.5/3.6 (and Qwen3-Next) layout, with random weights.

    from deltaserve.synthetic import make_checkpoint
    path = make_checkpoint("/tmp/tiny", "tiny-moe", seed=0)

Presets: qwen3.6-35b-a3b, qwen3.5-0.8b (published shapes), tiny-moe, tiny-dense, tiny-next (seconds on CPU).
"""

from .presets import PRESETS, SPECIAL_TOKENS, Preset, VisionDims, get_preset, special_ids
from .writer import make_checkpoint

__all__ = ["PRESETS", "SPECIAL_TOKENS", "Preset", "VisionDims", "get_preset", "make_checkpoint", "special_ids"]
