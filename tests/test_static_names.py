"""No undefined name in the package, its scripts or its tests (pyflakes, nothing imported or run).

Why: much of the code runs only on a GPU (the Gluon kernels' host wrappers, the tensor-core MoE block) and the CPU
suite stops at their device checks, so a name removed from an import would first fail on the H200. pyflakes reads
every file statically; any other warning it gives fails here too (the tree is clean of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyflakes_clean():
    api = pytest.importorskip("pyflakes.api")
    reporter_mod = pytest.importorskip("pyflakes.reporter")
    import io

    out, err = io.StringIO(), io.StringIO()
    files = [str(p) for d in ("deltaserve", "lab", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    count = api.checkRecursive(files, reporter_mod.Reporter(out, err))
    # backend.triton_available imports triton.language only to see whether it imports
    lines = [ln for ln in out.getvalue().splitlines() if not ln.endswith("'triton.language' imported but unused")]
    assert not err.getvalue(), err.getvalue()
    assert not lines, f"{count} pyflakes warnings:\n" + "\n".join(lines)
