"""Host -> device copies that never block the host (the engine runs one step ahead of the device)."""

from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A small host list or array as a device tensor, through pinned memory, copied asynchronously on the current
    stream. (A plain `torch.tensor(..., device="cuda")` copies from pageable memory and waits for the stream:
    a synchronisation per call.) PyTorch's pinned-block cache reuses the buffer once the copy has run."""
    t = torch.as_tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t
