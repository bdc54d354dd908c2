"""Memory figures used to size caches (leaf helper: no deltaserve imports)."""

from __future__ import annotations

import torch

GiB = 1 << 30


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cache_budget_bytes(device: torch.device, fraction: float = 0.9, host_fraction: float = 0.25) -> int:
    """Default bytes for the KV cache + state pool after the model is loaded.

    CUDA: `fraction` of the free device memory. CPU: `host_fraction` of the available host memory, at most 4 GiB
    (the CPU path is the reference path; it never needs huge caches), 1 GiB where the figure is unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    avail = host_available_bytes()
    if avail is None:
        return GiB
    return min(int(avail * host_fraction), 4 * GiB)
