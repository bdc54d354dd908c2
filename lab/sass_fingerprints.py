"""Fingerprint every kernel variant a tree's interpreter cases compile for sm_90, on a machine WITHOUT a GPU, and
compare two trees: a refactor that says it left the default kernels alone must produce no variant the old tree
did not (same SHA-1 of the SASS, addresses stripped; lab/sass_tree.fingerprint).

  python lab/sass_fingerprints.py --root TREE --out FILE.json       compile TREE's cases, write {label: fingerprint}
  python lab/sass_fingerprints.py --compare OLD.json NEW.json        every NEW hash must be among OLD's (exit 1 if not)

The cases are those of tests/test_triton_interpret.py and tests/test_triton_gemv_interpret.py (compile-only
launches, lab/sass_report.install: nothing runs, so their numeric checks fail by design and are ignored). TREE's
own sass_report is used (found under lab/ or, in older trees, scripts/), so each tree compiles its own kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import runpy
import sys
from pathlib import Path

FILES = ("tests/test_triton_interpret.py", "tests/test_triton_gemv_interpret.py")


def fingerprints(root: Path) -> dict:
    tools = root / "lab" if (root / "lab" / "sass_report.py").exists() else root / "scripts"
    sys.path[:0] = [str(root), str(tools), str(root / "tests"), str(root / "tests" / "gpu")]
    os.chdir(root)
    import sass_report

    compiled = sass_report.install(True)
    for rel in FILES:
        mod = runpy.run_path(str(root / rel), run_name="sass_fingerprints")
        with contextlib.redirect_stdout(io.StringIO()):
            mod["_child"](list(mod["CASE_NAMES"]))
    out = {}
    for label, kernel in compiled.items():
        ins = sass_report.instructions(kernel)
        body = "\n".join(ln.split("*/", 1)[-1] for ln in ins)
        regs = re.search(r"REG:(\d+)", sass_report._tool(["cuobjdump", "-res-usage"], kernel.asm["cubin"]))
        out[label] = dict(regs=int(regs.group(1)) if regs else None, instructions=len(ins),
                          sha1=hashlib.sha1(body.encode()).hexdigest()[:12])
    return out


def compare(old: dict, new: dict) -> int:
    known = {v["sha1"] for v in old.values()}
    fresh = {k: v for k, v in new.items() if v["sha1"] not in known}
    gone = len({v["sha1"] for v in old.values()} - {v["sha1"] for v in new.values()})
    print(f"old {len(old)} variants, new {len(new)}; {gone} old hashes no longer compiled (removed alternatives)")
    for label, v in sorted(fresh.items()):
        print(f"NEW  {label}: {v}")
    print("every new variant is an old one" if not fresh else f"{len(fresh)} variants changed or new")
    return 1 if fresh else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*(json.loads(p.read_text()) for p in args.compare))
    result = fingerprints(args.root.resolve())
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
