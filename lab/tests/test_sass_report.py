"""lab/sass_report.py compiles the decode kernels for sm_90 without a GPU (compile-only launches) and reports
registers and load placement; run it for the GEMVs in a child process (it swaps Triton's active driver)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sass_report_gemv():
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton install has no bundled cuobjdump")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "lab" / "sass_report.py"), "--only", "gemv"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.startswith("_")}
    # two GEMV variants (K = 2048 and K = 4096 configurations) and their prep kernels, each with a PDL wait
    assert {"_gemv_kernel", "_gemv_kernel#2", "_prep_kernel"} <= set(rows), out.stdout
    for name in ("_gemv_kernel", "_gemv_kernel#2"):
        m = re.search(r"regs\s+(\d+).*LDG\.128\s+(\d+).*PDL wait at \[(\d+)", rows[name])
        assert m and 0 < int(m.group(1)) <= 255 and int(m.group(2)) > 0, rows[name]
