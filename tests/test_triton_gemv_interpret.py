"""The decode GEMV (`kernels/quant/triton_gemv.py`) and the parallel MoE decode (`kernels/moe/triton_moe_gemv.py`)
under Triton's interpreter on CPU (TRITON_INTERPRET=1 in a child process, as tests/test_triton_interpret.py does),
against fp64 references on fresh random inputs with NaN-poisoned outputs, plus bit-for-bit batch invariance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CPU = "cpu"


def _cases():
    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    import kernel_cases as kc
    import test_gemv_gpu as tg

    cases = {f"gemv_b{b}_g{g}_m{m}": (lambda mods, b=b, g=g, m=m: tg.check_gemv(mods, CPU, b, g, m=m, n=24, k=256))
             for b in (4, 8) for g in (32, 64, 128) for m in (1, 3)}
    cases.update({
        "gemv_m16_q4": lambda mods: tg.check_gemv(mods, CPU, 4, 64, m=16, n=40, k=128),
        "gemv_m11_q8_ragged_n": lambda mods: tg.check_gemv(mods, CPU, 8, 32, m=11, n=13, k=128),
        "gemv_dense": lambda mods: tg.check_gemv(mods, CPU, 16, 64, m=5, n=24, k=512),
        "gemv_batch_invariance": lambda mods: tg.check_gemv_invariance(mods, CPU, n=24, k=256),
        "gemv_matches_affine_matmul": lambda mods: tg.check_gemv_vs_matmul(mods, CPU, n=24, k=256),
        "gemv_errors": lambda mods: tg.check_gemv_errors(mods, CPU),
        "moe_v2_q4": lambda mods: tg.check_moe_v2(mods, CPU, t=3, h=64, e=8, i=32, top_k=3, bits=4, group=32),
        "moe_v2_bf16": lambda mods: tg.check_moe_v2(mods, CPU, t=2, h=64, e=8, i=32, top_k=3, bits=16, group=32),
        "moe_v2_unnormalised": lambda mods: tg.check_moe_v2(mods, CPU, t=2, h=64, e=8, i=64, top_k=2, bits=4,
                                                            group=32, normalize=False),
        "moe_v2_batch_invariance": lambda mods: tg.check_moe_v2_invariance(mods, CPU, h=64, e=8, i=64, top_k=3),
    })
    del kc, torch
    return cases


def _names():
    # the names are static; building them imports torch and the references, never triton
    return list(_cases())


CASE_NAMES = _names()


def _child(names: list[str]) -> None:
    import importlib

    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    mods = {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("gemv", "quant.triton_gemv"), ("affine", "quant.triton_affine"), ("moe", "moe.triton_decode"),
        ("moe2", "moe.triton_moe_gemv"))}
    cases = _cases()
    for name in names:
        torch.manual_seed(0)
        try:
            cases[name](mods)
            line = {"case": name, "ok": True}
        except Exception as exc:
            line = {"case": name, "ok": False, "error": f"{exc!r}\n{traceback.format_exc()[-3000:]}"}
        print("CASE " + json.dumps(line), flush=True)


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("triton", reason="Triton is not importable here; the interpreter tests need it")
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_REFERENCE="0")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *CASE_NAMES], env=env, cwd=HERE.parent,
                          capture_output=True, text=True, timeout=900)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            rec = json.loads(line[5:])
            found[rec["case"]] = rec
    if not found:
        pytest.fail(f"interpreter child produced no results (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return found, proc.stderr[-4000:]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_gemv_under_interpreter(results, case):
    found, stderr = results
    rec = found.get(case)
    assert rec is not None, f"case {case} did not report (child crashed?):\n{stderr}"
    assert rec["ok"], rec.get("error")


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run through pytest, or with TRITON_INTERPRET=1 set before Python starts")
    _child(sys.argv[1:])
