"""Run named kernel checks in a child process under Triton's interpreter and collect their results.

Triton picks its interpreter only if TRITON_INTERPRET is set before triton is first imported, and switching it on in
the test process would leak into other tests. So a test file hands its case names to `collect`, which starts the file
again as a child with the variable set; the child calls `run_cases`, which prints one `CASE {json}` line per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import pytest

HERE = Path(__file__).resolve().parent


def run_cases(names: list[str], cases: Callable[[], dict], modules: dict[str, str]) -> None:
    """Child side: import the kernel modules (deltaserve.kernels.<path> under each key), run each named case on
    them with seed 0, print its result line."""
    import importlib

    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    mods = {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in modules.items()}
    table = cases()
    for name in names:
        torch.manual_seed(0)
        start = time.monotonic()
        try:
            table[name](mods)
            line = {"case": name, "ok": True}
        except Exception as exc:  # reported to the parent test, which fails with this text
            line = {"case": name, "ok": False, "error": f"{exc!r}\n{traceback.format_exc()[-3000:]}"}
        line["seconds"] = round(time.monotonic() - start, 2)  # where the interpreter time goes (CI budget)
        print("CASE " + json.dumps(line), flush=True)


def collect(test_file: str, names: list[str]) -> tuple[dict, str]:
    """Parent side: run `python test_file NAMES...` with the interpreter on; ({case: result}, stderr tail)."""
    pytest.importorskip("triton", reason="Triton is not importable here; the interpreter tests need it")
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_REFERENCE="0")
    proc = subprocess.run([sys.executable, str(Path(test_file).resolve()), *names], env=env, cwd=HERE.parent,
                          capture_output=True, text=True, timeout=900)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            rec = json.loads(line[5:])
            found[rec["case"]] = rec
    if not found:
        pytest.fail(f"interpreter child produced no results (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return found, proc.stderr[-4000:]


def check(results: tuple[dict, str], case: str) -> None:
    found, stderr = results
    rec = found.get(case)
    assert rec is not None, f"case {case} did not report (child crashed?):\n{stderr}"
    assert rec["ok"], rec.get("error")


def child_main(run: Callable[[list[str]], None]) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run through pytest, or with TRITON_INTERPRET=1 set before Python starts")
    run(sys.argv[1:])
