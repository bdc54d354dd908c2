"""lab/sweep_decode_kernels.py: its checking half, on CPU. The dry run (a child under TRITON_INTERPRET=1, tiny
shapes, the --quick grid at T = 2) must check every configuration of both grids and pass them all, while the
deliberately corrupted --canary configuration must be flagged; the judging helper is unit-tested on hand-made
outputs (wrong values, NaN, a batch-dependent row, 1-ulp differences). MoeLaunch's validation is tested too."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "sweep_decode_kernels.py"


def _load():
    spec = importlib.util.spec_from_file_location("sweep_decode_kernels", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # module level imports torch only (triton comes in the sections)
    return mod


sweep = _load()


def _ref(t=2, n=64):
    torch.manual_seed(0)
    ref = torch.randn(t, n, dtype=torch.float64)
    return ref, ref.bfloat16()


def test_judge_accepts_correct_output():
    ref, y = _ref()
    v = sweep.judge(y, ref, y.clone(), {0: y[:1].clone(), 1: y[1:].clone()}, 8 * sweep.EPS, 2 * sweep.EPS)
    assert v["ok"] and v["same_bits"] and v["batch_invariant"] and v["err_base"] == 0.0


def test_judge_flags_a_wrong_value():
    ref, y = _ref()
    bad = y.clone()
    bad[1, 5] += 0.25 * ref.abs().max().item()
    v = sweep.judge(bad, ref, y, {}, 8 * sweep.EPS, 2 * sweep.EPS)
    assert not v["ok"] and v["err_ref"] > 8 * sweep.EPS and not v["same_bits"]


def test_judge_flags_nan_poison():
    ref, y = _ref()
    bad = y.clone()
    bad[0, 0] = float("nan")
    v = sweep.judge(bad, ref, y, {}, 8 * sweep.EPS, 2 * sweep.EPS)
    assert not v["ok"] and v["err_ref"] == float("inf")


def test_judge_flags_batch_dependence_even_within_tolerance():
    ref, y = _ref()
    alone = y[1:].clone()
    alone.view(torch.int16)[0, 3] += 1  # the next bf16 value: 1 ulp off, far inside every tolerance
    v = sweep.judge(y, ref, y, {0: y[:1].clone(), 1: alone}, 8 * sweep.EPS, 2 * sweep.EPS)
    assert not v["batch_invariant"] and not v["ok"]


def test_judge_one_ulp_from_default_is_close_not_identical():
    ref, y = _ref()
    other = y.clone()
    other[0, 0] = (other[0, 0].float() * (1 + sweep.EPS)).bfloat16()
    v = sweep.judge(other, ref, y, {}, 8 * sweep.EPS, 2 * sweep.EPS)
    assert v["ok"] and not v["same_bits"]


def test_grids_start_with_the_default_and_bits_expectation():
    moe = sweep.moe_grid(True, 8, 8)
    assert moe[0] == dict(gu=(4, 2, "row"), dn=(8, 2, None), cb=(256, 4), topk="split", inline=True,
                          regs=(None, None))
    assert len({sweep.moe_label(c) for c in moe}) == len(moe)  # labels identify configurations
    assert len(sweep.moe_grid(False, 8, 8)) > len(moe)

    def cg_of(bn, cg):  # K = 2048, group 64: chunk_groups gives 4096 codes per chunk, "row" the whole K
        return {"row": 32, "half": 16}.get(cg, cg) or min(32, 4096 // (bn * 64))

    base = moe[0]
    assert sweep.moe_bits_expected(base, cg_of, cg_of)
    assert sweep.moe_bits_expected({**base, "gu": (16, 4, 32)}, cg_of, cg_of)  # CG held (32 = the row): shape only
    assert sweep.moe_bits_expected({**base, "dn": (8, 8, None)}, cg_of, cg_of)  # warps only
    assert not sweep.moe_bits_expected({**base, "gu": (8, 4, None)}, cg_of, cg_of)  # chunked: regrouped
    assert not sweep.moe_bits_expected({**base, "dn": (16, 2, None)}, cg_of, cg_of)  # CG follows BN: regrouped
    assert sweep.moe_bits_expected({**base, "dn": (16, 2, None)}, cg_of, lambda bn, cg: 1)  # ... unless it cannot
    assert not sweep.moe_bits_expected({**base, "inline": False}, cg_of, cg_of)
    gemv = sweep.gemv_grid(True)
    assert gemv[0] == dict(bn=None, warps=None, inline=None)  # the library's default_config


def test_moe_launch_defaults_and_validation():
    m2 = pytest.importorskip("deltaserve.kernels.moe.triton_moe_gemv")
    from deltaserve.kernels import launch_table

    d = m2.MoeLaunch()
    tuned = ("gate_up_bn", "gate_up_warps", "bn", "down_warps", "bc", "combine_warps")
    assert (d.gate_up_bn, d.gate_up_warps, d.down_bn, d.down_warps, d.combine_bc, d.combine_warps) == tuple(
        launch_table.value(f"moe_gemv.{name}") for name in tuned)
    assert (d.gate_up_bn, d.down_bn, d.combine_bc, d.gate_up_warps, d.down_warps, d.combine_warps, d.gate_up_cg,
            d.down_cg) == (4, 8, 256, 4, 2, 4, None, None)
    with launch_table.override({"moe_gemv.down_warps": 4}):  # the table's value when the MoeLaunch is made
        assert m2.MoeLaunch().down_warps == 4 and m2.MoeLaunch(down_warps=8).down_warps == 8
    assert m2.MoeLaunch(down_warps=8).gate_up_bn == 4  # a field given changes that field alone
    assert d.gate_up_row_run
    for bad in (dict(gate_up_bn=12), dict(down_warps=0), dict(combine_bc=100), dict(down_cg=3),
                dict(gate_up_maxnreg=100), dict(down_maxnreg=16)):
        with pytest.raises(ValueError):
            m2.MoeLaunch(**bad)


@pytest.mark.slow
def test_dry_run_checks_every_configuration(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "sweep.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--quick", "--canary", "--ts", "2",
                           "--out", str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          check=False)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 1, f"the canary must make the run fail (rc {proc.returncode}):\n{tail}"
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    moe = [r for r in recs if r["kernel"] == "moe_decode_v2"]
    gemv = [r for r in recs if r["kernel"] == "affine_gemv"]
    n_moe = len(sweep.moe_grid(True, 1, 1)) + 1  # + the canary
    assert len(moe) == n_moe and len(gemv) == len(sweep.gemv_grid(True)) * len(sweep.TINY["gemv"]), tail
    assert not [r for r in recs if r.get("skipped") or r.get("error")], tail
    canary = [r for r in moe if "CANARY" in r["config"]]
    assert len(canary) == 1 and canary[0]["ok"] is False and canary[0]["err_ref"] > 0.1, canary
    failing = [r["config"] for r in recs if r["ok"] is not True and r not in canary]
    assert not failing, f"configurations failing their checks: {failing}\n{tail}"
    assert all(r["batch_invariant"] for r in recs if r not in canary)
    # the default configuration is the base of the comparison: it equals itself bit for bit
    assert moe[0]["same_bits"] and gemv[0]["same_bits"]


def test_row_run_defaults():
    """Packed decoder GEMVs take row runs of 4 rows over the whole K (the sweep's default row); the router's rows
    from a prefill's worth of tokens; the top-k's selection is "best". (The timing switches these once had were
    decided and removed: lab/NOTES.md.)"""
    import torch

    from deltaserve.kernels.moe import triton_decode as md
    from deltaserve.kernels.quant import triton_gemv as tg

    def spec(n, k, bits=4):
        w = torch.zeros(n, k * bits // 32, dtype=torch.int32)
        s = torch.zeros(n, k // 64, dtype=torch.bfloat16)
        return tg.gemv_spec(w, s, s, bits, 64, "w")

    assert tg.default_config(spec(12352, 2048)) == (4, 32, 2)  # 256 words per row: 2 warps x 32 x 4 words
    assert tg.default_config(spec(2048, 4096)) == (4, 64, 4)
    assert tg.default_config(spec(512, 2048, bits=8)) == (4, 32, 4)  # q8: 512 words per row, 4 warps, all 32 groups
    assert tg.row_run_config(spec(64, 512), 4) is None  # 64 words per row: too short for a row run
    assert md.router_rows_min() == 128
