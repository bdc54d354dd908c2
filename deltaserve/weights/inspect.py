"""`deltaserve info`: what a checkpoint is and what it costs in memory, from its config (and headers if present)."""

from __future__ import annotations

from pathlib import Path


def describe_checkpoint(path: str | Path) -> str:
    """The `deltaserve info` text for a checkpoint directory: architecture, parameter count, bits per weight by layer
    class, resident size. Works on a config-only directory (sizes computed from config.json and its quantization
    entry, no weights needed)."""
    raise NotImplementedError("describe_checkpoint: in progress (issue 3)")
