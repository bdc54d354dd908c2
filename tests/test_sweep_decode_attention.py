"""scripts/sweep_decode_attention.py: its checking half on CPU. The dry run (a child under TRITON_INTERPRET=1, tiny
shapes) must check every configuration it lists (bf16 and fp8 caches x merge shapes) against fp64 attention and
for batch invariance, and pass; a decode attention that ignores the fp8 value scales must fail the fp8 ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sweep_decode_attention.py"


def _dry_run(env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--depths", "700", "--bs", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env or dict(os.environ), check=False)


def test_dry_run_checks_every_configuration():
    out = _dry_run()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [ln for ln in out.stdout.splitlines() if ln.rstrip().endswith((" ok", "FAIL")) or "ERROR" in ln]
    assert len(rows) == 6 and all(ln.rstrip().endswith(" ok") for ln in rows), out.stdout
    assert sum(" fp8 " in ln for ln in rows) == 3 and "6 records, 0 failing" in out.stdout


def test_dry_run_flags_ignored_fp8_scales(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import torch\n"
        "import deltaserve.kernels.attention.triton_paged as tp\n"
        "_attn = tp.paged_decode_attention\n"
        "def broken(*a, **k):\n"
        "    if k.get('v_scale') is not None:\n"
        "        k['v_scale'] = torch.ones_like(k['v_scale'])\n"
        "    return _attn(*a, **k)\n"
        "tp.paged_decode_attention = broken\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = _dry_run(env=env)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "6 records, 3 failing" in out.stdout, out.stdout
