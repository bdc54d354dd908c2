"""lab/sweep_decode_attention.py: its checking half on CPU. The dry run (a child under TRITON_INTERPRET=1, tiny
shapes) must check every configuration it lists (bf16 and fp8 caches x split and merge launch shapes) against fp64 attention and
for batch invariance, and pass; a decode attention that ignores the fp8 value scales must fail the fp8 ones."""

from __future__ import annotations

from sweep_helpers import ROOT, canary_env, dry_run

SCRIPT = ROOT / "lab" / "sweep_decode_attention.py"


def _dry_run(env: dict | None = None):
    return dry_run(SCRIPT, "--depths", "700", "--bs", "3", env=env)


def test_dry_run_checks_every_configuration():
    out = _dry_run()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [ln for ln in out.stdout.splitlines() if ln.rstrip().endswith((" ok", "FAIL")) or "ERROR" in ln]
    assert len(rows) == 10 and all(ln.rstrip().endswith(" ok") for ln in rows), out.stdout
    assert sum(" fp8 " in ln for ln in rows) == 5 and "10 records, 0 failing" in out.stdout


def test_dry_run_flags_ignored_fp8_scales(tmp_path):
    env = canary_env(tmp_path, (
        "import torch\n"
        "import deltaserve.kernels.attention.triton_paged as tp\n"
        "_attn = tp.paged_decode_attention\n"
        "def broken(*a, **k):\n"
        "    if k.get('v_scale') is not None:\n"
        "        k['v_scale'] = torch.ones_like(k['v_scale'])\n"
        "    return _attn(*a, **k)\n"
        "tp.paged_decode_attention = broken\n"))
    out = _dry_run(env=env)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "10 records, 5 failing" in out.stdout, out.stdout


def test_shapes_option_parses():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep_decode_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.parse_shapes("64,64,lib,lib,128,32; 128,auto,8,dflt,32,64,264; 64,64,lib,lib,128,32,-,8192x2")
    assert got == (mod.cfg(64, 64, "lib", "lib", 128, 32), mod.cfg(128, None, 8, None, 32, 64, 264),
                   mod.cfg(64, 64, "lib", "lib", 128, 32, None, (8192, 2)))
