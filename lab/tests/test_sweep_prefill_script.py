"""lab/sweep_prefill_kernels.py, its checking half on CPU: the dry run (a child under TRITON_INTERPRET=1, tiny
shapes, the --quick grids) must check every configuration of both kernels and pass them all (the library kernel's
configurations bit-identical to its default), and the --canary configuration (the default's output corrupted in one
element) must be flagged in every case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "sweep_prefill_kernels.py"


def test_dry_run_checks_every_configuration_and_flags_the_canary(tmp_path):
    out = tmp_path / "sweep.jsonl"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--quick", "--canary", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # the canaries fail, nothing else
    cases = {(r["case"], r["shape"]) for r in recs}
    assert len(cases) == 4  # experts gate/up and down, two dense shapes
    canaries = [r for r in recs if r["label"].startswith("canary")]
    assert len(canaries) == len(cases) and not any(r["ok"] for r in canaries)
    checked = [r for r in recs if not r["label"].startswith("canary") and not r.get("skipped")]
    assert checked and all(r["ok"] for r in checked), [r for r in checked if not r["ok"]]
    assert {r["label"].split()[0] for r in checked} == {"default", "lib", "wide"}
    lib = [r for r in checked if r["label"].startswith("lib")]
    assert all(r["same_bits"] for r in lib if " bk64 " not in r["label"])  # BK 128: the bits may not move
    skipped = [r for r in recs if r.get("skipped")]
    assert all(r["why"].startswith("BK") for r in skipped)  # only inapplicable tile widths, never the budget
