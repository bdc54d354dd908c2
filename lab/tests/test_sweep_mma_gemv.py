"""lab/sweep_mma_gemv.py --compile-only: the tensor-core GEMV's Gluon kernel compiles for sm_90 without a GPU and
its SASS holds the MMAs (moved here with the script: tests/ never runs lab/)."""

from __future__ import annotations

import pytest

from deltaserve.kernels.quant import mma_gemv as mg


def test_compiles_for_sm90():
    """The Gluon kernel compiles for sm_90 without a GPU (every layout conversion in it is asserted trivial at
    compile time, so a layout change that would need data movement fails here), and its SASS has the MMAs and no
    shared-memory traffic besides the final cross-warp sum."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    triton = pytest.importorskip("triton")
    if not mg.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton install has no bundled cuobjdump")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(root / "lab" / "sweep_mma_gemv.py"), "--compile-only", "--quick"],
                         cwd=root, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("N=")]
    assert len(rows) == 4, out.stdout  # M = 1 and 64, each with loaded group sums and the kernel's own
    assert any(ln.startswith("CONV ") for ln in out.stdout.splitlines()), out.stdout  # the conv epilogue compiles
    few = [ln for ln in out.stdout.splitlines() if ln.startswith("FEW ")]  # one or two chunks a warp: AHEAD >= them
    assert len(few) == 4 and all(" 0 HMMA" not in ln for ln in few), out.stdout
    experts = [ln for ln in out.stdout.splitlines() if ln.startswith("EXPERTS ")]  # the grouped kernel too
    assert len(experts) == 3 and all(" 0 HMMA" not in ln for ln in experts), out.stdout
    assert [" 0 ATOM" not in ln for ln in experts] == [" combine" in ln for ln in experts], out.stdout
    split = [ln for ln in out.stdout.splitlines() if ln.startswith("SPLIT ")]  # the split gate/up's two forms
    assert len(split) == 2 and all(" 0 HMMA" not in ln for ln in split), out.stdout
    assert [" 0 ATOM" not in ln for ln in split] == [" pair" in ln for ln in split], out.stdout  # h at the 2nd arrival
    hmma = {}
    for row in rows:
        counts = {k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", row)}
        m = int(re.search(r"M=(\d+)", row).group(1))
        hmma.setdefault(m, []).append(counts["HMMA"])
        assert counts["STS"] <= 8 * (8 if m == 64 else 1), row  # the final sum's stores only
    for m, counts in hmma.items():  # K = 2048: 32 groups x 4 k-steps / 4 warps, twice with the ones-MMA sums
        assert sorted(counts) == [32 * (8 if m == 64 else 1), 64 * (8 if m == 64 else 1)], (m, counts)
