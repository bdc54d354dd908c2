"""lab/probe_mma_gemv.py: the tensor-core GEMV probe agrees with fp64 under the interpreter, and compiles for
sm_90 to an MMA (compile only, no GPU: child processes, as the script swaps Triton's driver for --sass)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "lab" / "probe_mma_gemv.py")


def test_probe_check_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "max error" in out.stdout


def test_probe_sass_has_an_mma():
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton install has no bundled cuobjdump")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, SCRIPT, "--sass"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("BN ")]
    assert len(rows) == 2, out.stdout
    for ln in rows:
        assert int(ln.split(" MMA,")[0].rsplit(" ", 1)[1]) > 0, ln  # the bf16 dot became tensor-core instructions
