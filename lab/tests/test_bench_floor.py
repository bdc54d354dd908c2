"""lab/kernels_floor.py's dry run (TRITON_INTERPRET=1, toy sizes): every row's own check passes (the stream kernel's
XOR fold against torch's, one launch vs two; the GEMV with its prep launch == with the prep given)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_floor_dry_run():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "lab" / "kernels_floor.py"), "--dry"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [ln for ln in run.stdout.splitlines() if ln.startswith(("stream", "affine_gemv"))]
    assert len(rows) == 7 and all(ln.endswith(" ok") for ln in rows), run.stdout
