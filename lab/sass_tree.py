"""The shared start of the scripts that compile one tree's kernels for sm_90 on a machine WITHOUT a GPU and
fingerprint them (sass_experts.py, sass_attention.py): the --root option and that tree's compile-only launches.

This module comes from the running script's tree; `sass_report` (install, instructions, _tool) from --root's, so an
older tree (a `git worktree` of another commit) compiles with its own kernels and its own harness.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Callable


def start(doc: str, add_args: Callable[[argparse.ArgumentParser], None] | None = None, argv=None):
    """(args, sass_report, compiled): the parsed options (--root plus add_args'), --root's sass_report and the
    {label: CompiledKernel} its install(pdl=True) fills as launches compile."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the tree to compile")
    if add_args is not None:
        add_args(ap)
    args = ap.parse_args(argv)
    sys.path[:0] = [args.root, os.path.join(args.root, "lab")]
    sys.modules.pop("sass_report", None)  # --root's, not one imported from elsewhere
    import sass_report

    return args, sass_report, sass_report.install(True)


def fingerprint(sass_report, kernel) -> dict:
    """A compiled kernel's registers, SASS instruction count, shared memory, local-memory stores (spills) and the
    sha1 (12 hex digits) of its instructions with the addresses stripped: equal hashes, the same code."""
    ins = sass_report.instructions(kernel)
    body = "\n".join(ln.split("*/", 1)[-1] for ln in ins)
    regs = re.search(r"REG:(\d+)", sass_report._tool(["cuobjdump", "-res-usage"], kernel.asm["cubin"]))
    return dict(regs=int(regs.group(1)) if regs else None, instructions=len(ins), smem=kernel.metadata.shared,
                spills=sum("STL" in ln for ln in ins), sha1=hashlib.sha1(body.encode()).hexdigest()[:12])
