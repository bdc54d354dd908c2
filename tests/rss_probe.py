"""Peak resident memory of one loader or quantiser call, measured in a fresh child process.

Child:  python rss_probe.py load CKPT [DTYPE]   |   python rss_probe.py quantize IN OUT
        prints one JSON line: before (RSS before the call), peak (VmHWM after it, reset just before the call),
        and for `load` the model's param_bytes and packed_words (uint32 parameters).
Parent: measure(*args) runs the child and returns that dict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _child(args: list[str]) -> dict:
    import torch

    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    before = _status("VmRSS:")
    if args[0] == "load":
        from deltaserve.weights import load_checkpoint

        dtype = getattr(torch, args[2]) if len(args) > 2 else None
        model = load_checkpoint(args[1], dtype=dtype, progress=False).model
        peak = _status("VmHWM:")
        params = list(model.parameters())
        return dict(before=before, peak=peak, param_bytes=sum(p.numel() * p.element_size() for p in params),
                    packed_words=sum(p.numel() for p in params if p.dtype == torch.uint32))
    if args[0] == "quantize":
        from deltaserve.weights.quantizer import quantize_checkpoint

        quantize_checkpoint(args[1], args[2], 4, 64, progress=False)
        return dict(before=before, peak=_status("VmHWM:"))
    raise SystemExit(f"unknown probe {args[0]!r}")


def measure(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1:])))
