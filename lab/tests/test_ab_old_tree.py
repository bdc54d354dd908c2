"""lab/ab_old_tree.py: the old tree of an A/B with d8551f4's key-order normaliser laid in, at either place the
tree kept its top-k (triton_decode.py's BITONIC == 2 branch before 39cedb0, triton_router_common.py after)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "ab_old_tree.py"


@pytest.mark.parametrize("commit, where", [("ea8531e", "triton_decode.py"), ("7371cb6", "triton_router_common.py")])
def test_lays_the_key_order_normaliser_in(tmp_path, commit, where):
    out = tmp_path / "old"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--commit", commit, "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = (out / "deltaserve" / "kernels" / "moe" / where).read_text()
    assert "tl.static_range(1, TOPK)" in text and "tl.where(kk < TOPK" not in text
    again = subprocess.run([sys.executable, str(SCRIPT), "--commit", commit, "--out", str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "not empty" in again.stderr
