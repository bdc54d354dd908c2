"""lab/sweep_gdn_step.py: its checking half on CPU. The dry run (a child under TRITON_INTERPRET=1, tiny shapes)
must check every launch shape it lists (one program per head and two column splits) against the fp64 step and pass;
a step that skipped its state update must fail those checks."""

from __future__ import annotations

from sweep_helpers import ROOT, canary_env, dry_run

SCRIPT = ROOT / "lab" / "sweep_gdn_step.py"


def _dry_run(env: dict | None = None):
    return dry_run(SCRIPT, "--bs", "1,3", env=env)


def test_dry_run_checks_every_shape():
    out = _dry_run()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [ln for ln in out.stdout.splitlines() if " ok" in ln or "FAIL" in ln or "ERROR" in ln]
    assert len(rows) == 6 and all(ln.rstrip().endswith(" ok") for ln in rows), out.stdout
    assert "6 records, 0 failing" in out.stdout


def test_dry_run_flags_a_broken_step(tmp_path):
    # a sitecustomize that makes the step forget the state update: the state check must fail every shape
    env = canary_env(tmp_path, (
        "import deltaserve.kernels.gated_delta.triton_decode as td\n"
        "_step = td.gdn_decode_step\n"
        "def broken(*a, **k):\n"
        "    pool = a[7]\n"
        "    keep = pool.clone()\n"
        "    y = _step(*a, **k)\n"
        "    pool.copy_(keep)\n"
        "    return y\n"
        "td.gdn_decode_step = broken\n"))
    out = _dry_run(env=env)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "6 records, 6 failing" in out.stdout, out.stdout
