"""Checkpoint loading: safetensors streaming, name mapping per format, load with every tensor used exactly once.

    from deltaserve.weights import load_checkpoint
    ckpt = load_checkpoint("/path/to/Qwen3.5-0.8B", device="cpu", dtype=torch.float32)
    ckpt.model, ckpt.config, ckpt.set_aside, ckpt.format
"""

from .formats import CheckpointError, CheckpointFormat, Mapped, Placement, SetAside, TensorInfo, detect_format
from .loader import LoadedCheckpoint, load_checkpoint
from .safetensors_io import SafetensorsCheckpoint

__all__ = [
    "CheckpointError",
    "CheckpointFormat",
    "LoadedCheckpoint",
    "Mapped",
    "Placement",
    "SafetensorsCheckpoint",
    "SetAside",
    "TensorInfo",
    "detect_format",
    "load_checkpoint",
]
