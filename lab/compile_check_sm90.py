"""Compile every Triton kernel the interpreter test cases launch, for sm_90, on a machine without a GPU: the
cases of tests/test_triton_interpret.py and tests/test_triton_gemv_interpret.py run with compile-only launches
(lab/sass_report.install: nothing executes, so their numeric checks fail by design) and every case whose
error is a Triton compilation error is reported. The interpreter accepts code that sm_90 does not (a
non-constexpr global read inside a kernel, for one), so run this before spending device time.

  python lab/compile_check_sm90.py [--no-pdl] [CASE ...]      exit status 1 if anything failed to compile
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("tests/test_triton_interpret.py", "tests/test_triton_gemv_interpret.py")
COMPILE_ERRORS = ("CompilationError", "CompileTimeAssertionFailure", "NameError(\"Cannot access global")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-pdl", dest="pdl", action="store_false")
    ap.add_argument("cases", nargs="*", help="case names (default: all cases of both files)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "lab"))
    import sass_report

    compiled = sass_report.install(args.pdl)
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gpu")]
    failed, ran = [], 0
    for rel in FILES:
        mod = runpy.run_path(str(ROOT / rel), run_name="compile_check")
        names = [n for n in mod["CASE_NAMES"] if not args.cases or n in args.cases]
        if not names:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            mod["_child"](names)
        for line in out.getvalue().splitlines():
            if line.startswith("CASE "):
                ran += 1
                rec = json.loads(line[5:])
                if any(e in rec.get("error", "") for e in COMPILE_ERRORS):
                    failed.append(rec["case"])
                    print(f"COMPILE ERROR {rec['case']}:\n{rec['error'][:3000]}\n")
    kernels = Counter(label.split("#")[0] for label in compiled)
    print(f"{ran} cases, {len(compiled)} kernel variants compiled for sm_90 (PDL {'on' if args.pdl else 'off'}): "
          + ", ".join(f"{k} x{v}" for k, v in sorted(kernels.items())))
    print(f"compile errors: {len(failed)}" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
